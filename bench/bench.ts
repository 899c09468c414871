// Gateway benchmark: every figure is a ratio to a floor measured in the same run, a
// deliberately minimal proxy (bench/minimal-proxy.ts), with all targets up at once and their
// calls interleaved, because a fresh process per target swings ±30 % on a shared machine.
// Figures only; nothing is asserted. See bench/README.md.
//
//   npm run bench                  (builds, then node dist/bench/bench.js)
//   BENCH_QUICK=1 npm run bench    (smoke run, about a minute)
//
// Targets (bench/targets.ts), each driven by the official SDK client calling `echo`:
//   floor                 minimal proxy (node:http, one stdio child per session, JSON answers)
//   floor-b               a second minimal proxy: its ratio to the floor is this run's noise
//   direct                SDK stdio client straight to the fixture, for reference
//   gateway-memory        gateway, shipped defaults (SSE responses, info logging), memory mode
//   gateway-redis-local   gateway in Redis mode, one replica
//   gateway-redis-cross   two replicas on one Redis: initialize on A, everything after on B
//   direct-http           SDK Streamable HTTP upstream (bench/http-upstream.ts), for reference
//   gateway-http-backend  gateway in front of that upstream; compared with direct-http
//   gateway-redis-http    the same in Redis mode, one replica; compared with direct-http
//   <name>@compare        gateway-memory, gateway-redis-local, -cross and -http from BENCH_COMPARE_MAIN
// Phases (bench/measure.ts, bench/idle.ts):
//   seq         one session per target; rounds of shuffled blocks of sequential calls
//   throughput  SESSIONS sessions x CALLS calls at once, targets in shuffled order per round;
//               calls/s and CPU per call of the serving process(es) from /proc
//   idle        gateway heap per idle session (initialize, initialized, open GET), stdio and
//               HTTP backends, after a forced GC
//   streams     STREAMS idle GET streams on one replica, HTTP backend: RSS, event-loop stalls
//
// Knobs (env; defaults in brackets, BENCH_QUICK=1 values after the slash):
//   BENCH_SEQ [1000/60]            sequential calls per target, split over BENCH_ROUNDS
//   BENCH_ROUNDS [100/6]           sequential rounds (blocks of SEQ/ROUNDS calls per target)
//   BENCH_WARMUP [4000/100]        sequential warm-up calls per target (until V8 has compiled the hot paths)
//   BENCH_TP_WARMUP [1/0]          untimed throughput passes per target before the timed rounds
//   BENCH_TP_ROUNDS [4/1]          throughput rounds
//   BENCH_SESSIONS [50/5]          throughput sessions per target
//   BENCH_CALLS [100/20]           throughput calls per session
//   BENCH_CONNECT_CONCURRENCY [8]  sessions opened at once (stdio children start meanwhile)
//   BENCH_IDLE [200/20]            idle sessions per backend (stdio capped by free memory)
//   BENCH_STREAMS [10000/300]      idle GET streams; capped, with the reason printed, by file
//                                  descriptors and local ports (see bench/README.md)
//   BENCH_STREAMS_HOLD_S [35/3]    hold time: > 2 keep-alive intervals (15 s) of the gateway
//   BENCH_STREAMS_CONCURRENCY [16] streams opened at once during the ramp
//   BENCH_STREAMS_UPSTREAM [get,no-get]  upstream variants: holding a GET stream per session, or 405
//   BENCH_TARGETS [all]            comma list of targets to run (the floor is always added)
//   BENCH_PHASES [seq,throughput,idle,streams]
//   BENCH_COMPARE_MAIN             absolute path of another build's dist/src/main.js
//   BENCH_LOG_LEVEL                gateway log level (default: the shipped default, info)
//   BENCH_GATEWAY_NODE_ARGS        extra node flags for every gateway (`--cpu-prof --cpu-prof-dir=DIR` profiles them)
//   BENCH_OUT                      results file (default bench/results/<date>.json)
// The table goes to stdout, progress to stderr. Everything started (redis-server on a free port,
// gateway processes, upstreams, the proxy, stdio children) is stopped at the end, on error and
// on SIGINT.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { cpus, loadavg, tmpdir, totalmem } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { runIdle, runStreams, streamsFit, type IdleResult, type StreamsResult } from './idle.js'
import { runSequential, runThroughput, type SequentialResult, type ThroughputResult } from './measure.js'
import {
  Cleanup, gitCommit, log, memAvailableKiB, startGatewayProcess, startHttpUpstream, startIdleUpstream, startLoopControl, startRedisServer, type RunningProcess
} from './procs.js'
import { report, type RunHeader, type TargetResult } from './report.js'
import { openSessions } from './sessions.js'
import { round } from './stats.js'
import { baseGatewayConfig, FLOOR, GATEWAY_PATH, httpServer, stdioServer, targetSpecs, type Target, type TargetContext } from './targets.js'

const REPO = fileURLToPath(new URL('../../', import.meta.url))
const PHASES = ['seq', 'throughput', 'idle', 'streams'] as const
const UPSTREAM_VARIANTS = ['get', 'no-get'] as const
/** A stdio child of the fixture: ~70 MB RSS, ~27 MB PSS; idle-stdio keeps its count within half of free memory. */
const CHILD_ESTIMATE_KIB = 40 * 1024

const quick = process.env.BENCH_QUICK === '1'

/** Like intEnv, and 0 is allowed. */
function intEnvOrZero (name: string, fallback: number, quickFallback = fallback): number {
  return process.env[name] === '0' ? 0 : intEnv(name, fallback, quickFallback)
}

function intEnv (name: string, fallback: number, quickFallback = fallback): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return quick ? quickFallback : fallback
  const n = Number(raw)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${raw}`)
  return n
}

function listEnv<T extends string> (name: string, known: readonly T[], fallback: readonly T[]): T[] {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return [...fallback]
  const list = raw.split(',').map(s => s.trim()).filter(s => s !== '')
  for (const item of list) {
    if (!(known as readonly string[]).includes(item)) throw new Error(`${name}: unknown ${item}; known: ${known.join(', ')}`)
  }
  return list as T[]
}

const compareMain = process.env.BENCH_COMPARE_MAIN === undefined || process.env.BENCH_COMPARE_MAIN === '' ? undefined : process.env.BENCH_COMPARE_MAIN
if (compareMain !== undefined && !existsSync(compareMain)) throw new Error(`BENCH_COMPARE_MAIN: ${compareMain} does not exist`)
const specs = targetSpecs(compareMain)
const seq = intEnv('BENCH_SEQ', 1000, 60)
const rounds = intEnv('BENCH_ROUNDS', 100, 6)

const knobs = {
  quick,
  warmup: intEnv('BENCH_WARMUP', 4000, 100),
  tpWarmup: intEnvOrZero('BENCH_TP_WARMUP', 1, 0),
  rounds,
  block: Math.ceil(seq / rounds),
  tpRounds: intEnv('BENCH_TP_ROUNDS', 4, 1),
  sessions: intEnv('BENCH_SESSIONS', 50, 5),
  calls: intEnv('BENCH_CALLS', 100, 20),
  connectConcurrency: intEnv('BENCH_CONNECT_CONCURRENCY', 8),
  idle: intEnv('BENCH_IDLE', 200, 20),
  streams: intEnv('BENCH_STREAMS', 10_000, 300),
  streamsHoldS: intEnv('BENCH_STREAMS_HOLD_S', 35, 3),
  streamsConcurrency: intEnv('BENCH_STREAMS_CONCURRENCY', 16),
  streamsUpstream: listEnv('BENCH_STREAMS_UPSTREAM', UPSTREAM_VARIANTS, UPSTREAM_VARIANTS),
  targets: [...new Set([FLOOR, ...listEnv('BENCH_TARGETS', specs.map(s => s.name), specs.map(s => s.name))])],
  phases: listEnv('BENCH_PHASES', PHASES, PHASES),
  compareMain: compareMain ?? null,
  logLevel: process.env.BENCH_LOG_LEVEL === '' ? undefined : process.env.BENCH_LOG_LEVEL
}

function sdkVersion (): string | null {
  try {
    return (JSON.parse(readFileSync(join(REPO, 'node_modules/@modelcontextprotocol/sdk/package.json'), 'utf8')) as { version: string }).version
  } catch {
    return null
  }
}

const cleanup = new Cleanup()
let interrupted = false
process.on('SIGINT', () => {
  if (interrupted) process.exit(130)
  interrupted = true
  log('interrupted: stopping everything (Ctrl-C again to leave at once)')
  void cleanup.runAll().finally(() => process.exit(130))
})

/** Starts every selected target; they share one Redis and one HTTP upstream, stopped with them. */
async function startTargets (targetsCleanup: Cleanup, dir: string): Promise<Target[]> {
  let redis: Promise<RunningProcess> | undefined
  let upstream: Promise<RunningProcess> | undefined
  const ctx: TargetContext = {
    cleanup: targetsCleanup,
    dir,
    logLevel: knobs.logLevel,
    redis: async () => await (redis ??= startRedisServer(targetsCleanup)),
    httpUpstream: async () => await (upstream ??= startHttpUpstream(targetsCleanup))
  }
  const targets: Target[] = []
  for (const spec of specs) {
    if (knobs.targets.includes(spec.name)) targets.push(await spec.start(ctx))
  }
  return targets
}

async function idlePhase (dir: string): Promise<IdleResult[]> {
  const results: IdleResult[] = []
  const room = Math.floor(memAvailableKiB() / 2 / CHILD_ESTIMATE_KIB)
  const stdioCount = Math.max(1, Math.min(knobs.idle, room))
  if (stdioCount < knobs.idle) log(`idle-stdio: only ${stdioCount} sessions fit in half of the free memory (~40 MB per child); BENCH_IDLE was ${knobs.idle}`)
  const stdioGateway = await startGatewayProcess(cleanup, dir, 'idle-stdio', baseGatewayConfig(knobs.logLevel, stdioServer()), { gcProbe: true })
  try {
    results.push(await runIdle('idle-stdio', stdioGateway, `${stdioGateway.url}${GATEWAY_PATH}`, stdioCount, knobs.connectConcurrency, true))
  } finally {
    await stdioGateway.stop()
  }
  const upstream = await startHttpUpstream(cleanup)
  try {
    const httpGateway = await startGatewayProcess(cleanup, dir, 'idle-http', baseGatewayConfig(knobs.logLevel, httpServer(upstream.url)), { gcProbe: true })
    try {
      results.push(await runIdle('idle-http', httpGateway, `${httpGateway.url}${GATEWAY_PATH}`, knobs.idle, knobs.connectConcurrency, false))
    } finally {
      await httpGateway.stop()
    }
  } finally {
    await upstream.stop()
  }
  return results
}

async function streamsPhase (dir: string): Promise<StreamsResult[]> {
  const results: StreamsResult[] = []
  for (const variant of knobs.streamsUpstream) {
    const name = `streams-upstream-${variant}`
    const upstreamGet = variant === 'get'
    const upstream = await startIdleUpstream(cleanup, upstreamGet)
    try {
      const config = baseGatewayConfig(knobs.logLevel, httpServer(upstream.url))
      const gateway = await startGatewayProcess(cleanup, dir, name, config, { gcProbe: true, loopProbe: true })
      const control = startLoopControl(cleanup, dir, name)
      try {
        const fit = streamsFit(knobs.streams, gateway.pid, upstream.pid, upstreamGet)
        if (fit.limitedBy !== null) log(`${name}: ${knobs.streams} streams do not fit, running ${fit.count}: ${fit.limitedBy}`)
        results.push(await runStreams(name, gateway, control, `${gateway.url}${GATEWAY_PATH}`, fit, knobs.streams, upstreamGet, {
          count: knobs.streams, concurrency: knobs.streamsConcurrency, holdS: knobs.streamsHoldS
        }))
      } finally {
        await control.stop()
        await gateway.stop()
      }
    } finally {
      await upstream.stop()
    }
  }
  return results
}

async function main (): Promise<void> {
  const started = Date.now()
  const loadStart = loadavg()
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-bench-'))
  let ok = false
  cleanup.add('bench sessions', async () => {
    await Promise.allSettled([...openSessions].map(async s => { await s.close() }))
  })
  log(`knobs ${JSON.stringify(knobs)}; gateway logs in ${dir}`)
  const results: TargetResult[] = []
  let idle: IdleResult[] = []
  let streams: StreamsResult[] = []
  try {
    if (knobs.phases.includes('seq') || knobs.phases.includes('throughput')) {
      const targetsCleanup = new Cleanup()
      const stopTargets = cleanup.add('targets', async () => { await targetsCleanup.runAll() })
      const targets = await startTargets(targetsCleanup, dir)
      let sequential = new Map<string, SequentialResult>()
      let throughput = new Map<string, ThroughputResult>()
      if (knobs.phases.includes('seq')) sequential = await runSequential(targets, knobs)
      if (knobs.phases.includes('throughput')) {
        throughput = await runThroughput(targets, { rounds: knobs.tpRounds, warmupRounds: knobs.tpWarmup, sessions: knobs.sessions, calls: knobs.calls, connectConcurrency: knobs.connectConcurrency })
      }
      for (const t of targets) {
        results.push({
          name: t.name,
          compareTo: t.compareTo,
          goals: t.goals,
          sequential: sequential.get(t.name) ?? null,
          throughput: throughput.get(t.name) ?? null,
          ...(t.requestsTo === undefined ? {} : { requestsTo: { ...t.requestsTo } })
        })
      }
      // The memory phases run alone: the latency targets and their children would only add noise.
      await stopTargets()
    }
    if (knobs.phases.includes('idle')) idle = await idlePhase(dir)
    if (knobs.phases.includes('streams')) streams = await streamsPhase(dir)
    ok = true
  } finally {
    await cleanup.runAll()
    if (ok) await rm(dir, { recursive: true, force: true })
    else log(`gateway logs kept in ${dir}`)
  }

  const header: RunHeader = {
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? '?',
    node: process.version,
    gitCommit: gitCommit(REPO),
    compareMain: compareMain ?? null,
    compareCommit: compareMain === undefined ? null : gitCommit(dirname(compareMain)),
    loadStart,
    loadEnd: loadavg(),
    knobs
  }
  const text = report(header, results, idle, streams)
  process.stdout.write(`${text}\n`)
  const date = new Date(started).toISOString().slice(0, 10)
  const out = process.env.BENCH_OUT ?? join(REPO, 'bench', 'results', `${date}.json`)
  mkdirSync(dirname(out), { recursive: true })
  const roundAll = (value: unknown): unknown => JSON.parse(JSON.stringify(value, (_k, v: unknown) => typeof v === 'number' ? round(v) : v))
  writeFileSync(out, `${JSON.stringify({
    date: new Date(started).toISOString(),
    durationS: round((Date.now() - started) / 1000, 1),
    machine: {
      cpus: header.cpus,
      cpuModel: header.cpuModel,
      memTotalMiB: Math.round(totalmem() / 1024 / 1024),
      node: header.node,
      loadavgStart: loadStart.map(n => round(n, 2)),
      loadavgEnd: header.loadEnd.map(n => round(n, 2))
    },
    sdkVersion: sdkVersion(),
    gitCommit: header.gitCommit,
    compareMain: header.compareMain,
    compareCommit: header.compareCommit,
    knobs,
    targets: roundAll(results),
    idle: roundAll(idle),
    streams: roundAll(streams),
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
