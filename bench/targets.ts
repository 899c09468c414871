// What the benchmark measures, as data: each target is a name, how to start it, what it is
// compared with (the floor unless said otherwise) and the goals for that comparison.
// All targets are started before any measurement and stay up to the end, so every round of
// every phase visits the same processes (a fresh process per target swings ±30 %).
//
// Adding a target is one entry in targetSpecs(), usually gatewayTarget() with config overrides:
//   gatewayTarget('gateway-json', { config: { http: { responseMode: 'json' } } })
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import {
  childrenOf, startFastifyFloor, startGatewayProcess, startMinimalProxy, type Cleanup, type GatewayProcess, type RunningProcess
} from './procs.js'
import { connectHttp, connectModern, connectStdio, crossFetch, HTTP_ECHO, STDIO_ECHO, type BenchSession, type Echo } from './sessions.js'

export const FIXTURE = fileURLToPath(new URL('../test/fixtures/full-server.js', import.meta.url))
/** The stdio backend every stdio target runs: the floor's child, the gateway's and direct's. */
export const STDIO_COMMAND = { command: process.execPath, args: [FIXTURE] }
export const FLOOR = 'floor'

/** The goals, as ratios to the target's comparison (see README.md in this folder). */
export interface Goals {
  /** Sequential tools/call p50: at most this many times the comparison's. */
  seqP50Max?: number
  /** Throughput: at least this fraction of the comparison's calls/s. */
  callsPerSecMin?: number
  /** CPU of the serving process(es) per call: at most this many times the comparison's. */
  cpuPerCallMax?: number
}

/** A started target, as the phases use it. */
export interface Target {
  name: string
  /** The target its figures are divided by; null for the floor itself. */
  compareTo: string | null
  goals: Goals
  echo: Echo
  connect: () => Promise<BenchSession>
  /** The processes serving the calls (proxy, gateway replicas): their CPU is the compared figure. */
  servingPids: number[]
  /** Processes behind them, whose CPU is reported apart: the stdio children or the HTTP upstream. */
  backendPids: () => number[]
  redisPid: number | null
  /** gateway-redis-cross: requests sent to each replica (A should see only the initializes). */
  requestsTo?: { a: number, b: number }
}

/** Shared things targets may need, each started on first use and stopped by the cleanup. */
export interface TargetContext {
  cleanup: Cleanup
  /** Gateway configs and logs. */
  dir: string
  /** Gateway log level; undefined leaves the shipped default (info). */
  logLevel: string | undefined
  redis: () => Promise<RunningProcess>
  httpUpstream: () => Promise<RunningProcess>
}

export interface TargetSpec {
  name: string
  start: (ctx: TargetContext) => Promise<Target>
}

type Json = Record<string, unknown>
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v)

/** Plain-object deep merge: overrides win; arrays and scalars replace. */
export function mergeConfig (base: Json, overrides: Json): Json {
  const out: Json = { ...base }
  for (const [key, value] of Object.entries(overrides)) {
    const prev = out[key]
    out[key] = isObject(prev) && isObject(value) ? mergeConfig(prev, value) : value
  }
  return out
}

/** The gateway config every gateway target starts from: one server, shipped defaults otherwise. */
export function baseGatewayConfig (logLevel: string | undefined, server: Json): Json {
  return { ...(logLevel === undefined ? {} : { log: { level: logLevel } }), servers: { bench: server } }
}

export const stdioServer = (): Json => ({ transport: 'stdio', ...STDIO_COMMAND, maxSessions: 100_000 })
export const httpServer = (url: string): Json => ({ transport: 'streamable-http', url, maxSessions: 100_000 })
export const GATEWAY_PATH = '/mcp/bench'

export interface GatewayTargetOptions {
  backend?: 'stdio' | 'http'
  /** local: one replica in Redis mode; cross: initialize on replica A, everything after on B. */
  redis?: 'local' | 'cross'
  /** Deep-merged over the base config (see mergeConfig). */
  config?: Json
  /** Another build's dist/src/main.js. */
  main?: string
  compareTo?: string
  goals?: Goals
  /** Drive it with the v2 SDK client pinned to 2026-07-28 (stateless requests, pooled backend). */
  modern?: boolean
}

export function gatewayTarget (name: string, options: GatewayTargetOptions = {}): TargetSpec {
  return {
    name,
    start: async ctx => {
      const http = options.backend === 'http' ? await ctx.httpUpstream() : null
      let config = baseGatewayConfig(ctx.logLevel, http === null ? stdioServer() : httpServer(http.url))
      let redisPid: number | null = null
      if (options.redis !== undefined) {
        const redis = await ctx.redis()
        redisPid = redis.pid
        config = { ...config, redis: { url: redis.url, keyPrefix: `bench-${randomBytes(4).toString('hex')}` } }
      }
      config = mergeConfig(config, options.config ?? {})
      const start = async (suffix: string): Promise<GatewayProcess> =>
        await startGatewayProcess(ctx.cleanup, ctx.dir, `${name}${suffix}`, config, options.main === undefined ? {} : { main: options.main })
      const replicas = options.redis === 'cross' ? await Promise.all([start('-A'), start('-B')]) : [await start('')]
      const modern = options.modern === true
      const [a, b] = replicas as [GatewayProcess, GatewayProcess | undefined]
      const counts = { a: 0, b: 0 }
      const servingPids = replicas.map(r => r.pid)
      return {
        name,
        compareTo: options.compareTo ?? FLOOR,
        goals: options.goals ?? {},
        echo: http === null ? STDIO_ECHO : HTTP_ECHO,
        connect: modern
          ? async () => await connectModern(`${a.url}${GATEWAY_PATH}`)
          : b === undefined
          ? async () => await connectHttp(`${a.url}${GATEWAY_PATH}`)
          : async () => await connectHttp(`${a.url}${GATEWAY_PATH}`, crossFetch(b.url, counts)),
        servingPids,
        backendPids: http === null ? () => servingPids.flatMap(childrenOf) : () => [http.pid],
        redisPid,
        ...(b === undefined ? {} : { requestsTo: counts })
      }
    }
  }
}

/**
 * The minimal proxy; a second one (`floor-b`) shows how far two identical targets drift apart in
 * this run. `fastify`: the same logic behind Fastify (`fastify-floor`, for reference).
 */
function floorTarget (name: string, fastify = false): TargetSpec {
  return {
    name,
    start: async ctx => {
      const proxy = await (fastify ? startFastifyFloor : startMinimalProxy)(ctx.cleanup, STDIO_COMMAND.command, STDIO_COMMAND.args)
      return {
        name,
        compareTo: name === FLOOR ? null : FLOOR,
        goals: {},
        echo: STDIO_ECHO,
        connect: async () => await connectHttp(proxy.url),
        servingPids: [proxy.pid],
        backendPids: () => childrenOf(proxy.pid),
        redisPid: null
      }
    }
  }
}

/** For reference: what the stdio server costs with no HTTP hop at all. */
const directTarget: TargetSpec = {
  name: 'direct',
  start: async () => {
    const children = new Set<number>()
    return {
      name: 'direct',
      compareTo: FLOOR,
      goals: {},
      echo: STDIO_ECHO,
      connect: async () => await connectStdio(STDIO_COMMAND.command, STDIO_COMMAND.args, children),
      servingPids: [],
      backendPids: () => [...children],
      redisPid: null
    }
  }
}

/** The SDK's own Streamable HTTP server, the comparison for the gateway's HTTP backend. */
const directHttpTarget: TargetSpec = {
  name: 'direct-http',
  start: async ctx => {
    const upstream = await ctx.httpUpstream()
    return {
      name: 'direct-http',
      compareTo: FLOOR,
      goals: {},
      echo: HTTP_ECHO,
      connect: async () => await connectHttp(upstream.url),
      servingPids: [],
      backendPids: () => [upstream.pid],
      redisPid: null
    }
  }
}

const MEMORY_GOALS: Goals = { seqP50Max: 1.15, callsPerSecMin: 0.95, cpuPerCallMax: 1.2 }
const REDIS_LOCAL_GOALS: Goals = { seqP50Max: 1.3 }
const REDIS_CROSS_GOALS: Goals = { seqP50Max: 1.5 }

/** Every target, in report order; compareMain adds the same gateways from another build. */
export function targetSpecs (compareMain: string | undefined): TargetSpec[] {
  const specs = [
    floorTarget(FLOOR),
    floorTarget('floor-b'),
    // The floor behind Fastify: how much of the gateway's ratio the framework takes by itself.
    floorTarget('fastify-floor', true),
    directTarget,
    gatewayTarget('gateway-memory', { goals: MEMORY_GOALS }),
    gatewayTarget('gateway-redis-local', { redis: 'local', goals: REDIS_LOCAL_GOALS }),
    gatewayTarget('gateway-redis-cross', { redis: 'cross', goals: REDIS_CROSS_GOALS }),
    // The same gateway with an optional feature off: the report divides on by off (FEATURE_COSTS).
    gatewayTarget('gateway-no-metrics', { config: { metrics: { enabled: false } } }),
    // The default with one of the hot path's savings undone: every POST answered as an SSE stream
    // at once (no lazy JSON), and one write(2) per log line (no buffer).
    gatewayTarget('gateway-eager-sse', { config: { http: { lazySseMs: 0 } } }),
    gatewayTarget('gateway-log-sync', { config: { log: { flushMs: 0 } } }),
    directHttpTarget,
    gatewayTarget('gateway-http-backend', { backend: 'http', compareTo: 'direct-http' }),
    // Redis, one replica, the same HTTP backend: what the store adds to a direct session's call.
    gatewayTarget('gateway-redis-http', { backend: 'http', redis: 'local', compareTo: 'direct-http' }),
    // 2026-07-28 requests through the pool, next to the 2025 session path of the same build.
    gatewayTarget('gateway-modern', { modern: true, compareTo: 'gateway-memory', goals: { seqP50Max: 1.2 } })
  ]
  if (compareMain !== undefined) {
    specs.push(
      gatewayTarget(`gateway-memory${COMPARE_SUFFIX}`, { main: compareMain, goals: MEMORY_GOALS }),
      gatewayTarget(`gateway-redis-local${COMPARE_SUFFIX}`, { redis: 'local', main: compareMain, goals: REDIS_LOCAL_GOALS }),
      gatewayTarget(`gateway-redis-cross${COMPARE_SUFFIX}`, { redis: 'cross', main: compareMain, goals: REDIS_CROSS_GOALS }),
      gatewayTarget(`gateway-redis-http${COMPARE_SUFFIX}`, { backend: 'http', redis: 'local', main: compareMain, compareTo: 'direct-http' })
    )
  }
  return specs
}

/**
 * What an optional feature costs, from two targets run interleaved in the same run: the one with
 * the feature on over the one with it off (metrics on cost at most 3 % of sequential p50).
 */
export interface FeatureCost {
  feature: string
  on: string
  off: string
  seqP50Max: number
}
export const FEATURE_COSTS: FeatureCost[] = [
  { feature: 'metrics', on: 'gateway-memory', off: 'gateway-no-metrics', seqP50Max: 1.03 }
]

/** The suffix of targets started from BENCH_COMPARE_MAIN; the report pairs them with their twin. */
export const COMPARE_SUFFIX = '@compare'
