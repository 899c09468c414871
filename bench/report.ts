// The benchmark's stdout: tables of absolute figures and ratios to each target's comparison
// (the floor unless the target says otherwise), and each of its goals marked OK or MISS.
import type { IdleResult, StreamsResult } from './idle.js'
import type { SequentialResult, ThroughputResult } from './measure.js'
import { fmt, ratio, stats, table } from './stats.js'
import { COMPARE_SUFFIX, FEATURE_COSTS, type Goals } from './targets.js'

export interface TargetResult {
  name: string
  compareTo: string | null
  goals: Goals
  sequential: SequentialResult | null
  throughput: ThroughputResult | null
  requestsTo?: { a: number, b: number }
}

export interface RunHeader {
  cpus: number
  cpuModel: string
  node: string
  gitCommit: string | null
  compareMain: string | null
  compareCommit: string | null
  loadStart: number[]
  loadEnd: number[]
  knobs: Record<string, unknown>
}

/** The goals of the memory phases. */
export const IDLE_HEAP_GOAL_KIB = 16
export const STREAMS_GOAL = { count: 10_000, rssBytes: 500e6, stallMs: 50 }

const mark = (value: number, goal: number | undefined, atMost: boolean): string => {
  if (goal === undefined || !Number.isFinite(value)) return ''
  return (atMost ? value <= goal : value >= goal) ? 'OK' : 'MISS'
}
const goalText = (goal: number | undefined, atMost: boolean, unit = 'x'): string => goal === undefined ? '' : `${atMost ? '≤' : '≥'} ${goal}${unit}`

/** Each round's figure divided by the comparison's in the same round. */
function roundRatios (mine: number[], theirs: number[]): number[] {
  return mine.map((p, i) => ratio(p, theirs[i])).filter(Number.isFinite)
}

const spread = (ratios: number[]): string => {
  const s = stats(ratios)
  return s.n === 0 ? '-' : `${fmt(s.min)} / ${fmt(s.p50)} / ${fmt(s.max)}`
}

function sequentialTable (results: TargetResult[], byName: Map<string, TargetResult>): string {
  const rows = [['target', 'vs', 'p50 ms', 'p99 ms', 'mean ms', 'p50 ratio', 'per-round ratio min/med/max', 'goal', '', 'errors']]
  for (const r of results) {
    const s = r.sequential
    if (s === null) continue
    const base = r.compareTo === null ? undefined : byName.get(r.compareTo)
    const x = ratio(s.latency.p50, base?.sequential?.latency.p50)
    rows.push([
      r.name, r.compareTo ?? '-', fmt(s.latency.p50, 3), fmt(s.latency.p99), fmt(s.latency.mean, 3),
      Number.isFinite(x) ? `${fmt(x)}x` : '-',
      spread(roundRatios(s.roundP50, base?.sequential?.roundP50 ?? [])),
      goalText(r.goals.seqP50Max, true), mark(x, r.goals.seqP50Max, true), String(s.errors)
    ])
  }
  return table(rows)
}

function throughputTable (results: TargetResult[], byName: Map<string, TargetResult>): string {
  const rows = [[
    'target', 'vs', 'calls/s', 'ratio', 'per-round ratio min/med/max', 'goal', '',
    'CPU us/call', 'ratio', 'goal', '', 'backend CPU', 'redis CPU', 'client CPU',
    'conc p50 ms', 'conc p99 ms', 'open p50 ms', 'errors'
  ]]
  for (const r of results) {
    const t = r.throughput
    if (t === null) continue
    const base = r.compareTo === null ? undefined : byName.get(r.compareTo)?.throughput ?? undefined
    const x = ratio(t.callsPerSec, base?.callsPerSec)
    const cpuX = ratio(t.cpuUsPerCall.serving, base?.cpuUsPerCall.serving)
    const perRound = (x: ThroughputResult | undefined): number[] => x?.rounds.map(p => p.callsPerSec) ?? []
    rows.push([
      r.name, r.compareTo ?? '-', fmt(t.callsPerSec, 0), Number.isFinite(x) ? `${fmt(x)}x` : '-',
      spread(roundRatios(perRound(t), perRound(base))),
      goalText(r.goals.callsPerSecMin, false), mark(x, r.goals.callsPerSecMin, false),
      fmt(t.cpuUsPerCall.serving, 0), Number.isFinite(cpuX) ? `${fmt(cpuX)}x` : '-',
      goalText(r.goals.cpuPerCallMax, true), mark(cpuX, r.goals.cpuPerCallMax, true),
      fmt(t.cpuUsPerCall.backend, 0), fmt(t.cpuUsPerCall.redis, 0), fmt(t.cpuUsPerCall.client, 0),
      fmt(t.latency.p50), fmt(t.latency.p99), fmt(t.connect.p50, 0), String(t.errors)
    ])
  }
  return table(rows)
}

/** One line per goal of the issue, so a reader need not find the column. */
function goalLines (results: TargetResult[], byName: Map<string, TargetResult>, idle: IdleResult[], streams: StreamsResult[]): string[] {
  const lines: string[] = []
  for (const r of results) {
    const base = r.compareTo === null ? undefined : byName.get(r.compareTo)
    const vs = r.compareTo ?? ''
    if (r.goals.seqP50Max !== undefined && r.sequential !== null) {
      const x = ratio(r.sequential.latency.p50, base?.sequential?.latency.p50)
      lines.push(`${r.name}: sequential p50 ${fmt(x)}x ${vs} (target ≤ ${r.goals.seqP50Max}x) ${mark(x, r.goals.seqP50Max, true)}`)
    }
    if (r.goals.callsPerSecMin !== undefined && r.throughput !== null) {
      const x = ratio(r.throughput.callsPerSec, base?.throughput?.callsPerSec)
      lines.push(`${r.name}: calls/s ${fmt(x)}x ${vs} (target ≥ ${r.goals.callsPerSecMin}x) ${mark(x, r.goals.callsPerSecMin, false)}`)
    }
    if (r.goals.cpuPerCallMax !== undefined && r.throughput !== null) {
      const x = ratio(r.throughput.cpuUsPerCall.serving, base?.throughput?.cpuUsPerCall.serving)
      lines.push(`${r.name}: CPU per call ${fmt(x)}x ${vs} (target ≤ ${r.goals.cpuPerCallMax}x) ${mark(x, r.goals.cpuPerCallMax, true)}`)
    }
  }
  for (const r of idle) {
    lines.push(`${r.name}: gateway heap per idle session ${fmt(r.perSessionKiB.heapUsed, 1)} KiB (target ≤ ${IDLE_HEAP_GOAL_KIB} KiB) ${mark(r.perSessionKiB.heapUsed, IDLE_HEAP_GOAL_KIB, true)}`)
  }
  for (const s of streams) {
    const rssBytes = s.rssKiB.maxDuring * 1024
    const stall = Math.max(s.ramp.maxStallMs, s.hold.maxStallMs)
    const held = s.opened >= STREAMS_GOAL.count && s.failed === 0 && s.dropped.hold === 0
    const count = held ? 'OK' : `MISS (${s.opened} held${s.fit.limitedBy === null ? '' : ', limited by this machine'})`
    lines.push(`${s.name}: ${s.opened} idle GET streams held (target ${STREAMS_GOAL.count}) ${count}`)
    lines.push(`${s.name}: gateway RSS peak ${fmt(rssBytes / 1e6, 0)} MB (target < ${STREAMS_GOAL.rssBytes / 1e6} MB) ${mark(-rssBytes, -STREAMS_GOAL.rssBytes, false)}`)
    lines.push(`${s.name}: longest event-loop stall ${fmt(stall, 0)} ms (target ≤ ${STREAMS_GOAL.stallMs} ms) ${mark(stall, STREAMS_GOAL.stallMs, true)}`)
  }
  return lines
}

/** This build over another build's twin (BENCH_COMPARE_MAIN), each already a ratio to the floor. */
function compareLines (results: TargetResult[], byName: Map<string, TargetResult>): string[] {
  const lines: string[] = []
  for (const twin of results.filter(r => r.name.endsWith(COMPARE_SUFFIX))) {
    const mine = byName.get(twin.name.slice(0, -COMPARE_SUFFIX.length))
    if (mine === undefined) continue
    const seq = ratio(mine.sequential?.latency.p50, twin.sequential?.latency.p50)
    const tp = ratio(mine.throughput?.callsPerSec, twin.throughput?.callsPerSec)
    const cpu = ratio(mine.throughput?.cpuUsPerCall.serving, twin.throughput?.cpuUsPerCall.serving)
    lines.push(`${mine.name} / ${twin.name}: sequential p50 ${fmt(seq)}x, calls/s ${fmt(tp)}x, CPU per call ${fmt(cpu)}x`)
  }
  return lines
}

/** Feature on over feature off, same run: the overall p50 ratio and the median of per-round ratios. */
function featureCostLines (byName: Map<string, TargetResult>): string[] {
  const lines: string[] = []
  for (const c of FEATURE_COSTS) {
    const on = byName.get(c.on)?.sequential
    const off = byName.get(c.off)?.sequential
    if (on == null || off == null) continue
    const x = ratio(on.latency.p50, off.latency.p50)
    const perRound = stats(roundRatios(on.roundP50, off.roundP50))
    lines.push(`${c.feature}: ${c.on} / ${c.off}: sequential p50 ${fmt(x)}x, per-round median ${fmt(perRound.p50)}x (target ≤ ${c.seqP50Max}x) ${mark(x, c.seqP50Max, true)}`)
  }
  return lines
}

function idleTable (idle: IdleResult[]): string {
  const rows = [[
    'idle', 'sessions', 'failed', 'heap KiB/session', 'goal', '', 'RSS KiB/session', 'external KiB/session',
    'RSS MiB before', 'RSS MiB after', 'heap MiB before', 'heap MiB after', 'heap MiB closed', 'children', 'child PSS MiB'
  ]]
  for (const r of idle) {
    rows.push([
      r.name, String(r.sessions), String(r.failed), fmt(r.perSessionKiB.heapUsed, 1), `≤ ${IDLE_HEAP_GOAL_KIB}`, mark(r.perSessionKiB.heapUsed, IDLE_HEAP_GOAL_KIB, true),
      fmt(r.perSessionKiB.rss, 1), fmt(r.perSessionKiB.external, 1),
      fmt(r.before.rssKiB / 1024, 1), fmt(r.after.rssKiB / 1024, 1),
      fmt(r.before.heapUsedKiB / 1024, 1), fmt(r.after.heapUsedKiB / 1024, 1), fmt(r.afterClose.heapUsedKiB / 1024, 1),
      r.children === null ? '-' : String(r.children.count),
      r.children === null ? '-' : fmt(r.children.pssKiBPerChild / 1024, 1)
    ])
  }
  return table(rows)
}

function streamsTable (streams: StreamsResult[]): string {
  const rows = [[
    'streams', 'requested', 'held', 'failed', 'dropped', 'ramp s', 'opened/s', 'RSS MiB before', 'RSS MiB held', 'RSS MiB peak',
    'max stall ramp ms', 'max stall hold ms', 'windows > 50 ms', 'control stall ms', 'heap KiB/stream', 'heap MiB before', 'heap MiB closed', 'gw fds'
  ]]
  for (const s of streams) {
    rows.push([
      s.name, String(s.requested), String(s.opened), String(s.failed), `${s.dropped.ramp}+${s.dropped.hold}`,
      fmt(s.ramp.seconds, 0), fmt(s.ramp.perSecond, 0),
      fmt(s.rssKiB.before / 1024, 0), fmt(s.rssKiB.endOfHold / 1024, 0), fmt(s.rssKiB.maxDuring / 1024, 0),
      fmt(s.ramp.maxStallMs, 0), fmt(s.hold.maxStallMs, 0), `${s.ramp.windowsOver50Ms}+${s.hold.windowsOver50Ms}`,
      `${fmt(s.control.ramp.maxStallMs, 0)}/${fmt(s.control.hold.maxStallMs, 0)}`,
      fmt(s.heapPerStreamKiB, 1), fmt(s.heapKiB.before / 1024, 1), fmt(s.heapKiB.afterClose / 1024, 1), s.gatewayFds === null ? '-' : String(s.gatewayFds)
    ])
  }
  return table(rows)
}

export function report (header: RunHeader, results: TargetResult[], idle: IdleResult[], streams: StreamsResult[]): string {
  const byName = new Map(results.map(r => [r.name, r]))
  const load = (l: number[]): string => l.map(n => n.toFixed(2)).join(' ')
  const k = header.knobs
  const lines = [
    `${header.cpus} CPUs (${header.cpuModel}), node ${header.node}, commit ${header.gitCommit ?? '?'}` +
      (header.compareMain === null ? '' : `; @compare: ${header.compareMain} (commit ${header.compareCommit ?? '?'})`),
    `load average ${load(header.loadStart)} at start, ${load(header.loadEnd)} at the end; other work on the machine shares these CPUs.`
  ]
  if (results.length > 0) lines.push('Every target was up for the whole run; each figure is divided by its "vs" target\'s, measured in the same rounds.')
  if (results.some(r => r.sequential !== null)) {
    lines.push(
      '',
      `Sequential tools/call (echo) on one SDK session per target, ${String(k.warmup)} warm-up, then ${String(k.rounds)} rounds of ${String(k.block)} calls,`,
      'targets in a fresh shuffled order each round. Per-round ratio: that round\'s p50 over the comparison\'s, same round.',
      '',
      sequentialTable(results, byName)
    )
  }
  if (results.some(r => r.throughput !== null)) {
    lines.push(
      '',
      `Throughput: ${String(k.sessions)} SDK sessions x ${String(k.calls)} calls, all sessions at once, one target at a time, ${String(k.tpRounds)} rounds in shuffled order after ${String(k.tpWarmup ?? 0)} untimed pass(es);`,
      'calls/s is the median over rounds; per-round ratio: that round\'s calls/s over the comparison\'s. CPU columns: microseconds per call (all rounds) from /proc (10 ms ticks): the serving process(es)',
      '(proxy, gateway replicas; the compared figure), the backend behind them (stdio children or HTTP upstream), redis-server, and the bench\'s SDK clients.',
      '',
      throughputTable(results, byName)
    )
    const cross = byName.get('gateway-redis-cross')?.requestsTo
    if (cross !== undefined) lines.push('', `gateway-redis-cross: ${cross.a} requests went to replica A (the initializes), ${cross.b} to replica B.`)
  }
  if (idle.length > 0) {
    lines.push(
      '',
      'Idle sessions (initialize + initialized + open GET stream), gateway in memory mode, memory after a forced full GC',
      `${idle.every(r => r.gc) ? '' : '(GC NOT available in this run) '}before and after opening them, and once all are closed again (heap MiB closed).`,
      '',
      idleTable(idle)
    )
  }
  if (streams.length > 0) {
    lines.push(
      '',
      `Idle GET streams on one gateway replica, HTTP backend (bench/idle-upstream.ts), default config; ramp ${String(k.streamsConcurrency)} at a time, hold ${String(k.streamsHoldS)} s.`,
      'Stalls: timer drift inside the gateway (bench/loop-probe.ts), largest per 250 ms window; windows > 50 ms counted ramp+hold;',
      'control: the same probe in an idle node process meanwhile (ramp/hold), i.e. the machine\'s own scheduling delays. RSS peak: probe samples.',
      '',
      streamsTable(streams)
    )
    for (const s of streams) {
      if (s.fit.limitedBy !== null) lines.push(`${s.name}: ${s.requested} requested, ${s.fit.count} fit: ${s.fit.limitedBy}.`)
      if (s.longStalls.length > 0) {
        const shown = s.longStalls.slice(0, 16).map(w => `${fmt(w.atS, 1)}s ${fmt(w.stallMs, 0)}/${fmt(w.gcMs, 0)}/${fmt(w.controlMs, 0)}`)
        lines.push(`${s.name}: stalls > 50 ms (s since the ramp began: stall/longest GC/control ms; ramp ended at ${fmt(s.ramp.seconds, 1)}s):`)
        lines.push(`  ${shown.join(', ')}${s.longStalls.length > 16 ? `, ... (${s.longStalls.length} in all)` : ''}`)
      }
    }
  }
  const goals = goalLines(results, byName, idle, streams)
  if (goals.length > 0) lines.push('', 'Targets:', ...goals.map(l => `  ${l}`))
  const costs = featureCostLines(byName)
  if (costs.length > 0) lines.push('', 'Optional features, on over off:', ...costs.map(l => `  ${l}`))
  const compare = compareLines(results, byName)
  if (compare.length > 0) lines.push('', 'This build over BENCH_COMPARE_MAIN:', ...compare.map(l => `  ${l}`))
  const errors = [
    ...results.flatMap(r => [r.sequential?.firstError, r.throughput?.firstError].filter((e): e is string => e != null).map(e => `${r.name}: first error: ${e}`)),
    ...[...idle, ...streams].filter(r => r.firstError !== null).map(r => `${r.name}: first error: ${r.firstError ?? ''}`)
  ]
  if (errors.length > 0) lines.push('', ...errors)
  return lines.join('\n')
}
