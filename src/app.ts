// The only place services are built and plugins registered, in order.
import { randomBytes } from 'node:crypto'
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify'
import type { Logger } from 'pino'
import { httpBackendFactory } from './backends/http.js'
import { openStdioBackend } from './backends/stdio.js'
import { MemoryBus, MemoryBusHub } from './state/bus-memory.js'
import type { Bus } from './state/bus.js'
import type { Config } from './config/schema.js'
import { LiveConfig } from './config/live.js'
import {
  GW_ERR_INTERNAL, GW_ERR_PAYLOAD_TOO_LARGE, GW_ERR_PARSE, GW_ERR_UNSUPPORTED_MEDIA_TYPE, GW_ERR_BAD_REQUEST, GW_ERR_SHUTTING_DOWN,
  errorHeaders, isGatewayError, toJsonRpcError, type GatewayError
} from './core/errors.js'
import { MemoryEventLog } from './state/event-log-memory.js'
import type { EventLog } from './state/event-log.js'
import { registerJsonParser } from './http/request.js'
import httpGuard from './http/guard.js'
import httpAuthenticate from './http/authenticate.js'
import { TenantDirectory } from './auth/tenants.js'
import { JwtVerifier } from './auth/jwt.js'
import { AuthFailureBudget } from './auth/failure-budget.js'
import httpOauthMetadata from './http/oauth-metadata.js'
import httpLegacySse from './http/legacy-sse.js'
import { StreamWriter } from './http/sse.js'
import httpMetrics from './http/metrics.js'
import httpLimits from './http/limits.js'
import httpOps from './http/ops.js'
import httpStreamable from './http/streamable.js'
import { clientErrorHandler, drainBody, frameworkError } from './http/edge.js'
import { clientAddresses } from './http/client-address.js'
import { createLogger, requestChildLogger } from './telemetry/logger.js'
import { startTracing, stopTracing } from './telemetry/tracing.js'
import { createMetrics, type GatewayMetrics } from './telemetry/metrics.js'
import { AdminStats, AdminStatsMetrics } from './telemetry/admin-stats.js'
import httpAdmin from './http/admin/plugin.js'
import { AdminService, type ReloadFn } from './http/admin/service.js'
import type { BackendFactory, TenantUpstream } from './backends/backend.js'
import { newReplicaId } from './core/replica.js'
import { RedisBus } from './state/bus-redis.js'
import { RedisEventLog } from './state/event-log-redis.js'
import { closeRedis, createRedis, redisReady } from './state/redis/client.js'
import { Router } from './routing/router.js'
import { ConnectionPool } from './routing/upstream/pool.js'
import { StatelessAggregates } from './routing/aggregate/stateless.js'
import { StatelessKinds } from './routing/kinds/stateless.js'
import { ParkedCalls } from './routing/upstream/mrtr.js'
import { ModernFace } from './http/modern.js'
import { ModernTasks } from './http/modern-tasks.js'
import { TaskBridge } from './http/modern-task-bridge.js'
import { serverConfigOf } from './config/server-kind.js'
import { RedisSessionStore } from './state/session-store-redis.js'
import { parseVaultKeys, VAULT_KEYS_VARIABLE, type VaultKeyRing } from './credentials/cipher.js'
import { MemoryVault } from './credentials/vault-memory.js'
import { RedisVault } from './credentials/vault-redis.js'
import { MemoryConsentStore, type ConsentStore } from './credentials/consent-store.js'
import { RedisConsentStore } from './credentials/consent-store-redis.js'
import { ConsentAdmin } from './credentials/consent-admin.js'
import { userAuthorizationFactory, userAuthorizationOf } from './credentials/user-authorization.js'
import httpOAuthConsent from './http/oauth-consent.js'
import { CredentialSources } from './credentials/sources.js'
import type { CallerCredential, Vault } from './credentials/types.js'
import { hasCredentialSources, needsOwnConnections } from './config/credentials-check.js'
import { MemorySessionStore } from './state/session-store-memory.js'
import type { SessionStore } from './state/session-store.js'
import type { SessionTasks } from './state/session-tasks.js'
import { MemorySessionTasks } from './state/session-tasks-memory.js'
import { RedisSessionTasks } from './state/session-tasks-redis.js'
import { MemoryTaskStore } from './state/task-store-memory.js'
import { RedisTaskStore } from './state/task-store-redis.js'
import type { TaskStore } from './state/task-store.js'
import { Supervisor } from './backends/supervisor.js'
import { audit } from './telemetry/audit.js'
import { toolPolicies } from './auth/tool-policy.js'
import { MemoryRateLimiter, RedisRateLimiter, type RateLimiter } from './auth/rate-limit.js'
import { ConcurrencyLimiter } from './auth/concurrency.js'
import { MemorySessionQuotas, QuotaGate, RedisSessionQuotas, type SessionQuotas } from './auth/quotas.js'

/** After the shutdown path has answered everything: connections still open are closed this much later. */
const CLOSE_STRAGGLERS_MS = 1000
/** How long a stop waits for the tasks held here to be failed in the store (see preClose). */
const FAIL_TASKS_MS = 3000

/** A request (its body included) must arrive within this time (slowloris). */
const REQUEST_TIMEOUT_MS = 30_000

/** How long a call parked for an input_required round waits for the client's retry. */
const PARKED_CALL_TTL_MS = 60_000

/** How long a tenant's quota sets outlive their last new session, at least (a day). */
const QUOTA_SET_TTL_MS = 86_400_000

export interface GatewayOptions {
  log?: Logger
  replicaId?: string
  /** Memory mode: apps sharing one hub reach each other over the in-process bus (tests). */
  hub?: MemoryBusHub
  /** Memory mode: apps sharing one store and log act as replicas of one gateway (tests). */
  memory?: { store: MemorySessionStore, eventLog: MemoryEventLog, tasks?: MemoryTaskStore, limiter?: MemoryRateLimiter, quotas?: MemorySessionQuotas, sessionTasks?: MemorySessionTasks, consents?: MemoryConsentStore }
  /**
   * The vault's keys (`MCPGW_VAULT_KEYS`: `kid:base64,...`, the first seals; credentials/cipher.ts).
   * Absent: a key of this process only (tokens obtained are neither shared nor kept across restarts).
   */
  vaultKeys?: string
}

export interface Gateway {
  app: FastifyInstance
  /** With `metrics.listen`: the listener serving only /metrics (main.ts starts it; closed with app). */
  metricsApp: FastifyInstance | null
  /** With `admin.listen`: the listener serving only the console and admin API (main.ts starts it; closed with app). */
  adminApp: FastifyInstance | null
  /** With `admin`: hands the admin API the config reloader (main.ts; the file is its to know). */
  setReloader: (reload: ReloadFn) => void
  metrics: GatewayMetrics
  router: Router
  /** The config being served; `live.apply()` (config/reload.ts) replaces its routing settings. */
  live: LiveConfig
  replicaId: string
  /** The tenant table; a config reload calls its replace(). */
  tenants: TenantDirectory
  /** Starts draining: /readyz answers 503 from now on; requests are still served. */
  drain: () => void
  /** Graceful stop: streams ended with a retry hint, backends stopped, connections closed. */
  close: () => Promise<void>
}

interface Services {
  store: SessionStore
  eventLog: EventLog
  bus: Bus
  /** The records of the tasks the gateway mints ids for (state/task-store.ts). */
  tasks: TaskStore
  /** The sessions' task view the console shows (state/session-tasks.ts). */
  sessionTasks: SessionTasks
  /** Tenants' request budgets and session quotas (auth/rate-limit.ts, auth/quotas.ts). */
  limiter: RateLimiter
  quotas: SessionQuotas
  /** Where backend tokens rest (credentials/), sealed under the vault's keys. */
  vault: Vault
  /** user-authorization's pending consents, which any replica's callback finishes. */
  consents: ConsentStore
  close: () => Promise<void>
}

function memoryServices (config: Readonly<Config>, options: GatewayOptions, metrics: GatewayMetrics, ring: VaultKeyRing): Services {
  const store = options.memory?.store ?? new MemorySessionStore()
  const eventLog = options.memory?.eventLog ?? new MemoryEventLog(store, config.sessions.eventLogMaxLen)
  const shared = options.memory !== undefined
  const tasks = options.memory?.tasks ?? new MemoryTaskStore()
  return {
    store,
    eventLog,
    tasks,
    bus: metrics.instrumentBus(new MemoryBus(options.hub ?? new MemoryBusHub())),
    sessionTasks: options.memory?.sessionTasks ?? new MemorySessionTasks(),
    limiter: options.memory?.limiter ?? new MemoryRateLimiter(),
    quotas: options.memory?.quotas ?? new MemorySessionQuotas(),
    vault: new MemoryVault(ring),
    consents: options.memory?.consents ?? new MemoryConsentStore(),
    close: async () => {
      if (options.memory?.tasks === undefined) await tasks.close()
      if (!shared) await store.close()
    }
  }
}

/** Redis mode: every replica shares sessions, logs and inboxes through one Redis. */
async function redisServices (config: Readonly<Config>, log: Logger, replicaId: string, metrics: GatewayMetrics, ring: VaultKeyRing): Promise<Services> {
  const settings = config.redis
  if (settings === undefined) throw new Error('redis settings missing')
  const target = { url: settings.url, sentinels: settings.sentinels, name: settings.name, cluster: settings.cluster }
  const redis = createRedis(target, { log, connectionName: `mcpgw:${replicaId}`, commandTimeoutMs: settings.connectTimeoutMs })
  // Only the command connection: the bus's blocking XREAD would read as latency.
  metrics.instrumentRedis(redis)
  try {
    await redisReady(redis, settings.connectTimeoutMs)
  } catch (err) {
    closeRedis(redis)
    throw err
  }
  const prefix = settings.keyPrefix
  const beatRedis = createRedis(target, { log, connectionName: `mcpgw:${replicaId}:beat`, commandTimeoutMs: settings.connectTimeoutMs })
  try {
    await redisReady(beatRedis, settings.connectTimeoutMs)
  } catch (err) {
    closeRedis(beatRedis)
    closeRedis(redis)
    throw err
  }
  const bus = new RedisBus(redis, () => createRedis(target, { log, blocking: true, connectionName: `mcpgw:${replicaId}:inbox` }), prefix, {
    // The event log below writes on this same connection: one server applies both in order.
    ordered: settings.cluster.length === 0,
    inboxTtlMs: settings.leaseMs * 6,
    log
  })
  return {
    store: new RedisSessionStore(redis, prefix, beatRedis),
    eventLog: new RedisEventLog(redis, prefix, config.sessions.eventLogMaxLen),
    tasks: new RedisTaskStore(redis, prefix),
    bus: metrics.instrumentBus(bus),
    sessionTasks: new RedisSessionTasks(redis, prefix),
    limiter: new RedisRateLimiter(redis, prefix),
    // The sets' TTL only bounds how long an idle tenant's sets linger (quotas.ts prunes by liveness).
    quotas: new RedisSessionQuotas(redis, prefix, Math.max(QUOTA_SET_TTL_MS, config.sessions.idleTimeoutMs * 2)),
    vault: new RedisVault(redis, ring, prefix),
    consents: new RedisConsentStore(redis, prefix),
    close: async () => { closeRedis(beatRedis); closeRedis(redis) }
  }
}

/** Maps Fastify's own errors (body parsing, limits, routing) onto the gateway's typed errors. */
function asGatewayError (err: Error & { code?: string, statusCode?: number }, bodyLimit: number, url: string): GatewayError {
  if (isGatewayError(err)) return err
  const routing = frameworkError(err, url)
  if (routing !== undefined) return routing
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

/** Two counts by key, added. */
function mergeCounts (a: Map<string, number>, b: Map<string, number>): Map<string, number> {
  const merged = new Map(a)
  for (const [k, n] of b) merged.set(k, (merged.get(k) ?? 0) + n)
  return merged
}

/** Counts stdio children started and crashed (an exit nobody asked for), by server. */
function countingChildren (factory: BackendFactory, metrics: GatewayMetrics): BackendFactory {
  if (metrics.registry === null) return factory
  return async options => {
    const { server, handlers } = options
    const conn = await factory({ ...options, handlers: { ...handlers, onExit: exit => { metrics.childCrashed(server); handlers.onExit(exit) } } })
    metrics.childStarted(server)
    return conn
  }
}

/**
 * Renders errors as JSON-RPC error bodies with the typed error's status, and counts every refusal
 * by status and reason (so refusals added later, auth or limits, are counted without more code).
 */
function errorHandler (config: Readonly<Config>, metrics: GatewayMetrics, stats?: AdminStats) {
  return (error: FastifyError, req: FastifyRequest, reply: FastifyReply): void => {
    const err = asGatewayError(error, config.http.bodyLimit, req.raw.url ?? '')
    const status = err.statusCode ?? 500
    metrics.httpRefusal(status, err.code)
    // A tenant's request refused by its limits: the console's tenant table counts it.
    if (status === 429) stats?.refused(req.principal?.tenant, err.code)
    if (status >= 500 && status !== 503) req.log.error({ err: error }, 'request failed')
    else if (status === 503) req.log.warn({ code: err.code, status }, 'request refused (unavailable)')
    else req.log.info({ code: err.code, status }, 'request rejected')
    reply.headers(errorHeaders(err))
    reply.code(status).type('application/json')
    const body = toJsonRpcError(err, req.jsonRpcId ?? null)
    // A refusal that closes the connection while the body is still arriving (413): the body is
    // read first, within a bound, or the close resets the connection and the answer is lost.
    if (reply.getHeader('connection') === 'close' && !req.raw.complete) drainBody(req.raw, () => { reply.send(body) })
    else reply.send(body)
  }
}

/** `metrics.listen`: a listener of its own that serves /metrics and nothing else. */
async function metricsListener (config: Readonly<Config>, metrics: GatewayMetrics, log: Logger): Promise<FastifyInstance | null> {
  if (metrics.registry === null || config.metrics.listen === undefined) return null
  const app = Fastify({ loggerInstance: log as FastifyBaseLogger, logController: new LogController({ disableRequestLogging: true }), exposeHeadRoutes: false })
  app.setErrorHandler(errorHandler(config, metrics))
  await app.register(httpMetrics, { metrics, token: config.metrics.token })
  return app
}

export async function buildGateway (config: Readonly<Config>, options: GatewayOptions = {}): Promise<Gateway> {
  const replicaId = options.replicaId ?? newReplicaId()
  const log = options.log ?? createLogger(config.log.level, replicaId)
  const prom = createMetrics({ enabled: config.metrics.enabled, servers: Object.keys(config.servers), tenants: Object.keys(config.tenants ?? {}) })
  // With the admin console: every answered request is also counted for its charts (the last minutes).
  const adminStats = config.admin === undefined ? undefined : new AdminStats()
  const metrics: GatewayMetrics = adminStats === undefined ? prom : new AdminStatsMetrics(prom, adminStats)
  const ring = options.vaultKeys === undefined ? parseVaultKeys(`process:${randomBytes(32).toString('base64')}`) : parseVaultKeys(options.vaultKeys)
  const services = config.redis === undefined ? memoryServices(config, options, metrics, ring) : await redisServices(config, log, replicaId, metrics, ring)
  // Tracing is per process (the facade in telemetry/tracing.ts); the SDK loads only when configured.
  if (config.tracing !== undefined) await startTracing(config.tracing, replicaId, log)
  // Routing settings (servers, auth, tenants) are read through `live`, which a reload replaces;
  // process settings are read from `config`, fixed for the life of the process.
  const live = new LiveConfig(config)
  const supervisor = new Supervisor({
    config: live,
    log,
    factories: { stdio: countingChildren(openStdioBackend, metrics), 'streamable-http': httpBackendFactory, sse: httpBackendFactory }
  })
  const tenants = new TenantDirectory(config)
  // Looked up per use, so a replaced tenant table (config reload) applies at once.
  const upstream = (tenant: string | null | undefined, server: string): TenantUpstream => tenants.upstream(tenant, server)
  const toolPolicy = toolPolicies(tenants)
  // Each caller's own credential toward a server (credentials/): read from the live config per use.
  const credentialSources = new CredentialSources({ vault: services.vault, log, metrics })
  const credentialsLive = { get servers () { return live.current.servers }, get tenants () { return live.current.tenants } }
  credentialSources.register('user-authorization', userAuthorizationFactory({ consents: services.consents }))
  const userAuthorization = userAuthorizationOf(credentialSources, credentialsLive)
  if (options.vaultKeys === undefined && hasCredentialSources(config)) log.warn(`${VAULT_KEYS_VARIABLE} is not set: backend tokens are sealed with a key of this process only (not shared by replicas, lost on restart)`)
  const credentials = (tenant: string | null | undefined, subjectDigest: string | undefined, server: string): CallerCredential | undefined =>
    credentialSources.bind(credentialsLive, { tenant: tenant ?? null, subjectDigest: subjectDigest ?? null }, server)
  // The tenants that may use a server now (everyone is the one anonymous tenant without tenants).
  const tenantsOf = (server: string): Array<string | null> => {
    const all = Object.entries(live.current.tenants ?? {})
    return all.length === 0 ? [null] : all.filter(([, tenant]) => Object.hasOwn(tenant.servers, server)).map(([name]) => name)
  }
  const quotaGate = new QuotaGate(tenant => tenants.limits(tenant), services.quotas, async sid => await services.store.exists(sid))
  // Pooled backend connections per (server, tenant): 2026-07-28 requests and pooled sessions run on them.
  const pool = new ConnectionPool({
    replicaId,
    config,
    live,
    backends: supervisor,
    log,
    metrics,
    upstream,
    credentials,
    // A per-user credential: each subject's own pool, so no child ever serves two users.
    ownConnections: (server, tenant) => needsOwnConnections(credentialsLive, tenant, server),
    toolPolicy,
    onServerEvent: (server, tenant, subject, message) => {
      modern.onServerEvent(server, tenant, subject, message)
      router.poolEvent(server, tenant, subject, message, false)
    }
  })
  const router = new Router({
    replicaId,
    newWriter: options => new StreamWriter(options),
    config,
    live,
    store: services.store,
    eventLog: services.eventLog,
    bus: services.bus,
    tasks: services.tasks,
    backends: supervisor,
    pool,
    sessionTasks: services.sessionTasks,
    upstream,
    credentials,
    toolPolicy,
    log,
    metrics,
    admitSession: async record => {
      try {
        await quotaGate.admit(record.id, record.tenant, record.subjectDigest)
      } catch (err) {
        if (isGatewayError(err) && err.code === 'GW_ERR_SESSION_QUOTA') {
          audit(log, 'request.refused', { tenant: record.tenant, subject: record.subjectDigest, server: record.server, status: 429, reason: 'session quota' })
        }
        throw err
      }
    }
  })
  // Calls parked between input_required rounds (2026-07-28).
  const parked = new ParkedCalls({ replicaId, ttlMs: PARKED_CALL_TTL_MS })
  // The records of tasks the gateway hosts, read by every replica.
  const taskStore = services.tasks
  const modernTasks = new ModernTasks({
    store: taskStore,
    peers: { replicaId, send: async (replica, envelope) => { await router.sendEnvelope(replica, envelope) }, isAlive: async replica => await router.isAlive(replica) },
    hosting: server => serverConfigOf(live, server)?.tasks,
    parked,
    inputWaitMs: PARKED_CALL_TTL_MS,
    notify: (server, tenant, message) => { modern.onServerEvent(server, tenant, null, message) },
    warn: (err, msg) => { log.warn({ err }, msg) },
    metrics,
    auditLog: log
  })
  const modern = new ModernFace({
    upstream,
    credentials,
    pool,
    parked,
    toolPolicy,
    peers: { replicaId, send: async (replica, envelope) => { await router.sendEnvelope(replica, envelope) }, isAlive: async replica => await router.isAlive(replica) },
    forwardTimeoutMs: PARKED_CALL_TTL_MS * 2,
    keepAliveMs: config.http.keepAliveMs,
    listenRegistry: services.store,
    kinds: new StatelessKinds({ live, pool, aggregates: new StatelessAggregates({ live, pool, toolPolicy, metrics, log, ownConnections: (server, tenant) => needsOwnConnections(credentialsLive, tenant, server) }) }),
    tasks: modernTasks,
    bridge: new TaskBridge({ pool, parked, tasks: modernTasks }),
    log
  })
  router.onReplicaGone(replica => { modernTasks.replicaGone(replica).catch(err => { log.warn({ err }, 'hosted tasks of a lost replica not failed') }) })
  router.onModernEnvelope(envelope => {
    modern.onEnvelope(envelope)
    if (envelope.kind === 'listen-event') router.poolEvent(envelope.server, envelope.tenant, envelope.subject ?? null, envelope.message, true)
  })
  metrics.observe({
    sessions: () => mergeCounts(router.ownedSessions(), router.pooledSessions()),
    streams: () => router.openStreams(),
    children: () => supervisor.childrenByServer(),
    pooledChildren: () => supervisor.pooledChildrenByServer(),
    pools: () => pool.stats()
  })
  live.onChange(async change => {
    // Tenants and auth first: a revoked key is refused from the next request on.
    if (change.auth || change.tenants.added.length + change.tenants.changed.length + change.tenants.removed.length > 0) {
      tenants.replace(change.current)
    }
    metrics.reconfigure(Object.keys(change.current.servers), Object.keys(change.current.tenants ?? {}))
    credentialSources.reconfigure(change.current)
    await pool.endServers([...change.servers.removed, ...change.servers.changed], 'server removed or changed in the config')
    const ended = await router.endSessionsOf(change.servers.removed, 'server removed from the config')
    if (ended > 0) log.info({ servers: change.servers.removed, sessions: ended }, 'sessions of removed servers ended')
    pool.warm(tenantsOf)
  })
  // The pools of pooled servers start now, in the background (a child that fails is retried).
  pool.warm(tenantsOf)

  const handleError = errorHandler(config, metrics, adminStats)
  // The client's address: the TCP peer's, or what a trusted proxy's header says (http.trustedProxies).
  const addressOf = clientAddresses(config.http)
  const app = Fastify({
    loggerInstance: log as FastifyBaseLogger,
    childLoggerFactory: requestChildLogger(),
    bodyLimit: config.http.bodyLimit,
    exposeHeadRoutes: false,
    // Request lines are logged by the hook below, without query strings (legacy session ids).
    logController: new LogController({ disableRequestLogging: true }),
    // Closing: the hook below answers 503 in the gateway's format (Fastify's own has no Retry-After).
    return503OnClosing: false,
    // Errors before any route runs (bad percent-encoding, an over-long name) and the HTTP parser's
    // answer in the gateway's format too: a client reads one error format whatever it sent.
    frameworkErrors: (err, req, reply) => { handleError(err, req, reply) },
    clientErrorHandler: clientErrorHandler(metrics, log as FastifyBaseLogger, REQUEST_TIMEOUT_MS),
    // A request body must arrive within this time (slowloris); responses, SSE included, are not limited.
    requestTimeout: REQUEST_TIMEOUT_MS
  })
  registerJsonParser(app)
  app.setErrorHandler(handleError)
  let closing = false
  app.addHook('onRequest', (_req, _reply, done) => { done(closing ? new GW_ERR_SHUTTING_DOWN() : undefined) })
  app.setNotFoundHandler((req, reply) => {
    metrics.httpRefusal(404, '')
    reply.code(404).type('application/json').send({ jsonrpc: '2.0', id: null, error: { code: -32000, message: `Not Found: ${req.method} ${req.url.split('?')[0] ?? ''}`, data: { source: 'gateway' } } })
  })
  // The access line is at debug: at info it was a synchronous write per request, a tenth or more of
  // the gateway's own cost per call. `log.level: debug` brings it back. The level is a
  // process setting, so below debug the hook is not registered at all: an onResponse hook costs
  // every request a hook run even when it logs nothing.
  if (log.isLevelEnabled('debug')) {
    app.addHook('onResponse', (req, reply, done) => {
      req.log.debug({ method: req.method, route: req.routeOptions.url, status: reply.statusCode, ms: Math.round(reply.elapsedTime), address: addressOf(req) }, 'request')
      done()
    })
  }

  await app.register(httpGuard, { config })
  // One failed-authentication budget per address for tenants' credentials and the admin token alike.
  const failures = new AuthFailureBudget(services.limiter, config.auth.failures)
  await app.register(httpAuthenticate, {
    tenants,
    jwt: new JwtVerifier(tenants).check,
    failures,
    addressOf,
    live,
    callerTokens: {
      wants: (tenant, server) => credentialSources.wantsCallerToken(credentialsLive, tenant, server),
      remember: (tenant, subjectDigest, token) => { credentialSources.tokens.remember(tenant, subjectDigest, token) }
    }
  })
  await app.register(httpOauthMetadata, { tenants })
  // user-authorization's consent link and callback (browser routes, no MCP credential): any replica.
  await app.register(httpOAuthConsent, { consents: services.consents, sourceOf: userAuthorization })
  let draining = false
  await app.register(httpOps, { router, store: services.store, draining: () => draining, storeGraceMs: config.redis?.readinessGraceMs ?? 0 })
  // /metrics: on the main listener unless it has an address of its own; never under /mcp.
  const metricsApp = await metricsListener(config, metrics, log)
  if (metricsApp === null) await app.register(httpMetrics, { metrics, token: config.metrics.token })
  // /admin: the console and admin API (docs/console.md), with `admin.token` only; never under /mcp.
  let admin: AdminService | undefined
  let adminApp: FastifyInstance | null = null
  if (config.admin !== undefined && adminStats !== undefined) {
    admin = new AdminService({
      replicaId,
      config,
      live,
      store: services.store,
      router,
      stats: adminStats,
      log,
      children: () => supervisor.childrenByServer(),
      pools: () => pool.stats(),
      draining: () => draining,
      sessionTasks: services.sessionTasks
    })
    const consents = new ConsentAdmin({
      vault: services.vault,
      tenants: () => { const names = Object.keys(live.current.tenants ?? {}); return names.length === 0 ? [null] : names },
      sourceOf: userAuthorization
    })
    const adminOptions = { token: config.admin.token, service: admin, failures, addressOf, vault: services.vault, consents }
    if (config.admin.listen === undefined) {
      await app.register(httpAdmin, adminOptions)
    } else {
      adminApp = Fastify({ loggerInstance: log as FastifyBaseLogger, logController: new LogController({ disableRequestLogging: true }), exposeHeadRoutes: false })
      adminApp.setErrorHandler(handleError)
      await adminApp.register(httpAdmin, adminOptions)
    }
    const service = admin
    router.onAdminEnvelope(envelope => {
      if (envelope.kind !== 'admin-reload') return
      audit(log, 'admin.action', { action: 'config.reload', from: envelope.from })
      service.reloadLocal(`admin (asked on ${envelope.from})`).catch(err => log.error({ err }, 'admin reload failed'))
    })
  }
  // After httpAuthenticate: both are onRequest hooks, run in registration order.
  await app.register(httpLimits, { tenants, limiter: services.limiter, concurrency: new ConcurrencyLimiter() })
  await app.register(httpStreamable, { config, live, router, modern })
  await app.register(httpLegacySse, { live, router })

  // SSE responses end in preClose, before Fastify waits for open requests.
  app.addHook('preClose', async () => {
    closing = true
    modern.endListeners()
    parked.clear()
    admin?.stop()
    // The tasks this replica runs die with its calls and connections: failed in the store, saying
    // why, while pool and store are still there (others would wait for the heartbeat to lapse).
    // Bounded: a store that does not answer must not hold the stop up.
    let bound: NodeJS.Timeout | undefined
    const failing = Promise.all([modernTasks.shutdown(), router.failTasksHere()]).catch(err => { log.warn({ err }, 'tasks not failed at shutdown') })
    await Promise.race([failing, new Promise<void>(resolve => { bound = setTimeout(() => { log.warn('tasks not failed at shutdown within the bound'); resolve() }, FAIL_TASKS_MS) })])
    clearTimeout(bound)
    await pool.stop()
    await router.stop()
    // Every stream has ended and every request been answered by now. A connection that opened and
    // never sent a request (the v2 SDK leaves one behind when a listen stream is closed) would
    // otherwise hold the close until Node's header timeout, a minute or more.
    setTimeout(() => { app.server.closeAllConnections() }, CLOSE_STRAGGLERS_MS).unref()
  })
  app.addHook('onClose', async () => {
    await metricsApp?.close()
    await adminApp?.close()
    credentialSources.close()
    await services.close()
    // Spans still buffered are exported before the process goes.
    if (config.tracing !== undefined) await stopTracing()
  })

  await router.start()
  admin?.start()
  log.info({ servers: Object.keys(config.servers), store: config.redis === undefined ? 'memory' : 'redis' }, 'gateway built')
  return {
    app,
    metricsApp,
    adminApp,
    setReloader: reload => { admin?.setReloader(reload) },
    metrics,
    router,
    live,
    replicaId,
    tenants,
    drain: () => { draining = true },
    close: async () => { await app.close() }
  }
}
