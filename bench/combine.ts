// Several bench runs read together: `node dist/bench/combine.js a.json b.json …`.
// Within one run every target is up at once and their calls interleave, but each target is one
// process (two for the cross target), and where a process lands on two shared cores moves its
// figures by 10-30 % for the whole run: two processes of the same build differed by up to 1.5x
// (bench/README.md). A ratio is only as good as its pair of processes. Runs started afresh draw new
// pairs; the median of their ratios is the figure to quote, with every run's beside it.
import { readFileSync } from 'node:fs'
import type { TargetResult } from './report.js'
import { fmt, ratio, table } from './stats.js'
import { COMPARE_SUFFIX } from './targets.js'

interface Run { file: string, gitCommit: string | null, compareCommit: string | null, targets: TargetResult[] }

interface Figures { seq: number, tp: number, cpu: number }

function figures (mine: TargetResult | undefined, theirs: TargetResult | undefined): Figures {
  return {
    seq: ratio(mine?.sequential?.latency.p50, theirs?.sequential?.latency.p50),
    tp: ratio(mine?.throughput?.callsPerSec, theirs?.throughput?.callsPerSec),
    cpu: ratio(mine?.throughput?.cpuUsPerCall.serving, theirs?.throughput?.cpuUsPerCall.serving)
  }
}

/** The middle value; of an even count, the mean of the two middle ones (stats.ts's p50 takes one of them). */
function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Each run's ratio, then the median of those the runs have. */
function cells (values: number[]): string[] {
  const known = values.filter(Number.isFinite)
  return [...values.map(v => Number.isFinite(v) ? `${fmt(v)}x` : '-'), known.length === 0 ? '-' : `${fmt(median(known))}x`]
}

function main (files: string[]): string {
  if (files.length === 0) throw new Error('usage: combine.js <results.json> …')
  const runs: Run[] = files.map(file => ({ file, ...(JSON.parse(readFileSync(file, 'utf8')) as Omit<Run, 'file'>) }))
  const names = [...new Set(runs.flatMap(run => run.targets.map(t => t.name)))]
  const head = ['target', 'vs', 'figure', ...runs.map((_, i) => `run ${i + 1}`), 'median']
  const rows = [head]
  for (const name of names) {
    const per = runs.map(run => {
      const byName = new Map(run.targets.map(t => [t.name, t]))
      const mine = byName.get(name)
      return { vs: mine?.compareTo ?? null, f: figures(mine, mine?.compareTo == null ? undefined : byName.get(mine.compareTo)) }
    })
    const vs = per.find(p => p.vs !== null)?.vs
    if (vs === undefined || vs === null) continue
    rows.push([name, vs, 'p50', ...cells(per.map(p => p.f.seq))])
    rows.push(['', '', 'calls/s', ...cells(per.map(p => p.f.tp))])
    rows.push(['', '', 'CPU/call', ...cells(per.map(p => p.f.cpu))])
  }
  const twins = names.filter(n => n.endsWith(COMPARE_SUFFIX))
  const compared = [head.map((h, i) => i === 1 ? 'over' : h)]
  for (const twin of twins) {
    const name = twin.slice(0, -COMPARE_SUFFIX.length)
    const per = runs.map(run => {
      const byName = new Map(run.targets.map(t => [t.name, t]))
      return figures(byName.get(name), byName.get(twin))
    })
    compared.push([name, twin, 'p50', ...cells(per.map(f => f.seq))])
    compared.push(['', '', 'calls/s', ...cells(per.map(f => f.tp))])
    compared.push(['', '', 'CPU/call', ...cells(per.map(f => f.cpu))])
  }
  const lines = [
    `${runs.length} runs, each with fresh processes: ${runs.map((run, i) => `run ${i + 1} ${run.file} (${run.gitCommit ?? '?'}${run.compareCommit === null ? '' : ` vs ${run.compareCommit}`})`).join('; ')}`,
    '',
    'Each target over its comparison in the same run:',
    table(rows)
  ]
  if (twins.length > 0) lines.push('', 'This build over BENCH_COMPARE_MAIN, same runs:', table(compared))
  return lines.join('\n')
}

process.stdout.write(`${main(process.argv.slice(2))}\n`)
