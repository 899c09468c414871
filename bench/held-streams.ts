// idle GET streams held for a long time on one replica, in memory mode and in
// Redis mode (a redis-server this run starts), with bursts of calls that make the pool start and
// stop children. Goal: no stream ended by the gateway. Also reported: the upkeep passes' durations
// (the gateway's own histogram, mcpgw_upkeep_pass_duration_seconds), the gateway's RSS, children,
// the machine's load, and the gateway's own lines about streams it ended (by reason).
//
//   npm run bench:held-streams      (builds, raises the open-file limit, runs dist/bench/held-streams.js)
//
// Each session is raw HTTP (bench/raw-client.ts): initialize, notifications/initialized, then a
// GET stream kept open and drained. Every BENCH_BURST_EVERY_S a burst of BENCH_BURST_CALLS tool
// calls, BENCH_BURST_CONCURRENCY at a time, on sessions picked at random: more at once than the
// pool keeps warm (poolSize), so it starts children up to poolMax, and stops them again once idle
// (30 s for those beyond poolSize).
//
// Knobs (env, defaults in brackets): BENCH_STREAMS [10000], BENCH_DURATION_S [3600] (per mode),
// BENCH_MODES [memory,redis], BENCH_SERVER [everything: @modelcontextprotocol/server-everything;
// full: the test fixture], BENCH_BURST_EVERY_S [60], BENCH_BURST_CALLS [50],
// BENCH_BURST_CONCURRENCY [24], BENCH_STREAMS_CONCURRENCY [16], BENCH_POOL_SIZE [4],
// BENCH_OUT (default bench/results/<date>-held-streams.json), BENCH_KEEP_LOGS (set: keep the
// gateway's log).
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { createRequire } from 'node:module'
import { cpus, loadavg, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { Agent, request } from 'node:http'
import { openMany } from './idle.js'
import { childrenOf, Cleanup, log, rssKiB, startGatewayProcess, startRedisServer, type GatewayProcess, streamsThatFit } from './procs.js'
import { closeRawSession, type RawSession } from './raw-client.js'
import { fmt, intEnv, mapLimit, round } from './stats.js'
import { GATEWAY_PATH, STDIO_COMMAND } from './targets.js'

const REPO = fileURLToPath(new URL('../../', import.meta.url))
const FD_MARGIN = 200

const knobs = {
  streams: intEnv('BENCH_STREAMS', 10_000),
  durationS: intEnv('BENCH_DURATION_S', 3600),
  modes: (process.env.BENCH_MODES ?? 'memory,redis').split(',').map(m => m.trim()).filter(m => m === 'memory' || m === 'redis'),
  server: process.env.BENCH_SERVER === 'full' ? 'full' : 'everything',
  burstEveryS: intEnv('BENCH_BURST_EVERY_S', 60),
  burstCalls: intEnv('BENCH_BURST_CALLS', 50),
  burstConcurrency: intEnv('BENCH_BURST_CONCURRENCY', 24),
  concurrency: intEnv('BENCH_STREAMS_CONCURRENCY', 16),
  poolSize: intEnv('BENCH_POOL_SIZE', 4)
}

function serverConfig (): Record<string, unknown> {
  const base = knobs.server === 'full'
    ? { transport: 'stdio', ...STDIO_COMMAND }
    : { transport: 'stdio', command: process.execPath, args: [createRequire(import.meta.url).resolve('@modelcontextprotocol/server-everything/dist/index.js'), 'stdio'] }
  return { ...base, sessions: 'pooled', poolSize: knobs.poolSize, maxSessions: 100_000 }
}

const echoCall = (id: number): string => JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: knobs.server === 'full' ? { text: `b${id}` } : { message: `b${id}` } } })

const callAgent = new Agent({ keepAlive: true, maxSockets: 64 })

/** One tools/call on a session; resolves with the HTTP status and whether an answer came back. */
async function callOnce (session: RawSession, id: number): Promise<{ status: number, answered: boolean }> {
  return await new Promise(resolve => {
    const body = echoCall(id)
    const req = request(session.url, {
      method: 'POST',
      agent: callAgent,
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version, 'content-length': String(Buffer.byteLength(body)) }
    }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { text += chunk })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, answered: text.includes('"result"') }) })
      res.on('error', () => { resolve({ status: res.statusCode ?? 0, answered: false }) })
    })
    req.on('error', () => { resolve({ status: -1, answered: false }) })
    // A whole-call deadline (an SSE answer's keep-alives keep the socket from ever being idle).
    const timer = setTimeout(() => { req.destroy(); resolve({ status: -2, answered: false }) }, 120_000)
    req.on('close', () => { clearTimeout(timer) })
    req.end(body)
  })
}

interface PassFigures { count: number, meanMs: number, maxBucketMs: number | null }

/** The upkeep histogram's figures per pass: count, mean, and the smallest bucket every pass fits. */
async function upkeepFigures (gateway: GatewayProcess): Promise<Record<string, PassFigures>> {
  const text = await (await fetch(`${gateway.url}/metrics`)).text()
  const out: Record<string, PassFigures> = {}
  const buckets = new Map<string, Array<[number, number]>>()
  for (const m of text.matchAll(/^mcpgw_upkeep_pass_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$/gm)) {
    const pass = /pass="([^"]+)"/.exec(m[2] ?? '')?.[1] ?? '?'
    const value = Number(m[3])
    const figures = out[pass] ??= { count: 0, meanMs: 0, maxBucketMs: null }
    if (m[1] === 'count') figures.count = value
    else if (m[1] === 'sum') figures.meanMs = value * 1000
    else {
      const le = /le="([^"]+)"/.exec(m[2] ?? '')?.[1] ?? '+Inf'
      const list = buckets.get(pass) ?? []
      list.push([le === '+Inf' ? Infinity : Number(le) * 1000, value])
      buckets.set(pass, list)
    }
  }
  for (const [pass, figures] of Object.entries(out)) {
    figures.meanMs = figures.count === 0 ? 0 : round(figures.meanMs / figures.count, 2)
    const fits = (buckets.get(pass) ?? []).sort((a, b) => a[0] - b[0]).find(([, n]) => n >= figures.count)
    figures.maxBucketMs = fits === undefined || !Number.isFinite(fits[0]) ? null : fits[0]
  }
  return out
}

/** The gateway's own lines about streams it ended, by reason and why. */
function endedLines (gateway: GatewayProcess): Record<string, number> {
  const counts: Record<string, number> = {}
  let text = ''
  try { text = readFileSync(gateway.logFile, 'utf8') } catch { return counts }
  for (const line of text.split('\n')) {
    if (!line.includes('"client stream ended"')) continue
    try {
      const entry = JSON.parse(line) as { reason?: string, why?: string, stream?: string }
      const key = `${entry.stream === 'get' ? 'get' : 'other'} ${entry.reason ?? '?'}: ${entry.why ?? '?'}`
      counts[key] = (counts[key] ?? 0) + 1
    } catch { /* not JSON */ }
  }
  return counts
}

const mib = (kib: number): string => fmt(kib / 1024, 1)

/** The run in progress: stopped on SIGINT/SIGTERM, so no gateway, child or redis-server outlives it. */
let current: Cleanup | undefined
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    log(`${signal}: stopping everything started`)
    void (current?.runAll() ?? Promise.resolve()).finally(() => process.exit(130))
  })
}

async function runMode (mode: 'memory' | 'redis'): Promise<Record<string, unknown>> {
  const cleanup = current = new Cleanup()
  const open = new Set<RawSession>()
  const dir = await mkdtemp(join(tmpdir(), `bench-held-streams-${mode}-`))
  try {
    let redis: Record<string, unknown> = {}
    if (mode === 'redis') {
      const server = await startRedisServer(cleanup)
      redis = { redis: { url: server.url, keyPrefix: `bench${Date.now().toString(36)}` } }
    }
    const config = { log: { level: 'info' }, ...redis, servers: { bench: serverConfig() } }
    const gateway = await startGatewayProcess(cleanup, dir, `held-${mode}`, config)
    const url = `${gateway.url}${GATEWAY_PATH}`
    const fits = streamsThatFit(knobs.streams, gateway.pid, FD_MARGIN, 'npm run bench:held-streams raises it to the hard limit')
    if (fits.limitedBy !== null) log(`only ${fits.count} streams fit: ${fits.limitedBy}`)
    let dropped = 0
    let droppedAt: number[] = []
    const rampStart = Date.now()
    log(`${mode}: opening ${fits.count} sessions with GET streams, ${knobs.concurrency} at a time`)
    const opened = await openMany(url, fits.count, knobs.concurrency, () => { dropped++; droppedAt.push(Date.now()) }, open)
    const rampS = (Date.now() - rampStart) / 1000
    log(`${mode}: ${open.size} open after ${rampS.toFixed(1)} s (${opened.failed} failed${opened.firstError === null ? '' : `: ${opened.firstError}`}); holding ${knobs.durationS} s`)
    const sessions = [...open]
    const holdStart = Date.now()
    const end = holdStart + knobs.durationS * 1000
    let nextBurst = holdStart + 5_000
    let callId = 1
    let calls = 0
    let callsFailed = 0
    let bursts = 0
    let maxRssKiB = 0
    let maxChildren = 0
    let maxLoad = 0
    const loads: number[] = []
    while (Date.now() < end) {
      if (Date.now() >= nextBurst && sessions.length > 0) {
        nextBurst += knobs.burstEveryS * 1000
        bursts++
        const picks = Array.from({ length: knobs.burstCalls }, () => sessions[Math.floor(Math.random() * sessions.length)]!)
        const results = await mapLimit(picks, knobs.burstConcurrency, async session => await callOnce(session, callId++))
        calls += results.length
        callsFailed += results.filter(r => r.status !== 200 || !r.answered).length
      }
      const pids = childrenOf(gateway.pid)
      maxChildren = Math.max(maxChildren, pids.length)
      maxRssKiB = Math.max(maxRssKiB, rssKiB(gateway.pid) ?? 0)
      const load = loadavg()[0] ?? 0
      loads.push(load)
      maxLoad = Math.max(maxLoad, load)
      if (loads.length % 60 === 0) log(`${mode}: ${Math.round((Date.now() - holdStart) / 1000)} s, ${open.size - dropped} streams open, ${dropped} ended by the gateway, ${bursts} bursts, RSS ${mib(rssKiB(gateway.pid) ?? NaN)} MiB, ${pids.length} children, load ${load.toFixed(1)}`)
      await sleep(1000)
    }
    const upkeep = await upkeepFigures(gateway)
    const rssHeldKiB = rssKiB(gateway.pid) ?? NaN
    const endedByGateway = endedLines(gateway)
    const firstDropS = droppedAt.length === 0 ? null : round((droppedAt[0]! - rampStart) / 1000, 1)
    droppedAt = []
    log(`${mode}: closing ${open.size} sessions`)
    await mapLimit([...open], knobs.concurrency * 2, closeRawSession)
    open.clear()
    await cleanup.runAll()
    const figures = {
      mode,
      server: knobs.server,
      streams: sessions.length,
      requested: knobs.streams,
      rampS: round(rampS, 1),
      openFailed: opened.failed,
      heldS: round((end - holdStart) / 1000),
      endedByGateway: dropped,
      firstEndedAfterS: firstDropS,
      gatewayLinesAboutEndedStreams: endedByGateway,
      bursts,
      calls,
      callsFailed,
      upkeepPasses: upkeep,
      gatewayRssMiB: { held: round(rssHeldKiB / 1024, 1), max: round(maxRssKiB / 1024, 1) },
      maxChildren,
      load: { mean: round(loads.reduce((a, b) => a + b, 0) / Math.max(1, loads.length), 2), max: round(maxLoad, 2), cpus: cpus().length }
    }
    process.stdout.write([
      `${mode} (${knobs.server}, pooled, poolSize ${knobs.poolSize})`,
      `  streams held           ${sessions.length} of ${knobs.streams} (${opened.failed} failed to open), ramp ${rampS.toFixed(1)} s, held ${knobs.durationS} s`,
      `  ended by the gateway   ${dropped} (goal 0)${firstDropS === null ? '' : `, the first ${firstDropS} s after the ramp began`}`,
      `  gateway's own lines    ${JSON.stringify(endedByGateway)}`,
      `  bursts                 ${bursts} of ${knobs.burstCalls} calls (${knobs.burstConcurrency} at a time): ${calls} calls, ${callsFailed} failed; at most ${maxChildren} children`,
      ...Object.entries(upkeep).map(([pass, f]) => `  upkeep ${pass.padEnd(15)} ${f.count} passes, mean ${fmt(f.meanMs)} ms, all within ${f.maxBucketMs === null ? 'over 30 s' : `${f.maxBucketMs} ms`}`),
      `  gateway RSS            ${fmt(figures.gatewayRssMiB.held, 1)} MiB at the end, ${fmt(figures.gatewayRssMiB.max, 1)} MiB at most`,
      `  machine load           mean ${fmt(figures.load.mean)}, max ${fmt(figures.load.max)} (${cpus().length} CPUs)`,
      ''
    ].join('\n'))
    return figures
  } finally {
    await mapLimit([...open], knobs.concurrency * 2, closeRawSession)
    await cleanup.runAll()
    if (process.env.BENCH_KEEP_LOGS === undefined) await rm(dir, { recursive: true, force: true })
    else log(`${mode}: the gateway's config and log are kept in ${dir}`)
  }
}

async function main (): Promise<void> {
  const started = new Date()
  const results: Array<Record<string, unknown>> = []
  for (const mode of knobs.modes as Array<'memory' | 'redis'>) results.push(await runMode(mode))
  const out = process.env.BENCH_OUT ?? join(REPO, 'bench', 'results', `${started.toISOString().slice(0, 10)}-held-streams.json`)
  mkdirSync(dirname(out), { recursive: true })
  writeFileSync(out, `${JSON.stringify({ started: started.toISOString(), knobs, results }, null, 2)}\n`)
  log(`results in ${out}`)
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
