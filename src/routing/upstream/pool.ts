// Modern (2026-07-28) requests in front of a legacy backend, and pooled sessions (docs/architecture.md,
// "A 2026-07-28 request" and "A pooled call"): a small pool of initialised backend connections per
// (server, tenant) on this replica, so no child is started per request and no session is kept for
// the client. This module schedules: which connection a request gets, who waits, which connections
// stay open. A connection itself (opening it, its initialize, its crashes, its keys) is
// pool-connection.ts; the list_changed filter is list-changes.ts.
//
// - Ids: each request gets a pool-wide key `m<n>` as its client id and its stream id, so requests
//   of different clients never meet in a relay (its id mapping and progress tokens are keyed by
//   them); the relay mints the backend's ids as for any session. The caller maps the key back
//   (progress-tokens.ts).
// - Scheduling: one request per connection, so what a backend sends without a request id (logs,
//   server-to-client requests) belongs to the one request in flight: an idle connection, else a
//   new one, up to `poolMax` per (server, tenant); past it a request waits in line for the next
//   connection to come free, for at most `poolWaitMs`, then gets GW_ERR_POOL_BUSY (503,
//   Retry-After). Requests never share a connection.
//   `poolSize` connections stay warm when idle; more are opened for a burst and stopped when idle.
//   The pools of `sessions: pooled` servers are opened to poolSize at boot and after a reload
//   (warm()), in the background, and keep poolSize while idle; other pools fill on first use.
// - Pooled sessions (kinds/pooled-sessions.ts) and 2026-07-28 requests (http/modern.ts) run on the
//   same pool.
// - A connection is initialised by the pool (the client sent no initialize): latest legacy
//   version, the client capabilities the gateway can bridge (sampling, elicitation, roots, as
//   `input_required` rounds: mrtr.ts). What the first one learns (capabilities, server info,
//   instructions) answers `server/discover` without a backend round trip.
// - An idle connection is stopped after the sessions' idle timeout.
// - Per-user credentials: a server whose credential is one user's (token exchange, user
//   authorization: `ownConnections`) keeps a pool per (server, tenant, subject digest), so a
//   connection, and the child behind it, only ever serves the subject whose credential it holds.
//   poolSize and poolMax apply to each of those pools; they are not warmed at boot (no subject yet).
// - Tasks: the requests about a task go to the connection that holds it, which is kept while it
//   holds live ones (pool-tasks.ts). Who waits in line, and for how long: pool-waiters.ts.
import { performance } from 'node:perf_hooks'
import type { ServerSource } from '../../config/live.js'
import type { BackendServerConfig as ServerConfig, ServerConfig as AnyServerConfig, StdioServerConfig } from '../../config/schema.js'
import { isAggregateConfig, kindNameOf } from '../../config/server-kind.js'
import { GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_CREDENTIAL_REQUIRED, GW_ERR_SERVER_NOT_FOUND, GW_ERR_SHUTTING_DOWN, isGatewayError, withData, type GatewayError } from '../../core/errors.js'
import type { JsonRpcMessage, JsonRpcRequest } from '../../core/jsonrpc.js'
import type { BackendInfo } from './gateway-relay.js'
import { forwardIfChanged, ListDigests } from './list-changes.js'
import { PoolConnection, type ConnectionContext, type ConnectionSettings, type PooledCall, type PoolSink, type RunOptions } from './pool-connection.js'
import { TaskConnections, type TaskWatcher } from './pool-tasks.js'
import { poolBusy, refuseAll, waitInLine, type Waiter } from './pool-waiters.js'
import { poolKey, serverTenantKey } from './ports.js'
import { asGatewayError } from './relay.js'

export type { BackendInfo } from './gateway-relay.js'
export type { PooledCall, PoolSink, RunOptions } from './pool-connection.js'
export type { TaskWatcher } from './pool-tasks.js'

/** A connection set aside for one request (reserve()): run it, or release it unused. */
export interface Reservation {
  /** The connection reserved (PooledCall.connectionId once run). */
  readonly connectionId: string
  run (build: (key: string) => JsonRpcRequest, sink: PoolSink, options?: RunOptions): PooledCall
  release (): void
}

/** A (server, tenant) pool's figures now (metrics). */
export interface PoolStats {
  server: string
  tenant: string | null
  connections: number
  busy: number
  waiting: number
}

export interface ConnectionPoolOptions extends ConnectionSettings {
  live: ServerSource
  /**
   * Whether each subject of `tenant` needs connections of its own to `server` (a per-user
   * credential): its pool is then keyed by (server, tenant, subject digest).
   */
  ownConnections?: (server: string, tenant: string | null) => boolean
  /**
   * Session-level messages of a backend (list_changed, resources/updated), for listen streams;
   * `subject`: the one subject whose pool saw it (a per-user credential), null for a tenant's pool.
   */
  onServerEvent?: (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage) => void
}

/** How long a replica's registration for a pool's session-level events lives unless renewed (a third of it apart). */
export const LISTEN_REGISTRATION_MS = 15_000

/**
 * The registry topic of a pool: replicas registered for it (SessionStore.addListener) get the
 * session-level notifications (list_changed, resources/updated) another replica's pool sees. A
 * per-user pool's topic names its subject (eventSubject), so its events reach that subject's
 * sessions and listen streams only: a resource URI or list of one user's backend account is no
 * other user's to see.
 */
export const listenTopic = (server: string, tenant: string | null, subject: string | null = null): string =>
  subject === null ? `${server}:${tenant ?? ''}` : `${server}:${tenant ?? ''}\0${subject}`

/** Connections opened beyond poolSize for a burst are stopped after this long idle. */
const EXTRA_IDLE_MS = 30_000
/** Longest a request waits in line for a connection when the pool is at poolMax (default of poolWaitMs). */
export const POOL_WAIT_MS = 10_000
/** Attempts to open a pool's warm connections (boot, reload) before it is left to fill on use. */
const WARM_ATTEMPTS = 5
/** First delay between warm attempts, doubled per failure. */
const WARM_RETRY_MS = 1000

/** The connections of one (server, tenant), and what waits for them. */
interface Group {
  server: string
  tenant: string | null
  /** The one subject its connections serve (a per-user credential); null: all the tenant's users. */
  subjectDigest: string | null
  connections: PoolConnection[]
  info: BackendInfo | null
  /** Listen streams that need the group's connections kept (no idle stop while > 0). */
  holds: number
  /** Connections being opened for a claim (counted against poolMax). */
  opening: number
  /** Requests waiting for a connection, first come first served. */
  waiters: Waiter[]
  /** The connection being opened for whoever needs any (discover, a pooled initialize, listen) while the group has none. */
  first: Promise<PoolConnection> | null
  /** The lists as the sessions could last have seen them (list_changed filter). */
  lists: ListDigests
}

export class ConnectionPool {
  readonly #options: ConnectionPoolOptions
  /** What each connection needs of the pool: the options it shares, and the pool's bookkeeping. */
  readonly #context: ConnectionContext
  readonly #groups = new Map<string, Group>()
  /** The connections holding tasks: who waits for one of them alone, their pins, who hears about the tasks. */
  readonly #tasks = new TaskConnections()
  readonly #sweep: NodeJS.Timeout
  #seq = 0
  #stopping = false

  constructor (options: ConnectionPoolOptions) {
    this.#options = options
    this.#context = {
      ...options,
      nextSeq: () => ++this.#seq,
      released: conn => { this.#released(conn) },
      forget: conn => { this.#forget(conn) },
      serverEvent: (conn, message) => {
        forwardIfChanged(conn, message, this.#groupOf(conn)?.lists, event => { options.onServerEvent?.(conn.server, conn.tenant, conn.subjectDigest, event) })
      },
      taskMessage: (conn, message) => this.#tasks.message(conn, message),
      lost: (conn, reason) => { this.#tasks.lost(conn, reason) }
    }
    const idleMs = options.config.sessions.idleTimeoutMs
    this.#sweep = setInterval(() => { this.#stopIdle(idleMs) }, Math.max(1000, Math.min(10_000, Math.floor(idleMs / 2))))
    this.#sweep.unref()
  }

  /** What the backend said about itself (server/discover): learned once per (server, tenant). */
  async info (server: string, tenant: string | null, subject?: string): Promise<BackendInfo> {
    const group = this.#group(server, tenant, subject)
    if (group.info !== null) return group.info
    await this.#acquire(group, false)
    if (group.info === null) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'the backend did not describe itself')
    return group.info
  }

  /**
   * Keeps the group's connections open while a listen stream waits for their notifications (at
   * least one connection is opened), subscribed upstream to `uris`; the returned function lets go.
   */
  async hold (server: string, tenant: string | null, uris: readonly string[] = [], subject?: string): Promise<() => void> {
    const group = this.#group(server, tenant, subject)
    group.holds++
    let held = true
    let conn: PoolConnection | undefined
    const release = (): void => {
      if (!held) return
      held = false
      group.holds--
      if (conn !== undefined) conn.unsubscribe(uris, this.#groupOf(conn)?.connections.includes(conn) === true)
    }
    try {
      conn = await this.#acquire(group, false)
      if (uris.length > 0) conn.subscribe(uris)
      else conn = undefined
    } catch (err) {
      release()
      throw err
    }
    return release
  }

  /**
   * Runs one request (its id replaced by the returned key, and its progress token, if any, by the
   * same key: progress-tokens.ts) on a pooled connection; everything about it reaches `sink`.
   */
  async call (server: string, tenant: string | null, build: (key: string) => JsonRpcRequest, sink: PoolSink, options?: RunOptions, subject?: string): Promise<PooledCall> {
    return (await this.reserve(server, tenant, subject)).run(build, sink, options)
  }

  /**
   * A connection of the (server, tenant) pool for one request, taken now: an idle one, a new one
   * (up to poolMax), or the next to come free (waiting at most POOL_WAIT_MS; then
   * GW_ERR_POOL_BUSY). Run the request on it, or release it.
   */
  async reserve (server: string, tenant: string | null, subject?: string): Promise<Reservation> {
    return this.#reservation(await this.#acquire(this.#group(server, tenant, subject), true))
  }

  /**
   * The connection `connectionId` of the (server, tenant) pool for one request (the requests about
   * a task go to the connection that holds it): now if idle, else when it comes free, waiting at
   * most poolWaitMs (GW_ERR_POOL_BUSY). GW_ERR_BACKEND_UNAVAILABLE when the connection is gone.
   */
  async reserveOn (server: string, tenant: string | null, connectionId: string, subject?: string): Promise<Reservation> {
    if (this.#stopping) throw new GW_ERR_SHUTTING_DOWN()
    const config = this.#serverConfig(server)
    const group = this.#group(server, tenant, subject)
    const conn = group.connections.find(c => c.id === connectionId)
    if (conn === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'the connection holding the task is gone')
    if (conn.busy === 0) {
      conn.claims++
      return this.#reservation(conn)
    }
    return this.#reservation(await this.#tasks.wait(conn, config.poolWaitMs ?? POOL_WAIT_MS))
  }

  /**
   * Keeps a connection from being stopped as idle while a task lives on it; the returned function
   * lets go (undefined: no such connection now).
   */
  pin (server: string, tenant: string | null, connectionId: string, subject?: string): (() => void) | undefined {
    const conn = this.#groups.get(poolKey(server, tenant, this.#subjectOf(server, tenant, subject)))?.connections.find(c => c.id === connectionId)
    return conn === undefined ? undefined : this.#tasks.pin(conn)
  }

  /** Hears about the tasks on the pool's connections (the returned function stops it). */
  watchTasks (watcher: TaskWatcher): () => void {
    return this.#tasks.watch(watcher)
  }

  #reservation (conn: PoolConnection): Reservation {
    let used = false
    return {
      connectionId: conn.id,
      run: (build, sink, options) => {
        if (used) throw new Error('reservation used twice')
        used = true
        return conn.run(build, sink, options)
      },
      release: () => {
        if (used) return
        used = true
        conn.claims--
        this.#released(conn)
      }
    }
  }

  /**
   * Opens the pools of `sessions: pooled` servers to poolSize for each tenant that may use them
   * (boot, reload), in the background: what is already open counts, a failure is logged and
   * retried with backoff, and nothing here delays readiness.
   */
  warm (tenantsOf: (server: string) => ReadonlyArray<string | null>): void {
    for (const [server, config] of Object.entries(this.#options.live.servers)) {
      if (!keptWarm(config)) continue
      // A pool per subject fills on the subject's first request: no subject is known at boot.
      for (const tenant of tenantsOf(server)) if (this.#options.ownConnections?.(server, tenant) !== true) this.#topUp(server, tenant, 0)
    }
  }

  #topUp (server: string, tenant: string | null, failures: number): void {
    const fill = async (): Promise<void> => {
      if (this.#stopping) return
      const config = this.#serverConfig(server)
      if (!keptWarm(config)) return
      const group = this.#group(server, tenant)
      await this.#acquire(group, false)
      const missing = (config.poolSize ?? 4) - group.connections.length - group.opening
      await Promise.all(Array.from({ length: Math.max(0, missing) }, async () => {
        group.opening++
        try {
          this.#released(await this.#open(group, config, false))
        } finally {
          group.opening--
        }
      }))
    }
    fill().catch((err: unknown) => {
      if (this.#stopping || (isGatewayError(err) && err.code === 'GW_ERR_SERVER_NOT_FOUND')) return
      const attempt = failures + 1
      const log = this.#options.log.child({ backend: server, tenant })
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
    // A tenant's per-subject pools are summed: subjects are never metric labels.
    const byTenant = new Map<string, PoolStats>()
    for (const g of this.#groups.values()) {
      const key = serverTenantKey(g.server, g.tenant)
      const stats = byTenant.get(key) ?? { server: g.server, tenant: g.tenant, connections: 0, busy: 0, waiting: 0 }
      stats.connections += g.connections.length
      stats.busy += g.connections.filter(c => c.busy > 0).length
      stats.waiting += g.waiters.length
      byTenant.set(key, stats)
    }
    return [...byTenant.values()]
  }

  /**
   * A request on `conn` ended: a request of the pool's own waiting for it runs, else the connection
   * goes to the first request waiting in line, if any.
   */
  #released (conn: PoolConnection): void {
    if (conn.busy !== 0) return
    if (conn.runDeferred()) return
    const group = this.#groupOf(conn)
    if (group === undefined || !group.connections.includes(conn)) return
    // Requests that can use only this connection (a task's) go before those that can use any.
    const waiter = this.#tasks.next(conn) ?? group.waiters.shift()
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
      this.#open(group, config, true)
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
      refuseAll(group.waiters, new GW_ERR_BACKEND_UNAVAILABLE(group.server, reason))
      for (const c of group.connections) stops.push(c.close(new GW_ERR_BACKEND_UNAVAILABLE(c.server, reason)))
    }
    await Promise.all(stops)
  }

  /** Shutdown: every pooled request is answered, every connection stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    clearInterval(this.#sweep)
    for (const group of this.#groups.values()) refuseAll(group.waiters, new GW_ERR_SHUTTING_DOWN())
    const all = [...this.#groups.values()].flatMap(g => g.connections)
    this.#groups.clear()
    await Promise.all(all.map(async c => { await c.close(new GW_ERR_SHUTTING_DOWN()) }))
  }

  /** The tenant's pool, or the subject's own for a per-user credential (none without a subject). */
  #group (server: string, tenant: string | null, subject?: string): Group {
    const subjectDigest = this.#subjectOf(server, tenant, subject)
    const key = poolKey(server, tenant, subjectDigest)
    let group = this.#groups.get(key)
    if (group === undefined) {
      group = { server, tenant, subjectDigest, connections: [], info: null, holds: 0, opening: 0, waiters: [], first: null, lists: new ListDigests() }
      this.#groups.set(key, group)
    }
    return group
  }

  /**
   * Whose events a caller of (server, tenant) hears: `subject` where each subject has a pool of its
   * own (onServerEvent names it), null where the tenant's users share one.
   */
  eventSubject (server: string, tenant: string | null, subject: string | undefined): string | null {
    return this.#options.ownConnections?.(server, tenant) === true ? subject ?? null : null
  }

  #subjectOf (server: string, tenant: string | null, subject: string | undefined): string | null {
    if (this.#options.ownConnections?.(server, tenant) !== true) return null
    if (subject === undefined) throw withData(new GW_ERR_CREDENTIAL_REQUIRED(server, 'each user has backend connections of their own, and this request names none'), { server })
    return subject
  }

  /** The group a connection belongs to (none once its pool ended). */
  #groupOf (conn: PoolConnection): Group | undefined {
    return this.#groups.get(poolKey(conn.server, conn.tenant, conn.subjectDigest))
  }

  #poolMax (server: string): number {
    const config = Object.hasOwn(this.#options.live.servers, server) ? this.#options.live.servers[server] : undefined
    return config?.poolMax ?? 16
  }

  #serverConfig (server: string): ServerConfig {
    const servers = this.#options.live.servers
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
  async #acquire (group: Group, claim: boolean): Promise<PoolConnection> {
    if (this.#stopping) throw new GW_ERR_SHUTTING_DOWN()
    const config = this.#serverConfig(group.server)
    const first = group.connections[0]
    if (!claim && first !== undefined) return first
    if (!claim) {
      // One connection for all of them: a burst of new pooled sessions (each initialize asks for
      // the backend's description) opened a child each, past poolMax, until the first was ready.
      group.first ??= this.#open(group, config, false).finally(() => { group.first = null })
      return await group.first
    }
    const idle = group.connections.find(c => c.busy === 0)
    if (idle !== undefined) {
      idle.claims++
      return idle
    }
    if (group.connections.length + group.opening < (config.poolMax ?? 16)) {
      group.opening++
      try {
        return await this.#open(group, config, true)
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
  async #wait (group: Group, config: ServerConfig): Promise<PoolConnection> {
    const waitMs = config.poolWaitMs ?? POOL_WAIT_MS
    return await waitInLine(group.waiters, waitMs, () => poolBusy(group.server, group.connections.length, waitMs))
  }

  /**
   * A new connection of `group` (`claim`: reserved for the request it is opened for), lent once its
   * backend is initialised and, for the group's first, its lists are read.
   */
  async #open (group: Group, config: ServerConfig, claim: boolean): Promise<PoolConnection> {
    const conn = new PoolConnection(this.#context, group.server, group.tenant, group.subjectDigest, config, claim)
    try {
      const info = await conn.connect()
      // A reload ended the pool while this connection started: it must not outlive it.
      if (this.#stopping || this.#groupOf(conn) !== group) throw new GW_ERR_BACKEND_UNAVAILABLE(group.server, 'the pool ended while the backend started')
      group.info ??= info
      // Before the first connection serves anyone: what its lists are is what the sessions see.
      await group.lists.baselineFrom(conn, info)
      group.connections.push(conn)
      conn.relay.log.info({ protocolVersion: info.protocolVersion }, 'pooled backend connection ready')
      return conn
    } catch (err) {
      await conn.stopBackend()
      throw asGatewayError(err, group.server)
    }
  }

  #forget (conn: PoolConnection): void {
    this.#tasks.gone(conn)
    const group = this.#groupOf(conn)
    if (group === undefined) return
    const before = group.connections.length
    group.connections = group.connections.filter(c => c !== conn)
    if (group.connections.length < before && group.waiters.length > 0) this.#openForWaiters(group)
  }

  /**
   * Idle connections: up to the server's poolSize stay warm (for the sessions' idle timeout; for
   * good in a pool kept warm); those opened beyond it for a burst go after EXTRA_IDLE_MS. A group
   * a listen stream holds keeps one.
   */
  #stopIdle (idleMs: number): void {
    const now = performance.now()
    for (const [key, group] of this.#groups) {
      // A user's pool with nothing left goes: one per user ever seen would only grow.
      if (group.subjectDigest !== null && group.connections.length === 0 && group.opening === 0 && group.waiters.length === 0 && group.holds === 0 && group.first === null) {
        this.#groups.delete(key)
        continue
      }
      const idle = group.connections.filter(c => c.busy === 0).sort((a, b) => b.lastUsed - a.lastUsed)
      const first = idle[0]
      const config = first === undefined ? undefined : this.#options.live.servers[first.server]
      const size = config !== undefined && 'poolSize' in config && typeof config.poolSize === 'number' ? config.poolSize : 4
      const warm = config !== undefined && keptWarm(config)
      idle.forEach((c, i) => {
        const age = now - c.lastUsed
        // A connection holding live tasks keeps them: stopping it would lose them.
        if ((i === 0 && group.holds > 0) || c.subscriptions.size > 0 || c.pins > 0 || (warm && i < size)) return
        if (age > idleMs || (i >= size && age > Math.min(idleMs, EXTRA_IDLE_MS))) {
          c.relay.log.info('idle pooled backend connection stopped')
          c.close(new GW_ERR_BACKEND_UNAVAILABLE(c.server, 'idle')).catch(() => {})
        }
      })
    }
  }
}

/** Whether a server's pool is kept at poolSize from boot: its 2025-era sessions run on it. */
function keptWarm (config: AnyServerConfig): config is StdioServerConfig {
  return kindNameOf(config) === 'pooled' && config.transport === 'stdio'
}
