// The pooled throughput figures: 50 sessions x 100 concurrent tools/call (echo of the full-server
// fixture) against the gateway with `sessions: pooled`, the gateway with `sessions: dedicated` (a
// child per session) and mcp-proxy (one child shared by every session, bench/mcp-proxy.ts), all
// up at once, their passes interleaved in a fresh shuffled order each round (measure.ts), then
// sequential calls in shuffled blocks. Printed as ratios within this run; nothing is asserted.
//
//   npm run bench:pooled-throughput      (builds, then node dist/bench/pooled-throughput.js)
//
// Goals: pooled calls/s >= 1.0x mcp-proxy's and >= dedicated's, with at most poolMax
// children; sequential p50 pooled <= 1.05x dedicated.
//
// Knobs (env, defaults in brackets): BENCH_TP_ROUNDS [5], BENCH_TP_WARMUP [1], BENCH_SESSIONS [50],
// BENCH_CALLS [100], BENCH_CONNECT_CONCURRENCY [8], BENCH_WARMUP [4000] sequential warm-up calls
// per target, BENCH_ROUNDS [100] sequential rounds of BENCH_BLOCK [10] calls per target,
// BENCH_POOL_MAX [16] (the shipped default), BENCH_OUT (default bench/results/<date>-pooled-throughput.json),
// BENCH_COMPARE_MAIN (absolute path of another build's dist/src/main.js: its pooled and dedicated
// gateways run as `<name>@compare` in the same shuffled rounds, and this build's figures are printed
// over theirs, as bench.ts does).
import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { cpus, loadavg, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { mcpProxyTarget } from './mcp-proxy.js'
import { runSequential, runThroughput } from './measure.js'
import { childrenOf, Cleanup, gitCommit, log } from './procs.js'
import { openSessions } from './sessions.js'
import { fmt, median, ratio, round, table } from './stats.js'
import { COMPARE_SUFFIX, gatewayTarget, type Target, type TargetContext } from './targets.js'

const REPO = fileURLToPath(new URL('../../', import.meta.url))
const POOLED = 'gateway-pooled'
const DEDICATED = 'gateway-dedicated'
const PROXY = 'mcp-proxy'
/** How often the children of each target are counted during the throughput passes. */
const CHILDREN_SAMPLE_MS = 250

function intEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const n = Number(raw)
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${raw}`)
  return n
}

const knobs = {
  tpRounds: intEnv('BENCH_TP_ROUNDS', 5),
  tpWarmup: intEnv('BENCH_TP_WARMUP', 1),
  sessions: intEnv('BENCH_SESSIONS', 50),
  calls: intEnv('BENCH_CALLS', 100),
  connectConcurrency: intEnv('BENCH_CONNECT_CONCURRENCY', 8),
  warmup: intEnv('BENCH_WARMUP', 4000),
  rounds: intEnv('BENCH_ROUNDS', 100),
  block: intEnv('BENCH_BLOCK', 10),
  poolMax: intEnv('BENCH_POOL_MAX', 16)
}

const compareMain = process.env.BENCH_COMPARE_MAIN === undefined || process.env.BENCH_COMPARE_MAIN === '' ? undefined : process.env.BENCH_COMPARE_MAIN
if (compareMain !== undefined && !existsSync(compareMain)) throw new Error(`BENCH_COMPARE_MAIN: ${compareMain} does not exist`)

const pooledConfig = { servers: { bench: { sessions: 'pooled', poolMax: knobs.poolMax } } }
const dedicatedConfig = { servers: { bench: { sessions: 'dedicated' } } }
const specs = [
  gatewayTarget(POOLED, { config: pooledConfig, compareTo: DEDICATED }),
  gatewayTarget(DEDICATED, { config: dedicatedConfig }),
  mcpProxyTarget(PROXY),
  ...(compareMain === undefined
    ? []
    : [
        gatewayTarget(`${POOLED}${COMPARE_SUFFIX}`, { config: pooledConfig, main: compareMain }),
        gatewayTarget(`${DEDICATED}${COMPARE_SUFFIX}`, { config: dedicatedConfig, main: compareMain })
      ])
]

/** The most children each target's serving process had at once, sampled while `during` runs. */
async function countChildren<T> (targets: Target[], during: () => Promise<T>): Promise<{ result: T, maxChildren: Map<string, number> }> {
  const maxChildren = new Map<string, number>(targets.map(t => [t.name, 0]))
  const sample = (): void => {
    for (const t of targets) {
      const n = t.servingPids.reduce((a, pid) => a + childrenOf(pid).length, 0)
      if (n > (maxChildren.get(t.name) ?? 0)) maxChildren.set(t.name, n)
    }
  }
  const timer = setInterval(sample, CHILDREN_SAMPLE_MS)
  try {
    return { result: await during(), maxChildren }
  } finally {
    clearInterval(timer)
    sample()
  }
}

async function main (): Promise<void> {
  const cleanup = new Cleanup()
  process.on('SIGINT', () => {
    log('SIGINT: stopping everything started')
    void Promise.all([...openSessions].map(async s => { await s.close() })).finally(() => { void cleanup.runAll().finally(() => process.exit(130)) })
  })
  const dir = await mkdtemp(join(tmpdir(), 'bench-pooled-'))
  cleanup.add('temp dir', async () => { await rm(dir, { recursive: true, force: true }) })
  const ctx: TargetContext = {
    cleanup,
    dir,
    logLevel: undefined,
    redis: async () => { throw new Error('no Redis in this bench') },
    httpUpstream: async () => { throw new Error('no HTTP upstream in this bench') }
  }
  try {
    const targets: Target[] = []
    for (const spec of specs) targets.push(await spec.start(ctx))
    const started = new Date()
    log(`throughput: ${knobs.tpWarmup} warm-up + ${knobs.tpRounds} rounds of ${knobs.sessions} sessions x ${knobs.calls} calls, targets shuffled per round`)
    const tp = await countChildren(targets, async () => await runThroughput(targets, {
      rounds: knobs.tpRounds, warmupRounds: knobs.tpWarmup, sessions: knobs.sessions, calls: knobs.calls, connectConcurrency: knobs.connectConcurrency
    }))
    log(`sequential: ${knobs.warmup} warm-up calls, then ${knobs.rounds} rounds of ${knobs.block} calls per target`)
    const seq = await runSequential(targets, { warmup: knobs.warmup, rounds: knobs.rounds, block: knobs.block })

    const of = (name: string): { cps: number, p50: number, children: number } => ({
      cps: tp.result.get(name)?.callsPerSec ?? NaN,
      p50: seq.get(name)?.latency.p50 ?? NaN,
      children: tp.maxChildren.get(name) ?? NaN
    })
    const pooled = of(POOLED)
    const dedicated = of(DEDICATED)
    const proxy = of(PROXY)
    // Each round's pooled pass over the other target's pass of the same round (passes next to each
    // other in time): steadier than a ratio of medians when other load comes and goes.
    const paired = (other: string, mine = POOLED): number => median((tp.result.get(mine)?.rounds ?? []).map((r, i) => ratio(r.callsPerSec, tp.result.get(other)?.rounds[i]?.callsPerSec)))
    const cpuPerCall = (name: string): number => {
      const r = tp.result.get(name)
      return r === undefined ? NaN : (r.cpuUsPerCall.serving ?? 0) + r.cpuUsPerCall.backend
    }
    const figures = {
      callsPerSecPooledOverMcpProxy: round(ratio(pooled.cps, proxy.cps)),
      callsPerSecPooledOverMcpProxyPairedMedian: round(paired(PROXY)),
      callsPerSecPooledOverDedicatedPairedMedian: round(paired(DEDICATED)),
      cpuPerCallPooledOverMcpProxy: round(ratio(cpuPerCall(POOLED), cpuPerCall(PROXY))),
      cpuPerCallPooledOverDedicated: round(ratio(cpuPerCall(POOLED), cpuPerCall(DEDICATED))),
      callsPerSecPooledOverDedicated: round(ratio(pooled.cps, dedicated.cps)),
      seqP50PooledOverDedicated: round(ratio(pooled.p50, dedicated.p50)),
      seqP50PooledOverMcpProxy: round(ratio(pooled.p50, proxy.p50)),
      maxChildren: { pooled: pooled.children, dedicated: dedicated.children, mcpProxy: proxy.children, poolMax: knobs.poolMax },
      goals: {
        callsPerSecVsMcpProxy: '>= 1.0',
        callsPerSecVsDedicated: '>= 1.0',
        pooledChildren: `<= poolMax (${knobs.poolMax})`,
        seqP50VsDedicated: '<= 1.05'
      }
    }
    // This build over BENCH_COMPARE_MAIN's, target by target (the same rounds, interleaved).
    const compare = compareMain === undefined
      ? undefined
      : Object.fromEntries([POOLED, DEDICATED].map(name => {
        const twin = `${name}${COMPARE_SUFFIX}`
        return [name, {
          callsPerSec: round(ratio(tp.result.get(name)?.callsPerSec, tp.result.get(twin)?.callsPerSec)),
          callsPerSecPairedMedian: round(paired(twin, name)),
          cpuPerCall: round(ratio(cpuPerCall(name), cpuPerCall(twin))),
          seqP50: round(ratio(seq.get(name)?.latency.p50, seq.get(twin)?.latency.p50)),
          seqP99: round(ratio(seq.get(name)?.latency.p99, seq.get(twin)?.latency.p99))
        }]
      }))
    const rows = [['target', 'calls/s', 'rounds min-max', 'cpu us/call (serving+children)', 'seq p50 ms', 'seq p99 ms', 'children (max)', 'errors']]
    for (const t of targets) {
      const r = tp.result.get(t.name)
      const s = seq.get(t.name)
      const perRound = r?.rounds.map(x => x.callsPerSec) ?? []
      const cpu = cpuPerCall(t.name)
      rows.push([
        t.name, fmt(r?.callsPerSec, 0), `${fmt(Math.min(...perRound), 0)}-${fmt(Math.max(...perRound), 0)}`, fmt(cpu, 0),
        fmt(s?.latency.p50, 3), fmt(s?.latency.p99, 3), String(tp.maxChildren.get(t.name) ?? '-'), String((r?.errors ?? 0) + (s?.errors ?? 0))
      ])
    }
    process.stdout.write(`${table(rows)}\n\n`)
    process.stdout.write(`calls/s pooled / mcp-proxy   ${fmt(figures.callsPerSecPooledOverMcpProxy)}x medians, ${fmt(figures.callsPerSecPooledOverMcpProxyPairedMedian)}x median of rounds (goal >= 1.0); CPU per call ${fmt(figures.cpuPerCallPooledOverMcpProxy)}x\n`)
    process.stdout.write(`calls/s pooled / dedicated   ${fmt(figures.callsPerSecPooledOverDedicated)}x medians, ${fmt(figures.callsPerSecPooledOverDedicatedPairedMedian)}x median of rounds (goal >= 1.0); CPU per call ${fmt(figures.cpuPerCallPooledOverDedicated)}x\n`)
    process.stdout.write(`children pooled              ${pooled.children} (goal <= poolMax ${knobs.poolMax}); dedicated ${dedicated.children}, mcp-proxy ${proxy.children}\n`)
    process.stdout.write(`seq p50 pooled / dedicated   ${fmt(figures.seqP50PooledOverDedicated, 3)}x  (goal <= 1.05)\n`)
    if (compare !== undefined) {
      process.stdout.write(`\nThis build over BENCH_COMPARE_MAIN (${compareMain ?? ''}, commit ${gitCommit(dirname(compareMain ?? '.')) ?? '?'}):\n`)
      for (const [name, c] of Object.entries(compare)) {
        process.stdout.write(`  ${name} / ${name}${COMPARE_SUFFIX}: calls/s ${fmt(c.callsPerSec)}x medians, ${fmt(c.callsPerSecPairedMedian)}x median of rounds; CPU per call ${fmt(c.cpuPerCall)}x; seq p50 ${fmt(c.seqP50)}x, p99 ${fmt(c.seqP99)}x\n`)
      }
    }

    const date = started.toISOString().slice(0, 10)
    const out = process.env.BENCH_OUT ?? join(REPO, 'bench', 'results', `${date}-pooled-throughput.json`)
    mkdirSync(dirname(out), { recursive: true })
    writeFileSync(out, `${JSON.stringify({
      started: started.toISOString(),
      // The 1-minute load average at the end: this machine is shared, and other work moves absolute figures.
      machine: { cpus: cpus().length, loadavg: loadavg() },
      knobs,
      gitCommit: gitCommit(REPO),
      ...(compareMain === undefined ? {} : { compareMain, compareCommit: gitCommit(dirname(compareMain)), compare }),
      figures,
      throughput: Object.fromEntries(tp.result),
      sequential: Object.fromEntries([...seq].map(([name, s]) => [name, { latency: s.latency, errors: s.errors, firstError: s.firstError }]))
    }, (_key, value: unknown) => typeof value === 'number' ? round(value) : value, 2)}\n`)
    log(`results in ${out}`)
  } finally {
    await Promise.all([...openSessions].map(async s => { await s.close() }))
    await cleanup.runAll()
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
