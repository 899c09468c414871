// The only place services are built and plugins registered, in order (STYLE.md habit 4).
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance } from 'fastify'
import type { Logger } from 'pino'
import { httpBackendFactory } from './backends/http.js'
import { openStdioBackend } from './backends/stdio.js'
import { MemoryBus, MemoryBusHub } from './state/bus-memory.js'
import type { Bus } from './state/bus.js'
import type { Config } from './config/schema.js'
import {
  GW_ERR_INTERNAL, GW_ERR_PAYLOAD_TOO_LARGE, GW_ERR_PARSE, GW_ERR_UNSUPPORTED_MEDIA_TYPE, GW_ERR_BAD_REQUEST,
  isGatewayError, toJsonRpcError, type GatewayError
} from './core/errors.js'
import { MemoryEventLog } from './state/event-log-memory.js'
import type { EventLog } from './state/event-log.js'
import { registerJsonParser } from './http/request.js'
import httpGuard from './http/guard.js'
import httpLegacySse from './http/legacy-sse.js'
import httpOps from './http/ops.js'
import httpStreamable from './http/streamable.js'
import { createLogger } from './telemetry/logger.js'
import { newReplicaId } from './core/replica.js'
import { RedisBus } from './state/bus-redis.js'
import { RedisEventLog } from './state/event-log-redis.js'
import { closeRedis, createRedis, redisReady } from './state/redis/client.js'
import { Router } from './routing/router.js'
import { RedisSessionStore } from './state/session-store-redis.js'
import { MemorySessionStore } from './state/session-store-memory.js'
import type { SessionStore } from './state/session-store.js'
import { Supervisor } from './backends/supervisor.js'

export interface GatewayOptions {
  log?: Logger
  replicaId?: string
  /** Memory mode: apps sharing one hub reach each other over the in-process bus (tests). */
  hub?: MemoryBusHub
  /** Memory mode: apps sharing one store and log act as replicas of one gateway (tests). */
  memory?: { store: MemorySessionStore, eventLog: MemoryEventLog }
}

export interface Gateway {
  app: FastifyInstance
  router: Router
  replicaId: string
  /** Starts draining: /readyz answers 503 from now on; requests are still served. */
  drain: () => void
  /** Graceful stop: streams ended with a retry hint, backends stopped, connections closed. */
  close: () => Promise<void>
}

interface Services {
  store: SessionStore
  eventLog: EventLog
  bus: Bus
  close: () => Promise<void>
}

function memoryServices (config: Readonly<Config>, options: GatewayOptions): Services {
  const store = options.memory?.store ?? new MemorySessionStore()
  const eventLog = options.memory?.eventLog ?? new MemoryEventLog(store, config.sessions.eventLogMaxLen)
  const shared = options.memory !== undefined
  return {
    store,
    eventLog,
    bus: new MemoryBus(options.hub ?? new MemoryBusHub()),
    close: async () => { if (!shared) await store.close() }
  }
}

/** Redis mode: every replica shares sessions, logs and inboxes through one Redis. */
async function redisServices (config: Readonly<Config>, log: Logger, replicaId: string): Promise<Services> {
  const settings = config.redis
  if (settings === undefined) throw new Error('redis settings missing')
  const redis = createRedis(settings.url, { log, connectionName: `mcpgw:${replicaId}`, commandTimeoutMs: settings.connectTimeoutMs })
  try {
    await redisReady(redis, settings.connectTimeoutMs)
  } catch (err) {
    closeRedis(redis)
    throw err
  }
  const prefix = settings.keyPrefix
  const bus = new RedisBus(redis, () => createRedis(settings.url, { log, blocking: true, connectionName: `mcpgw:${replicaId}:inbox` }), prefix, {
    inboxTtlMs: settings.leaseMs * 6,
    log
  })
  return {
    store: new RedisSessionStore(redis, prefix),
    eventLog: new RedisEventLog(redis, prefix, config.sessions.eventLogMaxLen),
    bus,
    close: async () => { closeRedis(redis) }
  }
}

/** Maps Fastify's own errors (body parsing, limits) onto the gateway's typed errors. */
function asGatewayError (err: Error & { code?: string, statusCode?: number }, bodyLimit: number): GatewayError {
  if (isGatewayError(err)) return err
  switch (err.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE': return new GW_ERR_PAYLOAD_TOO_LARGE(bodyLimit)
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE': return new GW_ERR_UNSUPPORTED_MEDIA_TYPE('Content-Type must be application/json')
    case 'FST_ERR_CTP_EMPTY_JSON_BODY': return new GW_ERR_PARSE('empty body')
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH': return new GW_ERR_BAD_REQUEST('invalid Content-Length')
  }
  if (err.statusCode !== undefined && err.statusCode >= 400 && err.statusCode < 500) {
    const e: GatewayError = new GW_ERR_BAD_REQUEST(err.message)
    e.statusCode = err.statusCode
    return e
  }
  return new GW_ERR_INTERNAL('unexpected error', { cause: err })
}

export async function buildGateway (config: Readonly<Config>, options: GatewayOptions = {}): Promise<Gateway> {
  const replicaId = options.replicaId ?? newReplicaId()
  const log = options.log ?? createLogger(config.log.level, replicaId)
  const services = config.redis === undefined ? memoryServices(config, options) : await redisServices(config, log, replicaId)
  const supervisor = new Supervisor({
    servers: config.servers,
    log,
    factories: { stdio: openStdioBackend, 'streamable-http': httpBackendFactory, sse: httpBackendFactory }
  })
  const router = new Router({ replicaId, config, store: services.store, eventLog: services.eventLog, bus: services.bus, backends: supervisor, log })

  const app = Fastify({
    loggerInstance: log as FastifyBaseLogger,
    bodyLimit: config.http.bodyLimit,
    exposeHeadRoutes: false,
    // Request lines are logged by the hook below, without query strings (legacy session ids).
    logController: new LogController({ disableRequestLogging: true }),
    return503OnClosing: true,
    // A request body must arrive within this time (slowloris); responses, SSE included, are not limited.
    requestTimeout: 30_000
  })
  registerJsonParser(app)
  app.setErrorHandler((error: FastifyError, req, reply) => {
    const err = asGatewayError(error, config.http.bodyLimit)
    const status = err.statusCode ?? 500
    if (status >= 500 && status !== 503) req.log.error({ err: error }, 'request failed')
    else if (status === 503) req.log.warn({ code: err.code, status }, 'request refused (unavailable)')
    else req.log.info({ code: err.code, status }, 'request rejected')
    if (err.retryAfter !== undefined) reply.header('retry-after', String(err.retryAfter))
    reply.code(status).type('application/json').send(toJsonRpcError(err, req.jsonRpcId ?? null))
  })
  app.setNotFoundHandler((req, reply) => {
    reply.code(404).type('application/json').send({ jsonrpc: '2.0', id: null, error: { code: -32000, message: `Not Found: ${req.method} ${req.url.split('?')[0] ?? ''}`, data: { source: 'gateway' } } })
  })
  app.addHook('onResponse', async (req, reply) => {
    req.log.info({ method: req.method, route: req.routeOptions.url, status: reply.statusCode, ms: Math.round(reply.elapsedTime) }, 'request')
  })

  await app.register(httpGuard, { config })
  let draining = false
  await app.register(httpOps, { router, store: services.store, draining: () => draining })
  await app.register(httpStreamable, { config, router })
  await app.register(httpLegacySse, { config, router })

  // SSE responses end in preClose, before Fastify waits for open requests (STYLE.md habit 8).
  app.addHook('preClose', async () => { await router.stop() })
  app.addHook('onClose', async () => { await services.close() })

  await router.start()
  log.info({ servers: Object.keys(config.servers), store: config.redis === undefined ? 'memory' : 'redis' }, 'gateway built')
  return { app, router, replicaId, drain: () => { draining = true }, close: async () => { await app.close() } }
}
