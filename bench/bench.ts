// Gateway benchmark: what the gateway costs in latency, throughput and memory compared with a
// client talking to the same MCP server directly. Figures only; nothing is asserted.
//
//   npm run bench          (builds, then node dist/bench/bench.js)
//
// Paths, each driven by the official SDK client calling the `echo` tool:
//   direct               SDK client -> stdio fixture (StdioClientTransport), the baseline
//   gateway-memory       SDK client -> gateway process (memory mode) -> stdio fixture
//   gateway-redis-local  SDK client -> gateway process (Redis mode) -> stdio fixture
//   gateway-redis-cross  initialize to replica A (A owns the child), every later request to
//                        replica B: the bus hop and the Redis event log on every call
//   direct-http          SDK client -> SDK Streamable HTTP upstream, the baseline for the next
//   gateway-http-backend SDK client -> gateway (memory mode) -> that Streamable HTTP upstream
// Per path: sequential latency on one session (after a warm-up) and concurrent throughput
// (BENCH_SESSIONS clients, each its own session, BENCH_CALLS sequential calls each, all at once).
// Then the gateway's memory per idle session (initialize + initialized + an open GET stream):
//   idle-stdio           stdio backend: gateway RSS growth per session; the children apart
//   idle-http            Streamable HTTP backend: no children, the gateway's own cost alone
//
// Knobs (env): BENCH_SEQ (500), BENCH_WARMUP (50), BENCH_SESSIONS (50), BENCH_CALLS (100),
// BENCH_IDLE (200), BENCH_CONNECT_CONCURRENCY (8), BENCH_PATHS (comma list, default all),
// BENCH_LOG_LEVEL (gateway log level, default info as shipped), BENCH_OUT (results file,
// default bench/results/<date>.json).
// The table goes to stdout, progress to stderr. Everything started (redis-server on a free port,
// gateway processes, the upstream, stdio children) is stopped at the end, on error and on SIGINT.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { cpus, loadavg, tmpdir, totalmem } from 'node:os'
import { dirname, join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { FetchLike } from '@modelcontextprotocol/sdk/shared/transport.js'
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js'
import {
  childrenOf, Cleanup, cpuMs, log, memAvailableKiB, pssKiB, rssKiB, startGatewayProcess, startHttpUpstream,
  startRedisServer, type GatewayProcess, type RunningProcess
} from './procs.js'

const FIXTURE = fileURLToPath(new URL('../test/fixtures/full-server.js', import.meta.url))
const REPO = fileURLToPath(new URL('../../', import.meta.url))

const STREAM_PATHS = ['direct', 'gateway-memory', 'gateway-redis-local', 'gateway-redis-cross', 'direct-http', 'gateway-http-backend'] as const
const IDLE_PATHS = ['idle-stdio', 'idle-http'] as const
type StreamPath = typeof STREAM_PATHS[number]
type IdlePath = typeof IDLE_PATHS[number]
const BASELINE: Partial<Record<StreamPath, StreamPath>> = {
  'gateway-memory': 'direct',
  'gateway-redis-local': 'direct',
  'gateway-redis-cross': 'direct',
  'gateway-http-backend': 'direct-http'
}
/** A stdio child of the fixture: ~70 MB RSS, ~27 MB PSS; idle-stdio keeps K of them within half of free memory. */
const CHILD_ESTIMATE_KIB = 40 * 1024

function intEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const n = Number(raw)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${raw}`)
  return n
}

const knobs = {
  seq: intEnv('BENCH_SEQ', 500),
  warmup: intEnv('BENCH_WARMUP', 50),
  sessions: intEnv('BENCH_SESSIONS', 50),
  calls: intEnv('BENCH_CALLS', 100),
  idle: intEnv('BENCH_IDLE', 200),
  connectConcurrency: intEnv('BENCH_CONNECT_CONCURRENCY', 8),
  logLevel: process.env.BENCH_LOG_LEVEL ?? 'info',
  paths: (process.env.BENCH_PATHS ?? [...STREAM_PATHS, ...IDLE_PATHS].join(',')).split(',').map(s => s.trim()).filter(s => s !== '')
}
for (const path of knobs.paths) {
  if (!([...STREAM_PATHS, ...IDLE_PATHS] as string[]).includes(path)) {
    throw new Error(`BENCH_PATHS: unknown path ${path}; known: ${[...STREAM_PATHS, ...IDLE_PATHS].join(', ')}`)
  }
}

// ---- statistics ----------------------------------------------------------------------------

interface LatencyStats { n: number, p50: number, p99: number, mean: number, min: number, max: number }

function stats (samples: number[]): LatencyStats {
  const sorted = [...samples].sort((a, b) => a - b)
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? NaN
  const sum = sorted.reduce((a, b) => a + b, 0)
  return { n: sorted.length, p50: at(0.5), p99: at(0.99), mean: sorted.length === 0 ? NaN : sum / sorted.length, min: sorted[0] ?? NaN, max: sorted.at(-1) ?? NaN }
}

const round = (n: number, digits = 3): number => Number.isFinite(n) ? Number(n.toFixed(digits)) : n

async function mapLimit<T, R> (items: T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length)
  let next = 0
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++
      results[i] = await fn(items[i]!, i)
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker))
  return results
}

// ---- sessions ------------------------------------------------------------------------------

interface BenchSession {
  client: Client
  close: () => Promise<void>
}

/** How a path's `echo` is called and what it must answer (the two fixtures differ). */
interface Echo {
  args: (i: number) => Record<string, unknown>
  expect: (i: number) => string
}
const STDIO_ECHO: Echo = { args: i => ({ text: `ping-${i}` }), expect: i => `ping-${i}` }
const HTTP_ECHO: Echo = { args: i => ({ message: `ping-${i}` }), expect: i => `echo: ping-${i}` }

/** Every session still open, closed by the cleanup if a run stops half-way. */
const openSessions = new Set<BenchSession>()

function track (client: Client, closeTransport: () => Promise<void>): BenchSession {
  const session: BenchSession = {
    client,
    close: async () => {
      if (!openSessions.delete(session)) return
      await closeTransport().catch(() => {})
      await client.close().catch(() => {})
    }
  }
  openSessions.add(session)
  return session
}

async function connectStdio (): Promise<BenchSession> {
  const client = new Client({ name: 'bench', version: '1.0.0' })
  await client.connect(new StdioClientTransport({ command: process.execPath, args: [FIXTURE], stderr: 'ignore' }))
  return track(client, async () => {})
}

async function connectHttp (url: string, fetchImpl?: FetchLike): Promise<BenchSession> {
  const client = new Client({ name: 'bench', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(url), fetchImpl === undefined ? {} : { fetch: fetchImpl })
  await client.connect(transport)
  // DELETE ends the session at once, so the gateway stops its child before the next path runs.
  return track(client, async () => { await transport.terminateSession() })
}

const isInitialize = (body: unknown): boolean => {
  if (typeof body !== 'string' || !body.includes('"initialize"')) return false
  try {
    const parsed = JSON.parse(body) as { method?: unknown }
    return parsed.method === 'initialize'
  } catch {
    return false
  }
}

/** Sends the initialize POST to `a` and every other request (POST, GET, DELETE) to `b`. */
function crossFetch (b: string, counts: { a: number, b: number }): FetchLike {
  const bOrigin = new URL(b)
  return async (url, init) => {
    if (init?.method === 'POST' && isInitialize(init.body)) {
      counts.a++
      return await fetch(url, init)
    }
    counts.b++
    const target = new URL(url)
    target.host = bOrigin.host
    return await fetch(target, init)
  }
}

async function callEcho (session: BenchSession, echo: Echo, i: number): Promise<string | null> {
  try {
    const result = await session.client.callTool({ name: 'echo', arguments: echo.args(i) })
    const content = (result as { content?: Array<{ type: string, text?: string }> }).content
    const text = content?.[0]?.text
    return text === echo.expect(i) && result.isError !== true ? null : `unexpected result ${JSON.stringify(result).slice(0, 200)}`
  } catch (err) {
    return err instanceof Error ? err.message : String(err)
  }
}

// ---- one path ------------------------------------------------------------------------------

interface PathResult {
  path: StreamPath
  baseline: StreamPath | null
  sequential: LatencyStats & { errors: number }
  concurrent: LatencyStats & {
    sessions: number
    callsPerSession: number
    wallMs: number
    callsPerSec: number
    errors: number
    /** Time to open one session (initialize, child start) while opening them connectConcurrency at a time. */
    connect: LatencyStats
    /** Gateway processes only: CPU used per call during the timed concurrent phase. */
    gatewayCpuUsPerCall: number | null
    /** This process (the SDK clients; for direct-http not the upstream): CPU per call, same phase. */
    clientCpuUsPerCall: number
    /** Redis paths: redis-server CPU per call, same phase. */
    redisCpuUsPerCall: number | null
    /** Gateway processes only: RSS with every session open, after the calls. */
    gatewayRssKiB: number | null
  }
  firstError: string | null
  /** gateway-redis-cross: requests sent to each replica (A should see only the initializes). */
  requestsTo?: { a: number, b: number }
}

interface PathSetup {
  connect: () => Promise<BenchSession>
  echo: Echo
  gatewayPids: number[]
  redisPid?: number
  requestsTo?: { a: number, b: number }
  stop: () => Promise<void>
}

const sumOf = (pids: number[], read: (pid: number) => number | null): number | null => {
  if (pids.length === 0) return null
  let total = 0
  for (const pid of pids) total += read(pid) ?? 0
  return total
}

async function runPath (path: StreamPath, setup: PathSetup): Promise<PathResult> {
  let firstError: string | null = null
  const noteError = (err: string | null): number => {
    if (err === null) return 0
    firstError ??= err
    return 1
  }

  log(`${path}: sequential, ${knobs.warmup} warm-up + ${knobs.seq} calls on one session`)
  const seqSamples: number[] = []
  let seqErrors = 0
  const one = await setup.connect()
  try {
    for (let i = 0; i < knobs.warmup; i++) noteError(await callEcho(one, setup.echo, i))
    for (let i = 0; i < knobs.seq; i++) {
      const t0 = performance.now()
      const err = await callEcho(one, setup.echo, i)
      seqSamples.push(performance.now() - t0)
      seqErrors += noteError(err)
    }
  } finally {
    await one.close()
  }

  log(`${path}: opening ${knobs.sessions} sessions (${knobs.connectConcurrency} at a time)`)
  const connectSamples: number[] = []
  const sessions = await mapLimit(Array.from({ length: knobs.sessions }), knobs.connectConcurrency, async () => {
    const t0 = performance.now()
    const session = await setup.connect()
    connectSamples.push(performance.now() - t0)
    return session
  })
  try {
    // Two calls per session first: the first call of a fresh child is not what we measure.
    await Promise.all(sessions.map(async s => { for (let i = 0; i < 2; i++) noteError(await callEcho(s, setup.echo, i)) }))
    log(`${path}: concurrent, ${knobs.sessions} sessions x ${knobs.calls} calls`)
    const cpuBefore = sumOf(setup.gatewayPids, cpuMs)
    const redisBefore = setup.redisPid === undefined ? null : cpuMs(setup.redisPid)
    const clientBefore = process.cpuUsage()
    const samples: number[] = []
    let errors = 0
    const t0 = performance.now()
    await Promise.all(sessions.map(async (s, k) => {
      for (let i = 0; i < knobs.calls; i++) {
        const c0 = performance.now()
        const err = await callEcho(s, setup.echo, k * knobs.calls + i)
        samples.push(performance.now() - c0)
        errors += noteError(err)
      }
    }))
    const wallMs = performance.now() - t0
    const client = process.cpuUsage(clientBefore)
    const cpuAfter = sumOf(setup.gatewayPids, cpuMs)
    const redisAfter = setup.redisPid === undefined ? null : cpuMs(setup.redisPid)
    const gatewayRssKiB = sumOf(setup.gatewayPids, rssKiB)
    const total = knobs.sessions * knobs.calls
    const result: PathResult = {
      path,
      baseline: BASELINE[path] ?? null,
      sequential: { ...stats(seqSamples), errors: seqErrors },
      concurrent: {
        ...stats(samples),
        sessions: knobs.sessions,
        callsPerSession: knobs.calls,
        wallMs,
        callsPerSec: total / (wallMs / 1000),
        errors,
        connect: stats(connectSamples),
        gatewayCpuUsPerCall: cpuBefore === null || cpuAfter === null ? null : (cpuAfter - cpuBefore) * 1000 / total,
        clientCpuUsPerCall: (client.user + client.system) / total,
        redisCpuUsPerCall: redisBefore === null || redisAfter === null ? null : (redisAfter - redisBefore) * 1000 / total,
        gatewayRssKiB
      },
      firstError,
      ...(setup.requestsTo !== undefined ? { requestsTo: { ...setup.requestsTo } } : {})
    }
    log(`${path}: seq p50 ${result.sequential.p50.toFixed(2)} ms, ${result.concurrent.callsPerSec.toFixed(0)} calls/s${errors + seqErrors > 0 ? `, ${errors + seqErrors} errors (${firstError ?? ''})` : ''}`)
    return result
  } finally {
    log(`${path}: closing ${sessions.length} sessions`)
    await mapLimit(sessions, knobs.connectConcurrency * 2, async s => { await s.close() })
  }
}

// ---- idle memory ---------------------------------------------------------------------------

interface IdleResult {
  path: IdlePath
  sessions: number
  requested: number
  failed: number
  /** Whether the gateway ran a full GC before each sample (it runs with --expose-gc). */
  gc: boolean
  before: MemorySample
  after: MemorySample
  /** (after - before) / sessions, in KiB. */
  perSessionKiB: { rss: number, heapUsed: number, external: number }
  /** stdio only: the backend children, one per session. */
  children: { count: number, rssKiB: number, pssKiB: number, pssKiBPerChild: number } | null
  firstError: string | null
}

/** One gateway memory sample, KiB. */
interface MemorySample { rssKiB: number, pssKiB: number | null, heapUsedKiB: number, externalKiB: number }

interface IdleSession { sid: string, abort: AbortController, url: string }

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

/** initialize, notifications/initialized, then a GET stream held open and drained in the background. */
async function openIdleSession (url: string): Promise<IdleSession> {
  const init = await fetch(url, {
    method: 'POST',
    headers: HEADERS,
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: LATEST_PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'bench-idle', version: '1.0.0' } } })
  })
  const sid = init.headers.get('mcp-session-id')
  const body = await init.text()
  if (!init.ok || sid === null || !body.includes('"result"')) throw new Error(`initialize answered ${init.status}: ${body.slice(0, 200)}`)
  const version = /"protocolVersion":"([^"]+)"/.exec(body)?.[1] ?? LATEST_PROTOCOL_VERSION
  const headers = { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': version }
  const initialized = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  await initialized.arrayBuffer()
  if (initialized.status !== 202) throw new Error(`notifications/initialized answered ${initialized.status}`)
  const abort = new AbortController()
  const get = await fetch(url, { headers: { ...headers, accept: 'text/event-stream' }, signal: abort.signal })
  if (get.status !== 200 || get.body === null) throw new Error(`GET answered ${get.status}`)
  const reader = get.body.getReader()
  void (async () => {
    try {
      while (!(await reader.read()).done) { /* keep-alives and priming events */ }
    } catch { /* aborted */ }
  })()
  return { sid, abort, url: `${url}#${version}` }
}

async function closeIdleSession (session: IdleSession): Promise<void> {
  session.abort.abort()
  const [url, version] = session.url.split('#') as [string, string]
  await fetch(url, { method: 'DELETE', headers: { 'mcp-session-id': session.sid, 'mcp-protocol-version': version } })
    .then(async res => { await res.arrayBuffer() }, () => {})
}

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

async function runIdle (path: IdlePath, gateway: GatewayProcess, server: string, count: number): Promise<IdleResult> {
  const url = `${gateway.url}/mcp/${server}`
  const open = new Set<IdleSession>()
  let firstError: string | null = null
  let failed = 0
  try {
    // Warm-up: the first sessions load and compile code paths that later sessions only reuse.
    log(`${path}: warm-up, 10 sessions opened and closed`)
    const warm = await mapLimit(Array.from({ length: 10 }), knobs.connectConcurrency, async () => await openIdleSession(url))
    await mapLimit(warm, knobs.connectConcurrency, closeIdleSession)
    const before = await sampleMemory(gateway)
    log(`${path}: gateway RSS ${(before.rssKiB / 1024).toFixed(1)} MiB, heap ${(before.heapUsedKiB / 1024).toFixed(1)} MiB; opening ${count} idle sessions with open GET streams`)
    await mapLimit(Array.from({ length: count }), knobs.connectConcurrency, async () => {
      try {
        open.add(await openIdleSession(url))
      } catch (err) {
        failed++
        firstError ??= err instanceof Error ? err.message : String(err)
      }
    })
    const after = await sampleMemory(gateway)
    let children: IdleResult['children'] = null
    if (path === 'idle-stdio') {
      const pids = childrenOf(gateway.pid)
      const rss = sumOf(pids, rssKiB) ?? 0
      const pss = sumOf(pids, pssKiB) ?? 0
      children = { count: pids.length, rssKiB: rss, pssKiB: pss, pssKiBPerChild: pids.length === 0 ? 0 : pss / pids.length }
    }
    const per = (pick: (s: MemorySample) => number): number => open.size === 0 ? NaN : (pick(after) - pick(before)) / open.size
    const { gc, ...beforeSample } = before
    const { gc: gcAfter, ...afterSample } = after
    const result: IdleResult = {
      path,
      sessions: open.size,
      requested: count,
      failed,
      gc: gc && gcAfter,
      before: beforeSample,
      after: afterSample,
      perSessionKiB: { rss: per(s => s.rssKiB), heapUsed: per(s => s.heapUsedKiB), external: per(s => s.externalKiB) },
      children,
      firstError
    }
    log(`${path}: ${open.size} sessions, gateway RSS ${(after.rssKiB / 1024).toFixed(1)} MiB, ${result.perSessionKiB.rss.toFixed(1)} KiB RSS and ${result.perSessionKiB.heapUsed.toFixed(1)} KiB heap per session${failed > 0 ? `, ${failed} failed (${firstError ?? ''})` : ''}`)
    return result
  } finally {
    log(`${path}: closing ${open.size} sessions`)
    await mapLimit([...open], knobs.connectConcurrency * 2, closeIdleSession)
  }
}

// ---- environment, output ---------------------------------------------------------------------

function sdkVersion (): string | null {
  try {
    return (JSON.parse(readFileSync(join(REPO, 'node_modules/@modelcontextprotocol/sdk/package.json'), 'utf8')) as { version: string }).version
  } catch {
    return null
  }
}

function gitCommit (): string | null {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: REPO, encoding: 'utf8' }).trim()
  } catch {
    return null
  }
}

const fmt = (n: number | null | undefined, digits = 2): string => n === null || n === undefined || !Number.isFinite(n) ? '-' : n.toFixed(digits)

function table (rows: string[][]): string {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map(r => r[c]!.length)))
  return rows.map(r => r.map((cell, c) => c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!)).join('  ')).join('\n')
}

function report (paths: PathResult[], idle: IdleResult[], loadStart: number[]): string {
  const byPath = new Map(paths.map(p => [p.path, p]))
  const rows = [[
    'path', 'seq p50', 'seq p99', 'seq mean', 'conc calls/s', 'conc p50', 'conc p99', 'open p50',
    'client CPU', 'gw CPU', 'redis CPU', 'gw RSS MiB', 'errors',
    'x p50', 'x mean', 'x calls/s'
  ]]
  for (const p of paths) {
    const base = p.baseline === null ? undefined : byPath.get(p.baseline)
    rows.push([
      p.path,
      fmt(p.sequential.p50), fmt(p.sequential.p99), fmt(p.sequential.mean),
      fmt(p.concurrent.callsPerSec, 0), fmt(p.concurrent.p50), fmt(p.concurrent.p99), fmt(p.concurrent.connect.p50, 0),
      fmt(p.concurrent.clientCpuUsPerCall, 0), fmt(p.concurrent.gatewayCpuUsPerCall, 0), fmt(p.concurrent.redisCpuUsPerCall, 0),
      p.concurrent.gatewayRssKiB === null ? '-' : fmt(p.concurrent.gatewayRssKiB / 1024, 1),
      String(p.sequential.errors + p.concurrent.errors),
      base === undefined ? '-' : fmt(p.sequential.p50 / base.sequential.p50),
      base === undefined ? '-' : fmt(p.sequential.mean / base.sequential.mean),
      base === undefined ? '-' : fmt(p.concurrent.callsPerSec / base.concurrent.callsPerSec)
    ])
  }
  const load = (l: number[]): string => l.map(n => n.toFixed(2)).join(' ')
  const lines = [
    `${cpus().length} CPUs (${cpus()[0]?.model ?? '?'}), node ${process.version}; load average ${load(loadStart)} at start, ${load(loadavg())} at the end:`,
    'everything else running on the machine shares those CPUs with the clients, the gateway and the backends.',
    '',
    `Latencies in ms (SDK client callTool('echo') round trip). seq: ${knobs.seq} calls on one session after ${knobs.warmup} warm-up;`,
    `conc: ${knobs.sessions} sessions x ${knobs.calls} calls, all sessions at once. open: time to open one session (${knobs.connectConcurrency} at a time).`,
    'x p50 / x mean: sequential latency gateway/direct; x calls/s: throughput gateway/direct (baseline: direct, or direct-http for gateway-http-backend).',
    'CPU columns: microseconds of CPU per call in the concurrent phase, of this process (all SDK clients), of the gateway process(es),',
    'of redis-server (10 ms tick resolution for the last two). gw RSS: gateway process(es) with every session open.',
    '',
    table(rows)
  ]
  const cross = byPath.get('gateway-redis-cross')?.requestsTo
  if (cross !== undefined) lines.push('', `gateway-redis-cross: ${cross.a} requests went to replica A (initialize), ${cross.b} to replica B.`)
  if (idle.length > 0) {
    const idleRows = [[
      'idle', 'sessions', 'failed', 'gw RSS before', 'gw RSS after', 'RSS KiB/session', 'heap KiB/session', 'external KiB/session',
      'children', 'children RSS', 'children PSS', 'PSS/child'
    ]]
    for (const r of idle) {
      idleRows.push([
        r.path, String(r.sessions), String(r.failed), fmt(r.before.rssKiB / 1024, 1), fmt(r.after.rssKiB / 1024, 1),
        fmt(r.perSessionKiB.rss, 1), fmt(r.perSessionKiB.heapUsed, 1), fmt(r.perSessionKiB.external, 1),
        r.children === null ? '-' : String(r.children.count),
        r.children === null ? '-' : fmt(r.children.rssKiB / 1024, 0),
        r.children === null ? '-' : fmt(r.children.pssKiB / 1024, 0),
        r.children === null ? '-' : fmt(r.children.pssKiBPerChild / 1024, 1)
      ])
    }
    lines.push(
      '',
      'Idle sessions (initialize + initialized + open GET stream), gateway in memory mode. Memory in MiB unless marked KiB;',
      `gateway sampled after a forced full GC${idle.every(r => r.gc) ? '' : ' (NOT available in this run)'}; children: the stdio backends, RSS summed (shared pages counted each time) and PSS (shared pages split).`,
      '',
      table(idleRows)
    )
  }
  for (const r of [...paths, ...idle]) {
    if (r.firstError !== null) lines.push(`${r.path}: first error: ${r.firstError}`)
  }
  return lines.join('\n')
}

// ---- main ------------------------------------------------------------------------------------

const cleanup = new Cleanup()
let interrupted = false
process.on('SIGINT', () => {
  if (interrupted) process.exit(130)
  interrupted = true
  log('interrupted: stopping everything (Ctrl-C again to leave at once)')
  void cleanup.runAll().finally(() => process.exit(130))
})

async function main (): Promise<void> {
  const started = Date.now()
  const loadStart = loadavg()
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-bench-'))
  let ok = false
  cleanup.add('bench sessions', async () => {
    await Promise.allSettled([...openSessions].map(async s => { await s.close() }))
  })
  const selected = new Set(knobs.paths)
  const paths: PathResult[] = []
  const idle: IdleResult[] = []
  log(`knobs ${JSON.stringify(knobs)}; gateway logs in ${dir}`)

  const stdioServer = { transport: 'stdio', command: process.execPath, args: [FIXTURE], maxSessions: 100_000 }
  const base = { log: { level: knobs.logLevel } }
  let redis: RunningProcess | undefined
  let upstream: RunningProcess | undefined
  const needRedis = async (): Promise<RunningProcess> => { redis ??= await startRedisServer(cleanup); return redis }
  const needUpstream = async (): Promise<RunningProcess> => { upstream ??= await startHttpUpstream(cleanup); return upstream }
  const redisConfig = async (): Promise<Record<string, unknown>> => ({ url: (await needRedis()).url, keyPrefix: `bench-${randomBytes(4).toString('hex')}` })

  try {
    for (const path of STREAM_PATHS) {
      if (!selected.has(path)) continue
      let setup: PathSetup
      switch (path) {
        case 'direct':
          setup = { connect: connectStdio, echo: STDIO_ECHO, gatewayPids: [], stop: async () => {} }
          break
        case 'gateway-memory': {
          const gw = await startGatewayProcess(cleanup, dir, 'memory', { ...base, servers: { full: stdioServer } })
          setup = { connect: async () => await connectHttp(`${gw.url}/mcp/full`), echo: STDIO_ECHO, gatewayPids: [gw.pid], stop: gw.stop }
          break
        }
        case 'gateway-redis-local': {
          const gw = await startGatewayProcess(cleanup, dir, 'redis-local', { ...base, redis: await redisConfig(), servers: { full: stdioServer } })
          setup = { connect: async () => await connectHttp(`${gw.url}/mcp/full`), echo: STDIO_ECHO, gatewayPids: [gw.pid], redisPid: redis?.pid, stop: gw.stop }
          break
        }
        case 'gateway-redis-cross': {
          const config = { ...base, redis: await redisConfig(), servers: { full: stdioServer } }
          const [a, b] = await Promise.all([startGatewayProcess(cleanup, dir, 'redis-A', config), startGatewayProcess(cleanup, dir, 'redis-B', config)])
          const counts = { a: 0, b: 0 }
          setup = {
            connect: async () => await connectHttp(`${a.url}/mcp/full`, crossFetch(b.url, counts)),
            echo: STDIO_ECHO,
            gatewayPids: [a.pid, b.pid],
            redisPid: redis?.pid,
            requestsTo: counts,
            stop: async () => { await Promise.all([a.stop(), b.stop()]) }
          }
          break
        }
        case 'direct-http': {
          const up = await needUpstream()
          setup = { connect: async () => await connectHttp(up.url), echo: HTTP_ECHO, gatewayPids: [], stop: async () => {} }
          break
        }
        case 'gateway-http-backend': {
          const up = await needUpstream()
          const gw = await startGatewayProcess(cleanup, dir, 'http-backend', { ...base, servers: { up: { transport: 'streamable-http', url: up.url } } })
          setup = { connect: async () => await connectHttp(`${gw.url}/mcp/up`), echo: HTTP_ECHO, gatewayPids: [gw.pid], stop: gw.stop }
          break
        }
      }
      try {
        paths.push(await runPath(path, setup))
      } finally {
        await setup.stop()
      }
    }

    if (selected.has('idle-stdio')) {
      const room = Math.floor(memAvailableKiB() / 2 / CHILD_ESTIMATE_KIB)
      const count = Math.max(1, Math.min(knobs.idle, room))
      if (count < knobs.idle) log(`idle-stdio: only ${count} sessions fit in half of the free memory (~40 MB per child); BENCH_IDLE was ${knobs.idle}`)
      const gw = await startGatewayProcess(cleanup, dir, 'idle-stdio', { ...base, servers: { full: stdioServer } }, { gcProbe: true })
      try {
        idle.push(await runIdle('idle-stdio', gw, 'full', count))
      } finally {
        await gw.stop()
      }
    }
    if (selected.has('idle-http')) {
      const up = await needUpstream()
      const gw = await startGatewayProcess(cleanup, dir, 'idle-http', { ...base, servers: { up: { transport: 'streamable-http', url: up.url, maxSessions: 100_000 } } }, { gcProbe: true })
      try {
        idle.push(await runIdle('idle-http', gw, 'up', knobs.idle))
      } finally {
        await gw.stop()
      }
    }
    ok = true
  } finally {
    await cleanup.runAll()
    if (ok) await rm(dir, { recursive: true, force: true })
    else log(`gateway logs kept in ${dir}`)
  }

  const text = report(paths, idle, loadStart)
  process.stdout.write(`${text}\n`)
  const date = new Date(started).toISOString().slice(0, 10)
  const out = process.env.BENCH_OUT ?? join(REPO, 'bench', 'results', `${date}.json`)
  mkdirSync(dirname(out), { recursive: true })
  const roundAll = (value: unknown): unknown => JSON.parse(JSON.stringify(value, (_k, v: unknown) => typeof v === 'number' ? round(v) : v))
  writeFileSync(out, `${JSON.stringify({
    date: new Date(started).toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? null,
      memTotalMiB: Math.round(totalmem() / 1024 / 1024),
      node: process.version,
      loadavgStart: loadStart.map(n => round(n, 2)),
      loadavgEnd: loadavg().map(n => round(n, 2))
    },
    sdkVersion: sdkVersion(),
    gitCommit: gitCommit(),
    knobs,
    paths: roundAll(paths),
    idle: roundAll(idle),
    table: text.split('\n')
  }, null, 2)}\n`)
  log(`results written to ${out} (${((Date.now() - started) / 1000).toFixed(0)} s)`)
}

main().catch(err => {
  // After Ctrl-C, work in flight fails as its processes stop: that is not worth a stack.
  if (interrupted) return
  log(`failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`)
  process.exitCode = 1
})
