// The two interleaved phases over started targets: sequential latency (one session per target,
// rounds of shuffled blocks) and throughput (many sessions at once, one target at a time, the
// targets in a fresh shuffled order each round), with the CPU each process used meanwhile.
import { performance } from 'node:perf_hooks'
import { cpuMs, log } from './procs.js'
import { mapLimit, median, shuffled, stats, type LatencyStats } from './stats.js'
import { callEcho, type BenchSession } from './sessions.js'
import type { Target } from './targets.js'

/** Counts failures of one target in one phase and keeps the first message. */
class Errors {
  count = 0
  first: string | null = null
  note (err: string | null): void {
    if (err === null) return
    this.count++
    this.first ??= err
  }
}

// ---- sequential ------------------------------------------------------------------------------

export interface SequentialKnobs { warmup: number, rounds: number, block: number }

export interface SequentialResult {
  latency: LatencyStats
  /** p50 of each round's block, in round order: the spread shows how steady the machine was. */
  roundP50: number[]
  errors: number
  firstError: string | null
}

/**
 * One session per target, warmed up, then `rounds` rounds; each round visits every target in a
 * fresh shuffled order for a block of `block` sequential calls. Sessions open one at a time.
 */
export async function runSequential (targets: Target[], knobs: SequentialKnobs): Promise<Map<string, SequentialResult>> {
  const sessions = new Map<string, BenchSession>()
  const samples = new Map<string, number[][]>(targets.map(t => [t.name, []]))
  const errors = new Map<string, Errors>(targets.map(t => [t.name, new Errors()]))
  try {
    for (const t of targets) sessions.set(t.name, await t.connect())
    // Long enough for V8 to have compiled the hot paths: a gateway's CPU per call kept falling for
    // its first ~4,000 sequential calls (the floor's, for ~1,500), and a production gateway is warm.
    log(`sequential: ${knobs.warmup} warm-up calls per target`)
    let i = 0
    for (const t of shuffled(targets)) {
      for (let k = 0; k < knobs.warmup; k++) errors.get(t.name)!.note(await callEcho(sessions.get(t.name)!, t.echo, i++))
    }
    for (let r = 0; r < knobs.rounds; r++) {
      const order = shuffled(targets)
      log(`sequential: round ${r + 1}/${knobs.rounds}, ${knobs.block} calls each: ${order.map(t => t.name).join(', ')}`)
      for (const t of order) {
        const session = sessions.get(t.name)!
        const block: number[] = []
        for (let k = 0; k < knobs.block; k++) {
          const t0 = performance.now()
          const err = await callEcho(session, t.echo, i++)
          block.push(performance.now() - t0)
          errors.get(t.name)!.note(err)
        }
        samples.get(t.name)!.push(block)
      }
    }
  } finally {
    await Promise.all([...sessions.values()].map(async s => { await s.close() }))
  }
  return new Map(targets.map(t => {
    const blocks = samples.get(t.name)!
    const e = errors.get(t.name)!
    return [t.name, { latency: stats(blocks.flat()), roundP50: blocks.map(b => stats(b).p50), errors: e.count, firstError: e.first }]
  }))
}

// ---- throughput ------------------------------------------------------------------------------

export interface ThroughputKnobs {
  rounds: number
  /** Untimed passes per target first: V8 compiles the paths many sessions at once take (see runThroughput). */
  warmupRounds: number
  sessions: number
  calls: number
  connectConcurrency: number
}

/** CPU ms used by each group of processes over one timed pass. */
interface CpuSplit { serving: number | null, backend: number, redis: number | null, client: number }

export interface ThroughputRound { callsPerSec: number, wallMs: number, calls: number, errors: number, cpuMs: CpuSplit }

export interface ThroughputResult {
  /** Median over rounds. */
  callsPerSec: number
  rounds: ThroughputRound[]
  /** Total CPU over every round divided by every call, in microseconds. */
  cpuUsPerCall: { serving: number | null, backend: number, redis: number | null, client: number }
  /** Per-call latency while all sessions run at once, all rounds together. */
  latency: LatencyStats
  /** Time to open one session (initialize, child start), `connectConcurrency` at a time. */
  connect: LatencyStats
  errors: number
  firstError: string | null
}

const cpuByPid = (pids: number[]): Map<number, number> => new Map(pids.map(pid => [pid, cpuMs(pid) ?? NaN]))

/** CPU between two readings, counting only processes seen in both (children come and go). */
function cpuDelta (before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, ms] of after) {
    const was = before.get(pid)
    if (was !== undefined && Number.isFinite(was) && Number.isFinite(ms)) total += ms - was
  }
  return total
}

async function throughputPass (t: Target, knobs: ThroughputKnobs, latency: number[], connect: number[], errors: Errors): Promise<ThroughputRound> {
  const sessions = await mapLimit(Array.from({ length: knobs.sessions }), knobs.connectConcurrency, async () => {
    const t0 = performance.now()
    const session = await t.connect()
    connect.push(performance.now() - t0)
    return session
  })
  try {
    // Two calls per session first: the first call of a fresh child is not what is measured.
    await Promise.all(sessions.map(async s => { for (let i = 0; i < 2; i++) errors.note(await callEcho(s, t.echo, i)) }))
    const read = (): { serving: Map<number, number>, backend: Map<number, number>, redis: Map<number, number> } => ({
      serving: cpuByPid(t.servingPids),
      backend: cpuByPid(t.backendPids()),
      redis: cpuByPid(t.redisPid === null ? [] : [t.redisPid])
    })
    const before = read()
    const clientBefore = process.cpuUsage()
    let failed = 0
    const t0 = performance.now()
    await Promise.all(sessions.map(async (s, k) => {
      for (let i = 0; i < knobs.calls; i++) {
        const c0 = performance.now()
        const err = await callEcho(s, t.echo, k * knobs.calls + i)
        latency.push(performance.now() - c0)
        if (err !== null) failed++
        errors.note(err)
      }
    }))
    const wallMs = performance.now() - t0
    const client = process.cpuUsage(clientBefore)
    const after = read()
    const calls = knobs.sessions * knobs.calls
    return {
      callsPerSec: calls / (wallMs / 1000),
      wallMs,
      calls,
      errors: failed,
      cpuMs: {
        serving: t.servingPids.length === 0 ? null : cpuDelta(before.serving, after.serving),
        backend: cpuDelta(before.backend, after.backend),
        redis: t.redisPid === null ? null : cpuDelta(before.redis, after.redis),
        client: (client.user + client.system) / 1000
      }
    }
  } finally {
    await mapLimit(sessions, knobs.connectConcurrency * 2, async s => { await s.close() })
  }
}

/**
 * `rounds` rounds; in each, every target in a fresh shuffled order runs one pass: open
 * `sessions` sessions, warm them, then all of them make `calls` sequential calls at once.
 */
export async function runThroughput (targets: Target[], knobs: ThroughputKnobs): Promise<Map<string, ThroughputResult>> {
  const rounds = new Map<string, ThroughputRound[]>(targets.map(t => [t.name, []]))
  const latency = new Map<string, number[]>(targets.map(t => [t.name, []]))
  const connect = new Map<string, number[]>(targets.map(t => [t.name, []]))
  const errors = new Map<string, Errors>(targets.map(t => [t.name, new Errors()]))
  // A gateway runs for days with its hot code optimised; what it costs while V8 is still compiling
  // is not what a call costs. The first pass of 5,000 calls cost the gateway 1.3-1.6x the CPU per
  // call of the passes after it (the floor, with far less code, about 1.4x): left in, the figure
  // measured mostly the JIT. So every target first runs untimed passes, as many as these rounds.
  for (let r = 0; r < knobs.warmupRounds; r++) {
    for (const t of shuffled(targets)) {
      const pass = await throughputPass(t, knobs, [], [], errors.get(t.name)!)
      log(`throughput: warm-up ${r + 1}/${knobs.warmupRounds} ${t.name}: ${pass.callsPerSec.toFixed(0)} calls/s (not counted)`)
    }
  }
  for (let r = 0; r < knobs.rounds; r++) {
    for (const t of shuffled(targets)) {
      const pass = await throughputPass(t, knobs, latency.get(t.name)!, connect.get(t.name)!, errors.get(t.name)!)
      rounds.get(t.name)!.push(pass)
      log(`throughput: round ${r + 1}/${knobs.rounds} ${t.name}: ${pass.callsPerSec.toFixed(0)} calls/s${pass.errors > 0 ? `, ${pass.errors} errors` : ''}`)
    }
  }
  return new Map(targets.map(t => {
    const list = rounds.get(t.name)!
    const calls = list.reduce((a, p) => a + p.calls, 0)
    const perCall = (pick: (c: CpuSplit) => number | null): number | null => {
      const values = list.map(p => pick(p.cpuMs))
      return values.some(v => v === null) ? null : (values as number[]).reduce((a, b) => a + b, 0) * 1000 / calls
    }
    const e = errors.get(t.name)!
    return [t.name, {
      callsPerSec: median(list.map(p => p.callsPerSec)),
      rounds: list,
      cpuUsPerCall: { serving: perCall(c => c.serving), backend: perCall(c => c.backend) ?? NaN, redis: perCall(c => c.redis), client: perCall(c => c.client) ?? NaN },
      latency: stats(latency.get(t.name)!),
      connect: stats(connect.get(t.name)!),
      errors: e.count,
      firstError: e.first
    }]
  }))
}
