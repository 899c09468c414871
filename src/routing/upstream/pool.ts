// Modern (2026-07-28) requests in front of a legacy backend (ARCHITECTURE.md flow 8): a small pool
// of initialised backend connections per (server, tenant) on this replica, each with its own relay
// (relay.ts), so no child is started per request and no session is kept for the client.
//
// - Ids: each request gets a pool-wide key `m<n>` as its client id and its stream id, so requests
//   of different clients never meet in a relay (its id mapping and progress tokens are keyed by
//   them); the relay mints the backend's ids as for any session. The caller maps the key back.
// - Scheduling: one request per connection, so what a backend sends without a request id (logs,
//   server-to-client requests) belongs to the one request in flight: an idle connection, else a
//   new one, up to `poolMax` per (server, tenant); past it a request waits in line for the next
//   connection to come free, for at most `poolWaitMs`, then gets GW_ERR_POOL_BUSY (503,
//   Retry-After). Requests never share a connection.
//   `poolSize` connections stay warm when idle; more are opened for a burst and stopped when idle.
//   The pools of `sessions: pooled` servers are opened to poolSize at boot and after a reload
//   (warm()), in the background, and keep poolSize while idle; other pools fill on first use.
// - Pooled sessions (pooled-sessions.ts, flow 9) and 2026-07-28 requests (http/modern.ts, flow 8)
//   run on the same pool.
// - A connection is initialised by the pool (the client sent no initialize): latest legacy
//   version, the client capabilities the gateway can bridge (sampling, elicitation, roots, as
//   `input_required` rounds: mrtr.ts). What the first one learns (capabilities, server info,
//   instructions) answers `server/discover` without a backend round trip.
// - A crashed child is restarted and re-initialised by the supervisor, as for a session; its
//   requests in flight get -32007. An idle connection is stopped after the sessions' idle timeout.
// - A connection's `list_changed` reaches the sessions only when the list really changed: the
//   pool lists it from that connection and compares a digest with the last list of the (server,
//   tenant) the sessions could have seen (the first connection's, taken as it opens). A server
//   that registers tools after `initialized` (server-everything) announces a change on every new
//   child; forwarded, a burst that opens one child makes every session of the server re-list.
import { createHash } from 'node:crypto'
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import { filterToolsListOf, type ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerSource } from '../../config/live.js'
import type { BackendServerConfig as ServerConfig, Config, ServerConfig as AnyServerConfig, StdioServerConfig } from '../../config/schema.js'
import { isAggregateConfig, kindNameOf } from '../../config/server-kind.js'
import {
  GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_POOL_BUSY, GW_ERR_SERVER_NOT_FOUND, GW_ERR_SHUTTING_DOWN, isGatewayError, withRetryAfter, type GatewayError
} from '../../core/errors.js'
import { isNotification, isRecord, isRequest, isResponse, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import type { BackendPool, UpstreamLookup } from './ports.js'
import { GATEWAY_INITIALIZE_PARAMS, gatewayRelay } from './gateway-relay.js'
import { asGatewayError, Relay } from './relay.js'

/** What the client side of a pooled request hears: its answer (id = its key), and what relates to it. */
export interface PoolSink {
  onMessage (message: JsonRpcMessage): void
}

/** What a legacy backend said about itself when the pool initialised it (answers server/discover). */
export interface BackendInfo {
  protocolVersion: string
  capabilities: Record<string, unknown>
  serverInfo: Record<string, unknown>
  instructions?: string
}

/** A connection set aside for one request (reserve()): run it, or release it unused. */
export interface Reservation {
  run (build: (key: string) => JsonRpcRequest, sink: PoolSink, options?: RunOptions): PooledCall
  release (): void
}

export interface RunOptions {
  /** The session's log level (logging/setLevel params.level): the connection is set to it first when it differs. */
  logLevel?: string | null
}

/** A (server, tenant) pool's figures now (metrics). */
export interface PoolStats {
  server: string
  tenant: string | null
  connections: number
  busy: number
  waiting: number
}

/** A request running on a pooled connection. */
export interface PooledCall {
  readonly key: string
  /** The client went away: the backend is told (notifications/cancelled) and nothing more is delivered. */
  cancel (reason: string): void
  /** Answers one of the backend's server-to-client requests of this call (its opaque id). */
  answer (response: JsonRpcResponse): void
  /** Hands what comes next of this call to another sink (an MRTR retry takes over a parked call). */
  rebind (sink: PoolSink): void
}

export interface ConnectionPoolOptions {
  replicaId: string
  config: Readonly<Config>
  live: ServerSource
  backends: BackendPool
  log: Logger
  metrics: GatewayMetrics
  upstream?: UpstreamLookup
  toolPolicy?: ToolPolicyLookup
  /** Session-level messages of a backend (list_changed, resources/updated), for listen streams. */
  onServerEvent?: (server: string, tenant: string | null, message: JsonRpcMessage) => void
}

/** How long a replica's registration for a pool's session-level events lives unless renewed (a third of it apart). */
export const LISTEN_REGISTRATION_MS = 15_000

/**
 * The registry topic of a server and tenant: replicas registered for it (SessionStore.addListener)
 * get the session-level notifications (list_changed, resources/updated) another replica's pool sees.
 */
export const listenTopic = (server: string, tenant: string | null): string => `${server}:${tenant ?? ''}`

export { BRIDGED_CAPABILITIES } from './gateway-relay.js'

const INIT_KEY_PREFIX = 'i'
/** Keys of the pool's reads of a list (list_changed checks): not the clients' operations. */
const LIST_KEY_PREFIX = 'l'
/** Connections opened beyond poolSize for a burst are stopped after this long idle. */
const EXTRA_IDLE_MS = 30_000
/** Longest a request waits in line for a connection when the pool is at poolMax (default of poolWaitMs). */
export const POOL_WAIT_MS = 10_000
/** Requests that may wait in line per (server, tenant); past it a request is refused at once. */
const MAX_WAITERS = 4096
/** Retry-After of a request that found the pool busy. */
const POOL_BUSY_RETRY_AFTER_S = 1
/** The list a `list_changed` notification is about, by its method. */
const LIST_OF: Readonly<Record<string, string>> = {
  'notifications/tools/list_changed': 'tools/list',
  'notifications/prompts/list_changed': 'prompts/list',
  'notifications/resources/list_changed': 'resources/list'
}
/** Attempts to open a pool's warm connections (boot, reload) before it is left to fill on use. */
const WARM_ATTEMPTS = 5
/** First delay between warm attempts, doubled per failure. */
const WARM_RETRY_MS = 1000
/** Pages read of one list to tell whether it changed; a longer list counts as changed. */
const LIST_PAGES_MAX = 50

interface Connection {
  id: string
  server: string
  tenant: string | null
  relay: Relay
  lastUsed: number
  /** Requests that chose this connection and are not delivered yet. */
  claims: number
  /** Resource subscriptions of listen streams held on this connection, by uri (a count each). */
  subscriptions: Map<string, number>
  /** The level this connection's backend was last set to (logging/setLevel), if any. */
  logLevel: string | undefined
  /** Requests of the pool's own waiting for the connection to be idle (#whenIdle). */
  deferred: Array<() => void>
  /** Lists being compared after a list_changed of this connection (true: announced again meanwhile). */
  checks: Map<string, boolean>
}

interface Waiter {
  resolve: (conn: Connection) => void
  reject: (err: GatewayError) => void
  timer: NodeJS.Timeout
}

/** The group a connection belongs to. */
function group (groups: ReadonlyMap<string, Group>, conn: Connection): Group | undefined {
  return groups.get(`${conn.server}\0${conn.tenant ?? ''}`)
}

/** Requests on a connection: in flight, or about to be. */
const busy = (c: Connection): number => c.relay.inFlightCount + c.claims

interface Group {
  server: string
  tenant: string | null
  connections: Connection[]
  info: BackendInfo | null
  /** Listen streams that need the group's connections kept (no idle stop while > 0). */
  holds: number
  /** Connections being opened for a claim (counted against poolMax). */
  opening: number
  /** Requests waiting for a connection, first come first served. */
  waiters: Waiter[]
  /** The connection being opened for whoever needs any (discover, a pooled initialize, listen) while the group has none. */
  first: Promise<Connection> | null
  /** Digest of each list (by its method) as the sessions could last have seen it. */
  lists: Map<string, string>
  /** The first connection's lists being read (the baseline a list_changed is compared with). */
  baseline: Promise<void> | null
}

export class ConnectionPool {
  readonly #o: ConnectionPoolOptions
  readonly #groups = new Map<string, Group>()
  readonly #sinks = new Map<string, PoolSink>()
  readonly #sweep: NodeJS.Timeout
  #seq = 0
  #stopping = false

  constructor (options: ConnectionPoolOptions) {
    this.#o = options
    const idleMs = options.config.sessions.idleTimeoutMs
    this.#sweep = setInterval(() => { this.#stopIdle(idleMs) }, Math.max(1000, Math.min(10_000, Math.floor(idleMs / 2))))
    this.#sweep.unref()
  }

  /** What the backend said about itself (server/discover): learned once per (server, tenant). */
  async info (server: string, tenant: string | null): Promise<BackendInfo> {
    const group = this.#group(server, tenant)
    if (group.info !== null) return group.info
    await this.#acquire(server, tenant, false)
    if (group.info === null) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'the backend did not describe itself')
    return group.info
  }

  /**
   * Keeps the group's connections open while a listen stream waits for their notifications (at
   * least one connection is opened); the returned function lets go.
   */
  async hold (server: string, tenant: string | null, uris: readonly string[] = []): Promise<() => void> {
    const group = this.#group(server, tenant)
    group.holds++
    let held = true
    let conn: Connection | undefined
    const release = (): void => {
      if (!held) return
      held = false
      group.holds--
      if (conn !== undefined) this.#unsubscribe(conn, uris)
    }
    try {
      conn = await this.#acquire(server, tenant, false)
      if (uris.length > 0) this.#subscribe(conn, uris)
      else conn = undefined
    } catch (err) {
      release()
      throw err
    }
    return release
  }

  /**
   * resources/subscribe upstream for a listen stream's resourceSubscriptions, counted per uri on the
   * connection that holds them (kept from idle stop while it holds any; a restarted child gets them
   * replayed by its supervised session). The backend's resources/updated reach onServerEvent.
   */
  #subscribe (conn: Connection, uris: readonly string[]): void {
    for (const uri of uris) {
      const count = conn.subscriptions.get(uri) ?? 0
      conn.subscriptions.set(uri, count + 1)
      if (count === 0) this.#whenIdle(conn, 'resources/subscribe', { uri })
    }
  }

  #unsubscribe (conn: Connection, uris: readonly string[]): void {
    for (const uri of uris) {
      const count = (conn.subscriptions.get(uri) ?? 1) - 1
      if (count > 0) { conn.subscriptions.set(uri, count); continue }
      conn.subscriptions.delete(uri)
      if (group(this.#groups, conn)?.connections.includes(conn) === true) this.#whenIdle(conn, 'resources/unsubscribe', { uri })
    }
  }

  /**
   * A request of the pool's own, run while the connection runs nothing else (now, or as soon as
   * its request ends, before anyone waiting): a second request in flight would make what the
   * backend sends without an id ambiguous for the one running.
   */
  #whenIdle (conn: Connection, method: string, params: Record<string, unknown>, then?: (answer: JsonRpcResponse) => void, prefix = INIT_KEY_PREFIX): void {
    const run = (): void => {
      conn.claims++
      this.#internal(conn, method, params, answer => {
        conn.claims--
        this.#released(conn)
        then?.(answer)
      }, prefix)
    }
    if (busy(conn) === 0) run()
    else conn.deferred.push(run)
  }

  /**
   * A request of the pool's own on one connection; its answer is logged if it is an error. `then`
   * runs once it is answered (or failed).
   */
  #internal (conn: Connection, method: string, params: Record<string, unknown>, then?: (answer: JsonRpcResponse) => void, prefix = INIT_KEY_PREFIX): void {
    const key = `${prefix}${++this.#seq}`
    this.#sinks.set(key, {
      onMessage: message => {
        if (!isResponse(message)) return
        if ('error' in message) conn.relay.log.warn({ method, code: message.error.code }, 'pooled backend refused a request of the gateway')
        then?.(message)
      }
    })
    conn.relay.deliver({ jsonrpc: '2.0', id: key, method, params }, key)
  }

  /**
   * Runs one request (its id replaced by the returned key, and its progress token, if any, by the
   * same key) on a pooled connection; everything about it reaches `sink`.
   */
  async call (server: string, tenant: string | null, build: (key: string) => JsonRpcRequest, sink: PoolSink, options?: RunOptions): Promise<PooledCall> {
    return (await this.reserve(server, tenant)).run(build, sink, options)
  }

  /**
   * A connection of the (server, tenant) pool for one request, taken now: an idle one, a new one
   * (up to poolMax), or the next to come free (waiting at most POOL_WAIT_MS; then
   * GW_ERR_POOL_BUSY). Run the request on it, or release it.
   */
  async reserve (server: string, tenant: string | null): Promise<Reservation> {
    const conn = await this.#acquire(server, tenant, true)
    let used = false
    return {
      run: (build, sink, options) => {
        if (used) throw new Error('reservation used twice')
        used = true
        return this.#run(conn, build, sink, options)
      },
      release: () => {
        if (used) return
        used = true
        conn.claims--
        this.#released(conn)
      }
    }
  }

  #run (conn: Connection, build: (key: string) => JsonRpcRequest, sink: PoolSink, options: RunOptions | undefined): PooledCall {
    const key = `m${++this.#seq}`
    this.#sinks.set(key, sink)
    conn.lastUsed = performance.now()
    const send = (): void => {
      conn.claims--
      // Cancelled (or its session ended) while the level was set: the connection is free again.
      if (!this.#sinks.has(key)) { this.#released(conn); return }
      conn.relay.deliver(build(key), key)
    }
    const level = options?.logLevel
    if (typeof level === 'string' && level !== conn.logLevel) {
      // The session's own level, for its request only. The request waits for the backend's answer:
      // while two requests are in flight on a connection, what it sends without an id cannot be
      // told apart (a roots/list asked at once by a tool would be refused).
      conn.logLevel = level
      this.#internal(conn, 'logging/setLevel', { level }, send)
    } else {
      send()
    }
    const relay = conn.relay
    return {
      key,
      cancel: reason => {
        if (!this.#sinks.delete(key)) return
        relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: key, reason } }, null)
      },
      answer: response => { relay.deliver(response, null) },
      rebind: next => { if (this.#sinks.has(key)) this.#sinks.set(key, next) }
    }
  }

  /**
   * Opens the pools of `sessions: pooled` servers to poolSize for each tenant that may use them
   * (boot, reload), in the background: what is already open counts, a failure is logged and
   * retried with backoff, and nothing here delays readiness.
   */
  warm (tenantsOf: (server: string) => ReadonlyArray<string | null>): void {
    for (const [server, config] of Object.entries(this.#o.live.servers)) {
      if (!keptWarm(config)) continue
      for (const tenant of tenantsOf(server)) this.#topUp(server, tenant, 0)
    }
  }

  #topUp (server: string, tenant: string | null, failures: number): void {
    const fill = async (): Promise<void> => {
      if (this.#stopping) return
      const config = this.#serverConfig(server)
      if (!keptWarm(config)) return
      await this.#acquire(server, tenant, false)
      const group = this.#group(server, tenant)
      const missing = (config.poolSize ?? 4) - group.connections.length - group.opening
      await Promise.all(Array.from({ length: Math.max(0, missing) }, async () => {
        group.opening++
        try {
          this.#released(await this.#open(server, tenant, config, group, false))
        } finally {
          group.opening--
        }
      }))
    }
    fill().catch((err: unknown) => {
      if (this.#stopping || (isGatewayError(err) && err.code === 'GW_ERR_SERVER_NOT_FOUND')) return
      const attempt = failures + 1
      const log = this.#o.log.child({ backend: server, tenant })
      if (attempt >= WARM_ATTEMPTS) {
        log.warn({ err, attempt }, 'pooled backend not kept warm: it fails to start; the pool opens children on use')
        return
      }
      const delayMs = WARM_RETRY_MS * 2 ** (attempt - 1)
      log.warn({ err, attempt, delayMs }, 'pooled backend failed to start warm; retrying')
      setTimeout(() => { this.#topUp(server, tenant, attempt) }, delayMs).unref()
    })
  }

  /** Each (server, tenant) pool's connections, those in use, and the requests waiting (metrics). */
  stats (): PoolStats[] {
    return [...this.#groups.values()].map(g => ({
      server: g.server,
      tenant: g.tenant,
      connections: g.connections.length,
      busy: g.connections.filter(c => busy(c) > 0).length,
      waiting: g.waiters.length
    }))
  }

  /** A request on `conn` ended: the connection goes to the first request waiting in line, if any. */
  #released (conn: Connection): void {
    if (busy(conn) !== 0) return
    const own = conn.deferred.shift()
    if (own !== undefined) { own(); return }
    const group = this.#groups.get(`${conn.server}\0${conn.tenant ?? ''}`)
    if (group === undefined || !group.connections.includes(conn)) return
    const waiter = group.waiters.shift()
    if (waiter === undefined) return
    clearTimeout(waiter.timer)
    conn.claims++
    waiter.resolve(conn)
  }

  /** Room was made in a group (a connection went away): the first waiters get new connections. */
  #openForWaiters (group: Group): void {
    if (this.#stopping) return
    let room = this.#poolMax(group.server) - group.connections.length - group.opening
    while (room-- > 0 && group.waiters.length > 0) {
      const waiter = group.waiters.shift() as Waiter
      clearTimeout(waiter.timer)
      let config: ServerConfig
      try {
        config = this.#serverConfig(group.server)
      } catch (err) {
        waiter.reject(err as GatewayError)
        continue
      }
      group.opening++
      this.#open(group.server, group.tenant, config, group, true)
        .finally(() => { group.opening-- })
        .then(waiter.resolve, (err: unknown) => { waiter.reject(asGatewayError(err, group.server)) })
    }
  }

  /** Live reload: the connections of removed or changed servers stop (their requests get -32007). */
  async endServers (servers: readonly string[], reason: string): Promise<void> {
    const names = new Set(servers)
    const stops: Array<Promise<void>> = []
    for (const [k, group] of this.#groups) {
      if (!names.has(group.server)) continue
      this.#groups.delete(k)
      this.#rejectWaiters(group, new GW_ERR_BACKEND_UNAVAILABLE(group.server, reason))
      for (const c of group.connections) stops.push(this.#close(c, new GW_ERR_BACKEND_UNAVAILABLE(c.server, reason)))
    }
    await Promise.all(stops)
  }

  /** Shutdown: every pooled request is answered, every connection stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    clearInterval(this.#sweep)
    for (const group of this.#groups.values()) this.#rejectWaiters(group, new GW_ERR_SHUTTING_DOWN())
    const all = [...this.#groups.values()].flatMap(g => g.connections)
    this.#groups.clear()
    await Promise.all(all.map(async c => { await this.#close(c, new GW_ERR_SHUTTING_DOWN()) }))
  }

  #rejectWaiters (group: Group, err: GatewayError): void {
    for (const waiter of group.waiters.splice(0)) {
      clearTimeout(waiter.timer)
      waiter.reject(err)
    }
  }

  #group (server: string, tenant: string | null): Group {
    const k = `${server}\0${tenant ?? ''}`
    let group = this.#groups.get(k)
    if (group === undefined) {
      group = { server, tenant, connections: [], info: null, holds: 0, opening: 0, waiters: [], first: null, lists: new Map(), baseline: null }
      this.#groups.set(k, group)
    }
    return group
  }

  #poolMax (server: string): number {
    const config = Object.hasOwn(this.#o.live.servers, server) ? this.#o.live.servers[server] : undefined
    return config?.poolMax ?? 16
  }

  #serverConfig (server: string): ServerConfig {
    const servers = this.#o.live.servers
    const config = Object.hasOwn(servers, server) ? servers[server] : undefined
    if (config === undefined) throw new GW_ERR_SERVER_NOT_FOUND(server)
    // An aggregate has no backend of its own: its members have pools.
    if (isAggregateConfig(config)) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'an aggregate server has no pool of its own')
    return config
  }

  /**
   * A connection for one request (`claim`: reserved for it until its request is delivered), or any
   * ready connection (discover, listen). A request gets an idle connection, else a new one (up to
   * poolMax), else waits in line for the next one to come free: what the backend sends without a
   * request id (logs, server-to-client requests) then belongs to it alone.
   */
  async #acquire (server: string, tenant: string | null, claim: boolean): Promise<Connection> {
    if (this.#stopping) throw new GW_ERR_SHUTTING_DOWN()
    const config = this.#serverConfig(server)
    const group = this.#group(server, tenant)
    const first = group.connections[0]
    if (!claim && first !== undefined) return first
    if (!claim) {
      // One connection for all of them: a burst of new pooled sessions (each initialize asks for
      // the backend's description) opened a child each, past poolMax, until the first was ready.
      group.first ??= this.#open(server, tenant, config, group, false).finally(() => { group.first = null })
      return await group.first
    }
    const idle = group.connections.find(c => busy(c) === 0)
    if (idle !== undefined) {
      idle.claims++
      return idle
    }
    if (group.connections.length + group.opening < (config.poolMax ?? 16)) {
      group.opening++
      try {
        return await this.#open(server, tenant, config, group, true)
      } catch (err) {
        // The supervisor's own limit (a dedicated server's maxSessions counts these children too):
        // wait for one of the pool's connections, as past poolMax.
        if (!isGatewayError(err) || err.code !== 'GW_ERR_BACKEND_CAPACITY' || group.connections.length === 0) throw err
      } finally {
        group.opening--
      }
    }
    return await this.#wait(group, config)
  }

  /** Waits in line for a connection of a group at its limit (bounded in time and in length). */
  async #wait (group: Group, config: ServerConfig): Promise<Connection> {
    const waitMs = config.poolWaitMs ?? POOL_WAIT_MS
    const busyError = (): GatewayError => withRetryAfter(new GW_ERR_POOL_BUSY(group.server, group.connections.length, waitMs), POOL_BUSY_RETRY_AFTER_S)
    if (group.waiters.length >= MAX_WAITERS) throw busyError()
    return await new Promise<Connection>((resolve, reject) => {
      const waiter: Waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          const at = group.waiters.indexOf(waiter)
          if (at >= 0) group.waiters.splice(at, 1)
          reject(busyError())
        }, waitMs)
      }
      waiter.timer.unref()
      group.waiters.push(waiter)
    })
  }

  async #open (server: string, tenant: string | null, config: ServerConfig, group: Group, claim: boolean): Promise<Connection> {
    const id = `pool.${this.#o.replicaId}.${++this.#seq}`
    const log = this.#o.log.child({ pool: id, backend: server })
    const policyOf = this.#o.toolPolicy
    const relay = gatewayRelay({
      sid: id,
      server,
      config,
      clientRequestTimeoutMs: this.#o.config.sessions.clientRequestTimeoutMs,
      host: {
        append: async (_sid, streamId, message) => { this.#toSink(conn, streamId, message) },
        endSession: async (_sid, reason) => { await this.#close(conn, new GW_ERR_BACKEND_UNAVAILABLE(server, reason)) },
        nextServerRequestId: () => `s.${this.#o.replicaId}.p${++this.#seq}`
      },
      log,
      metrics: this.#o.metrics.forSession(server, tenant),
      uncounted: streamId => streamId.startsWith(LIST_KEY_PREFIX),
      ...(policyOf !== undefined ? { filterResult: (method: string, result: unknown) => filterToolsListOf(method, result, policyOf(tenant, server)) } : {})
    })
    const conn: Connection = {
      id, server, tenant, relay, lastUsed: performance.now(), claims: claim ? 1 : 0, subscriptions: new Map(), logLevel: undefined, deferred: [], checks: new Map()
    }
    try {
      relay.backend = await this.#o.backends.open(id, server, {
        onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'backend message not routed')) },
        onRestarting: info => {
          log.warn({ reason: info.reason, attempt: info.attempt }, 'pooled backend restarting')
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(server, `backend stopped (${info.reason}); restarting`))
        },
        onGone: reason => {
          log.warn({ reason }, 'pooled backend gone')
          this.#forget(conn)
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(server, reason))
        }
      }, {
        protocolVersion: LATEST_VERSION,
        // Streamable HTTP backends send list_changed on their GET stream: listen streams need it.
        listen: true,
        ...(this.#o.upstream !== undefined ? { upstream: this.#o.upstream(tenant, server) } : {})
      })
      const info = await this.#initialise(conn)
      // A reload ended the pool while this connection started: it must not outlive it.
      if (this.#stopping || this.#groups.get(`${server}\0${tenant ?? ''}`) !== group) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'the pool ended while the backend started')
      group.info ??= info
      // Before the first connection serves anyone: what its lists are is what the sessions see.
      if (group.baseline === null) await (group.baseline = this.#readBaseline(conn, group, info))
      group.connections.push(conn)
      log.info({ protocolVersion: info.protocolVersion }, 'pooled backend connection ready')
      return conn
    } catch (err) {
      await this.#o.backends.stop(id).catch(() => {})
      throw isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(server, err instanceof Error ? err.message : String(err), { cause: err })
    }
  }

  /** initialize + notifications/initialized on a new connection, through its relay (captured for restarts). */
  async #initialise (conn: Connection): Promise<BackendInfo> {
    const key = `${INIT_KEY_PREFIX}${++this.#seq}`
    const answer = await new Promise<JsonRpcMessage>(resolve => {
      this.#sinks.set(key, { onMessage: resolve })
      conn.relay.deliver({
        jsonrpc: '2.0',
        id: key,
        method: 'initialize',
        params: GATEWAY_INITIALIZE_PARAMS
      }, key)
    })
    this.#sinks.delete(key)
    if (!isResponse(answer) || 'error' in answer) {
      const reason = isResponse(answer) && 'error' in answer ? answer.error.message : 'no answer'
      throw new GW_ERR_BACKEND_UNAVAILABLE(conn.server, `initialize failed: ${reason}`)
    }
    conn.relay.deliver({ jsonrpc: '2.0', method: 'notifications/initialized' }, null)
    const result = isRecord(answer.result) ? answer.result : {}
    return {
      protocolVersion: typeof result.protocolVersion === 'string' ? result.protocolVersion : LATEST_VERSION,
      capabilities: isRecord(result.capabilities) ? result.capabilities : {},
      serverInfo: isRecord(result.serverInfo) ? result.serverInfo : { name: conn.server, version: '0' },
      ...(typeof result.instructions === 'string' ? { instructions: result.instructions } : {})
    }
  }

  /** A message the relay of a pooled connection addressed to one request's stream (its key). */
  #toSink (conn: Connection, streamId: string, message: JsonRpcMessage): void {
    const sink = this.#sinks.get(streamId)
    if (sink !== undefined) {
      const done = isResponse(message) && message.id === streamId
      if (done) this.#sinks.delete(streamId)
      sink.onMessage(message)
      // Its request is settled in the relay before its answer comes here: the connection may be free.
      if (done) this.#released(conn)
      return
    }
    if (isRequest(message)) {
      // No request it could belong to (several in flight, or none): the backend hears no.
      conn.relay.deliver({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `${message.method} cannot be routed to a client: no single request of this connection is waiting` } }, null)
      return
    }
    // An answer nobody waits for: a cancelled request's end (its sink went with the cancellation).
    if (isResponse(message)) this.#released(conn)
    else this.#serverEvent(conn, message)
  }

  /** A notification of no request's: a list_changed goes on only if the list changed (#checkList). */
  #serverEvent (conn: Connection, message: JsonRpcMessage): void {
    const list = isNotification(message) ? LIST_OF[message.method] : undefined
    if (list === undefined) { this.#o.onServerEvent?.(conn.server, conn.tenant, message); return }
    // Announced again while its list is read: read once more after (a burst of registrations).
    if (conn.checks.has(list)) { conn.checks.set(list, true); return }
    conn.checks.set(list, false)
    this.#checkList(conn, list, message)
      .catch(err => { conn.relay.log.warn({ err, list }, 'list change not checked') })
      .finally(() => { conn.checks.delete(list) })
  }

  /** Reads the list a list_changed is about and forwards the notification if its digest differs. */
  async #checkList (conn: Connection, list: string, message: JsonRpcMessage): Promise<void> {
    const owner = group(this.#groups, conn)
    do {
      conn.checks.set(list, false)
      const digest = await this.#listDigest(conn, list, true)
      await owner?.baseline
      if (digest !== null && owner?.lists.get(list) === digest) {
        conn.relay.log.debug({ list }, 'list_changed of a pooled backend with an unchanged list not forwarded')
        continue
      }
      if (digest !== null) owner?.lists.set(list, digest)
      this.#o.onServerEvent?.(conn.server, conn.tenant, message)
    } while (conn.checks.get(list) === true)
  }

  /** The first connection's lists (those its backend says may change), before it serves anyone. */
  async #readBaseline (conn: Connection, owner: Group, info: BackendInfo): Promise<void> {
    for (const [method, list] of Object.entries(LIST_OF)) {
      const kind = method.split('/')[1] ?? ''
      const declared = info.capabilities[kind]
      if (!isRecord(declared) || declared.listChanged !== true) continue
      const digest = await this.#listDigest(conn, list, false)
      if (digest !== null && !owner.lists.has(list)) owner.lists.set(list, digest)
    }
  }

  /**
   * A digest of a connection's whole list (every page), or null if it cannot be read. `idle`: read
   * between the connection's requests (one that serves nobody yet is read at once).
   */
  async #listDigest (conn: Connection, list: string, idle: boolean): Promise<string | null> {
    const hash = createHash('sha256')
    let cursor: string | undefined
    for (let page = 0; page < LIST_PAGES_MAX; page++) {
      const params = cursor === undefined ? {} : { cursor }
      const answer = await new Promise<JsonRpcResponse>(resolve => {
        if (idle) this.#whenIdle(conn, list, params, resolve, LIST_KEY_PREFIX)
        else this.#internal(conn, list, params, resolve, LIST_KEY_PREFIX)
      })
      if ('error' in answer || !isRecord(answer.result)) return null
      const { nextCursor, _meta: _ignored, ...items } = answer.result
      hash.update(JSON.stringify(items)).update('\n')
      if (typeof nextCursor !== 'string') return hash.digest('base64url')
      cursor = nextCursor
    }
    return null
  }

  #forget (conn: Connection): void {
    const group = this.#groups.get(`${conn.server}\0${conn.tenant ?? ''}`)
    if (group === undefined) return
    const before = group.connections.length
    group.connections = group.connections.filter(c => c !== conn)
    if (group.connections.length < before && group.waiters.length > 0) this.#openForWaiters(group)
  }

  async #close (conn: Connection, err: GatewayError): Promise<void> {
    this.#forget(conn)
    conn.relay.failAll(err)
    await this.#o.backends.stop(conn.id).catch(() => {})
  }

  /**
   * Idle connections: up to the server's poolSize stay warm (for the sessions' idle timeout; for
   * good in a pool kept warm); those opened beyond it for a burst go after EXTRA_IDLE_MS. A group
   * a listen stream holds keeps one.
   */
  #stopIdle (idleMs: number): void {
    const now = performance.now()
    for (const group of this.#groups.values()) {
      const idle = group.connections.filter(c => busy(c) === 0).sort((a, b) => b.lastUsed - a.lastUsed)
      const first = idle[0]
      const config = first === undefined ? undefined : this.#o.live.servers[first.server]
      const size = config !== undefined && 'poolSize' in config && typeof config.poolSize === 'number' ? config.poolSize : 4
      const warm = config !== undefined && keptWarm(config)
      idle.forEach((c, i) => {
        const age = now - c.lastUsed
        if ((i === 0 && group.holds > 0) || c.subscriptions.size > 0 || (warm && i < size)) return
        if (age > idleMs || (i >= size && age > Math.min(idleMs, EXTRA_IDLE_MS))) {
          c.relay.log.info('idle pooled backend connection stopped')
          this.#close(c, new GW_ERR_BACKEND_UNAVAILABLE(c.server, 'idle')).catch(() => {})
        }
      })
    }
  }
}

/** Whether a server's pool is kept at poolSize from boot: its 2025-era sessions run on it. */
function keptWarm (config: AnyServerConfig): config is StdioServerConfig {
  return kindNameOf(config) === 'pooled' && config.transport === 'stdio'
}
