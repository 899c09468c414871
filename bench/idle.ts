// The memory phases: the gateway heap per idle session with its GET stream open, and
// 10,000 idle GET streams on one replica with an HTTP backend (RSS and event-loop stalls).
// Both drive the gateway with bench/raw-client.ts, and read its memory after a forced full GC
// (bench/gc-probe.ts) and its stalls from bench/loop-probe.ts.
import { readFileSync } from 'node:fs'
import { setTimeout as sleep } from 'node:timers/promises'
import { childrenOf, fdCount, fdLimit, log, pssKiB, rssKiB, type GatewayProcess, type LoopControl, type LoopSample } from './procs.js'
import { closeRawSession, openRawSession, type RawSession } from './raw-client.js'
import { mapLimit } from './stats.js'

/** One gateway memory sample, KiB. */
export interface MemorySample { rssKiB: number, pssKiB: number | null, heapUsedKiB: number, externalKiB: number }

/**
 * The gateway's memory once it is steady: a full GC, then RSS read every second until eight
 * readings agree within 256 KiB (at most 30 s). V8 hands freed pages back to the OS some
 * seconds after a GC (about 5 s here), so a reading taken at once can be ~20 MiB high.
 */
async function sampleMemory (gateway: GatewayProcess): Promise<MemorySample & { gc: boolean }> {
  let probed = await gateway.probeMemory?.()
  const readings: number[] = []
  const deadline = Date.now() + 30_000
  for (;;) {
    readings.push(rssKiB(gateway.pid) ?? NaN)
    const last = readings.slice(-8)
    if (last.length === 8 && Math.max(...last) - Math.min(...last) <= 256) break
    if (Date.now() > deadline) {
      log(`gateway ${gateway.name}: RSS did not settle (${last.map(k => (k / 1024).toFixed(1)).join(', ')} MiB)`)
      break
    }
    await sleep(1000)
  }
  probed = await gateway.probeMemory?.() ?? probed
  return {
    gc: probed?.gc ?? false,
    rssKiB: rssKiB(gateway.pid) ?? NaN,
    pssKiB: pssKiB(gateway.pid),
    heapUsedKiB: probed === undefined ? NaN : probed.heapUsed / 1024,
    externalKiB: probed === undefined ? NaN : probed.external / 1024
  }
}

/** Opens `count` raw sessions into `open`, `concurrency` at a time; failures are counted, not thrown. */
export async function openMany (url: string, count: number, concurrency: number, onDrop: (s: RawSession) => void, open = new Set<RawSession>()): Promise<{ open: Set<RawSession>, failed: number, firstError: string | null }> {
  let failed = 0
  let firstError: string | null = null
  await mapLimit(Array.from({ length: count }), concurrency, async () => {
    try {
      open.add(await openRawSession(url, onDrop))
    } catch (err) {
      failed++
      firstError ??= err instanceof Error ? err.message : String(err)
    }
  })
  return { open, failed, firstError }
}

async function closeMany (sessions: Iterable<RawSession>, concurrency: number): Promise<void> {
  await mapLimit([...sessions], concurrency, closeRawSession)
}

/**
 * Warm-up: the first sessions load and compile code paths that later sessions only reuse. V8
 * compiles a path only once it is hot, so a warm-up of 20 sessions left code compiled during the
 * measured ramp, counted in the heap as if sessions held it: 2.4-3.5 KiB "per session" of the
 * 200 (heap snapshots, 2026-11-26). The heap phase warms with as many sessions as it measures.
 */
async function warmUp (url: string, concurrency: number, count = 20): Promise<void> {
  const warm = await openMany(url, count, concurrency, () => {})
  await closeMany(warm.open, concurrency)
}

// ---- heap per idle session -------------------------------------------------------------------

export interface IdleResult {
  name: string
  sessions: number
  requested: number
  failed: number
  /** Whether the gateway ran a full GC before each sample (it runs with --expose-gc). */
  gc: boolean
  before: MemorySample
  after: MemorySample
  /** Once every session was closed again: what stays is a leak or a cache. */
  afterClose: MemorySample
  /** (after - before) / sessions, in KiB. */
  perSessionKiB: { rss: number, heapUsed: number, external: number }
  /** stdio only: the backend children, one per session. */
  children: { count: number, rssKiB: number, pssKiB: number, pssKiBPerChild: number } | null
  firstError: string | null
}

/** stdioChildren: the gateway's children are the sessions' backends, whose memory is reported apart. */
export async function runIdle (name: string, gateway: GatewayProcess, url: string, count: number, concurrency: number, stdioChildren: boolean): Promise<IdleResult> {
  const open = new Set<RawSession>()
  try {
    log(`${name}: warm-up, ${count} sessions opened and closed`)
    await warmUp(url, concurrency, count)
    const before = await sampleMemory(gateway)
    log(`${name}: gateway RSS ${(before.rssKiB / 1024).toFixed(1)} MiB, heap ${(before.heapUsedKiB / 1024).toFixed(1)} MiB; opening ${count} idle sessions with open GET streams`)
    const opened = await openMany(url, count, concurrency, () => {}, open)
    const after = await sampleMemory(gateway)
    let children: IdleResult['children'] = null
    if (stdioChildren) {
      const pids = childrenOf(gateway.pid)
      const rss = pids.reduce((a, pid) => a + (rssKiB(pid) ?? 0), 0)
      const pss = pids.reduce((a, pid) => a + (pssKiB(pid) ?? 0), 0)
      children = { count: pids.length, rssKiB: rss, pssKiB: pss, pssKiBPerChild: pids.length === 0 ? 0 : pss / pids.length }
    }
    const sessions = open.size
    log(`${name}: closing ${sessions} sessions`)
    await closeMany(open, concurrency * 2)
    open.clear()
    const afterClose = await sampleMemory(gateway)
    const per = (pick: (s: MemorySample) => number): number => sessions === 0 ? NaN : (pick(after) - pick(before)) / sessions
    const { gc, ...beforeSample } = before
    const { gc: gcAfter, ...afterSample } = after
    const { gc: gcClose, ...afterCloseSample } = afterClose
    const result: IdleResult = {
      name,
      sessions,
      requested: count,
      failed: opened.failed,
      gc: gc && gcAfter && gcClose,
      before: beforeSample,
      after: afterSample,
      afterClose: afterCloseSample,
      perSessionKiB: { rss: per(s => s.rssKiB), heapUsed: per(s => s.heapUsedKiB), external: per(s => s.externalKiB) },
      children,
      firstError: opened.firstError
    }
    log(`${name}: ${sessions} sessions, ${result.perSessionKiB.heapUsed.toFixed(1)} KiB heap and ${result.perSessionKiB.rss.toFixed(1)} KiB RSS per session${opened.failed > 0 ? `, ${opened.failed} failed (${opened.firstError ?? ''})` : ''}`)
    return result
  } finally {
    await closeMany(open, concurrency * 2)
  }
}

// ---- many idle GET streams -------------------------------------------------------------------

/** Sockets the gateway keeps beyond one per stream: its pooled upstream POST connections (64 by default) and slack. */
const FD_MARGIN = 200

export interface StreamsFit {
  /** How many streams fit, and which limit decided it (null: the request fits). */
  count: number
  limitedBy: string | null
}

/**
 * How many idle streams this machine can hold: each stream is a socket in this process and in
 * the gateway, plus one gateway-to-upstream socket and one in the upstream when the upstream
 * offers a GET stream; each socket is a file descriptor, and each client socket a local port.
 */
export function streamsFit (requested: number, gatewayPid: number, upstreamPid: number, upstreamGet: boolean): StreamsFit {
  const [lo, hi] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number) as [number, number]
  const limits: Array<{ count: number, why: string }> = []
  const byFds = (pid: number, who: string, perStream: number): void => {
    const limit = fdLimit(pid)
    const used = fdCount(pid)
    if (limit === null || used === null) return
    const count = Math.floor((limit - used - FD_MARGIN) / perStream)
    limits.push({ count, why: `${who} may open ${limit} files (RLIMIT_NOFILE, a hard limit this container cannot raise) and uses ${perStream} per stream${perStream > 1 ? ' (the client socket and the upstream GET socket)' : ''}, ${used} already, ${FD_MARGIN} kept spare` })
  }
  byFds(gatewayPid, 'the gateway', upstreamGet ? 2 : 1)
  byFds(process.pid, 'the bench client', 1)
  if (upstreamGet) byFds(upstreamPid, 'the upstream', 1)
  limits.push({ count: hi - lo + 1 - FD_MARGIN, why: `loopback connections to one port need a local port each (ip_local_port_range ${lo}-${hi})` })
  const tightest = limits.reduce((a, b) => (b.count < a.count ? b : a))
  return tightest.count >= requested ? { count: requested, limitedBy: null } : { count: Math.max(0, tightest.count), limitedBy: tightest.why }
}

export interface StreamsResult {
  name: string
  upstreamGet: boolean
  requested: number
  fit: StreamsFit
  opened: number
  failed: number
  firstError: string | null
  /** Streams the gateway ended while they should have stayed open (none expected). */
  dropped: { ramp: number, hold: number }
  ramp: { seconds: number, perSecond: number } & Stalls
  hold: { seconds: number } & Stalls
  /** The same probe in an idle process over the same windows: the machine's own stalls. */
  control: { ramp: Stalls, hold: Stalls }
  /**
   * Every gateway window with a stall over 50 ms: seconds since the ramp started, the stall, the
   * longest GC pause near it, and the control's longest stall within one window of it (when that
   * is long too, the machine rather than the gateway held the CPU).
   */
  longStalls: Array<{ atS: number, stallMs: number, gcMs: number, controlMs: number }>
  rssKiB: { before: number, afterRamp: number, endOfHold: number, maxDuring: number }
  /** Gateway heap after a forced GC: before the ramp, at the end of the hold, and after closing them all. */
  heapKiB: { before: number, held: number, afterClose: number }
  heapPerStreamKiB: number
  gatewayFds: number | null
}

export interface StreamsKnobs { count: number, concurrency: number, holdS: number }

export interface Stalls { maxStallMs: number, windowsOver50Ms: number }

const LONG_STALL_MS = 50
/** loop-probe.ts's window. */
const WINDOW_MS = 250
const within = (samples: LoopSample[], from: number, to: number): LoopSample[] => samples.filter(s => s.t >= from && s.t <= to)
const stallsOf = (samples: LoopSample[]): Stalls => ({
  maxStallMs: samples.reduce((a, s) => Math.max(a, s.maxStallMs), 0),
  windowsOver50Ms: samples.filter(s => s.maxStallMs > LONG_STALL_MS).length
})

export async function runStreams (name: string, gateway: GatewayProcess, control: LoopControl, url: string, fit: StreamsFit, requested: number, upstreamGet: boolean, knobs: StreamsKnobs): Promise<StreamsResult> {
  const open = new Set<RawSession>()
  let dropped = 0
  try {
    log(`${name}: warm-up`)
    await warmUp(url, knobs.concurrency)
    const before = await sampleMemory(gateway)
    log(`${name}: ramping to ${fit.count} idle GET streams, ${knobs.concurrency} at a time`)
    const rampStart = Date.now()
    let lastReport = rampStart
    const onDrop = (): void => { dropped++ }
    // Progress every 10 s: a ramp of thousands of sessions takes minutes here.
    const progress = setInterval(() => {
      if (Date.now() - lastReport < 10_000) return
      lastReport = Date.now()
      log(`${name}: ${open.size} streams open, gateway RSS ${((rssKiB(gateway.pid) ?? NaN) / 1024).toFixed(0)} MiB`)
    }, 1000)
    let opened: Awaited<ReturnType<typeof openMany>>
    try {
      opened = await openMany(url, fit.count, knobs.concurrency, onDrop, open)
    } finally {
      clearInterval(progress)
    }
    const rampEnd = Date.now()
    const afterRamp = rssKiB(gateway.pid) ?? NaN
    const dropsBeforeHold = dropped
    log(`${name}: ${open.size} streams open after ${((rampEnd - rampStart) / 1000).toFixed(0)} s; holding ${knobs.holdS} s`)
    await sleep(knobs.holdS * 1000)
    const holdEnd = Date.now()
    const endOfHold = rssKiB(gateway.pid) ?? NaN
    const gatewayFds = fdCount(gateway.pid)
    const samples = within(gateway.loopSamples?.() ?? [], rampStart, holdEnd)
    const controlSamples = control.samples()
    const ramp = stallsOf(within(samples, rampStart, rampEnd))
    const hold = stallsOf(within(samples, rampEnd, holdEnd))
    // The forced GC is a stall of its own: it is taken after the hold window closed.
    const held = await sampleMemory(gateway)
    const count = open.size
    log(`${name}: closing ${count} streams`)
    await closeMany(open, knobs.concurrency * 2)
    open.clear()
    const afterClose = await sampleMemory(gateway)
    const rampS = (rampEnd - rampStart) / 1000
    const result: StreamsResult = {
      name,
      upstreamGet,
      requested,
      fit,
      opened: count,
      failed: opened.failed,
      firstError: opened.firstError,
      dropped: { ramp: dropsBeforeHold, hold: dropped - dropsBeforeHold },
      ramp: { seconds: rampS, perSecond: count / rampS, ...ramp },
      hold: { seconds: (holdEnd - rampEnd) / 1000, ...hold },
      control: { ramp: stallsOf(within(controlSamples, rampStart, rampEnd)), hold: stallsOf(within(controlSamples, rampEnd, holdEnd)) },
      longStalls: samples.filter(s => s.maxStallMs > LONG_STALL_MS).map(s => ({
        atS: (s.t - rampStart) / 1000,
        stallMs: s.maxStallMs,
        gcMs: s.maxGcMs,
        controlMs: stallsOf(within(controlSamples, s.t - WINDOW_MS, s.t + WINDOW_MS)).maxStallMs
      })),
      // The probe samples every 250 ms; the /proc readings at the phase ends count too.
      rssKiB: { before: before.rssKiB, afterRamp, endOfHold, maxDuring: samples.reduce((a, s) => Math.max(a, s.rssKiB), Math.max(afterRamp, endOfHold)) },
      heapKiB: { before: before.heapUsedKiB, held: held.heapUsedKiB, afterClose: afterClose.heapUsedKiB },
      heapPerStreamKiB: count === 0 ? NaN : (held.heapUsedKiB - before.heapUsedKiB) / count,
      gatewayFds
    }
    log(`${name}: ${count} streams, RSS ${(endOfHold / 1024).toFixed(0)} MiB, max stall ${ramp.maxStallMs} ms ramp / ${hold.maxStallMs} ms hold, ${result.dropped.ramp + result.dropped.hold} dropped`)
    return result
  } finally {
    await closeMany(open, knobs.concurrency * 2)
  }
}
