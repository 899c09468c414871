// Pooled sessions (ARCHITECTURE.md flow 9, issue 26): a 2025-era session of a `sessions: pooled`
// stdio server holds no child. Its record keeps what a backend would have kept for it (the
// client's capabilities, its log level, its subscriptions); each request borrows a connection of
// the (server, tenant) pool (pool.ts) on the replica that received it and gives it back with its
// answer. No owner: any replica serves the session with its own pool, and losing a replica loses
// no session (only the requests it was running, which get -32007 as on a dedicated session).
//
// What keeps one session's traffic from another's:
// - A connection runs one request at a time (pool.ts), under a pool-wide key as its id and
//   progress token, so answers, progress, logs and the backend's server-to-client requests on
//   that connection can only belong to that request; this module maps the key back to the
//   session's own id and token. Logs are filtered by the session's level, and the connection is
//   set to that level before the request runs.
// - A server-to-client request is sent to the client only if the session declared the capability
//   it needs (else the backend hears -32601); its answer returns to the call by its opaque id,
//   on the replica the id names, and only from the session it was sent to.
// - Session-level notifications: `list_changed` goes to every session of the (server, tenant)
//   whose GET (or legacy) stream is held here, and to the replicas registered for the topic;
//   `resources/updated` only to the sessions that subscribed to that URI on this replica, whose
//   pool holds the one upstream subscription per URI.
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import type { ServerSource } from '../../config/live.js'
import {
  GW_ERR_BACKEND_CAPACITY, GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_INTERNAL, cancelledAnswer, isGatewayError, toJsonRpcError,
  withRetryAfter, type GatewayError
} from '../../core/errors.js'
import {
  errorResponse, idKey, isNotification, isRecord, isRequest, isResponse, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../../core/jsonrpc.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import type { EstablishedState, SessionRecord, SessionStore } from '../../state/session-store.js'
import { shortHash } from '../../telemetry/logger.js'
import { LISTEN_REGISTRATION_MS, listenTopic, type BackendInfo, type ConnectionPool, type PooledCall, type Reservation } from '../upstream/pool.js'
import { capabilitiesOf, isJsonStream } from '../upstream/relay.js'
import { breathe } from '../replica/upkeep.js'
import { capabilityNeededBy, isLogLevel, LOG_LEVELS } from '../../core/mcp.js'

/** Retry-After of a new session refused at a pooled server's maxSessions. */
const CAPACITY_RETRY_AFTER_S = 5
/** How often sessions that ended elsewhere (or expired) are forgotten here, and registrations renewed. */
const SWEEP_MS = 5_000
/** Session-level notifications (never a request's). */
const LIST_CHANGED = /\/list_changed$/
const RESOURCE_UPDATED = 'notifications/resources/updated'
/** Methods the gateway answers for a pooled session itself: what a backend would keep per connection. */
const ANSWERED_HERE = new Set(['initialize', 'ping', 'logging/setLevel', 'resources/subscribe', 'resources/unsubscribe'])

export interface PooledSessionsOptions {
  replicaId: string
  pool: ConnectionPool
  live: ServerSource
  store: SessionStore
  log: Logger
  /** Appends to a client stream's log and wakes its holder (ClientStreams.append). */
  append: (sid: string, streamId: string, message: JsonRpcMessage) => Promise<unknown>
  /** Whether this replica writes that stream now (ClientStreams.writes). */
  writes: (sid: string, streamId: string) => boolean
  /** Replicas that serve requests of the session now (their pending markers), for a cancellation. */
  pendingReplicas: (sid: string) => Promise<string[]>
  /** Puts a client message in another replica's inbox. */
  forward: (replica: string, sid: string, message: JsonRpcMessage) => Promise<void>
}

/** What a POST of a pooled session took before its stream opened: a connection per backend request. */
export class PooledRoute {
  readonly #reserved = new Map<JsonRpcRequest, Reservation>()

  set (request: JsonRpcRequest, reservation: Reservation): void { this.#reserved.set(request, reservation) }

  take (request: JsonRpcRequest): Reservation | undefined {
    const reservation = this.#reserved.get(request)
    this.#reserved.delete(request)
    return reservation
  }

  /** Gives back what was not used (the POST failed before its requests went out). */
  release (): void {
    for (const reservation of this.#reserved.values()) reservation.release()
    this.#reserved.clear()
  }
}

/** A request of a pooled session running on this replica. */
interface LocalCall {
  sid: string
  clientId: RequestId
  streamId: string
  call: PooledCall | null
}

export class PooledSessions {
  readonly #o: PooledSessionsOptions
  /** Requests running here, by session, then idKey(client id). */
  readonly #calls = new Map<string, Map<string, LocalCall>>()
  /** Server-to-client requests sent to a client from here, by opaque id. */
  readonly #asks = new Map<string, { sid: string, call: PooledCall }>()
  /** Sessions whose GET or legacy stream is held here, by topic key (server \0 tenant). */
  readonly #listening = new Map<string, Set<string>>()
  /** Upstream subscriptions taken here, by session: the stream their updates go to, and a release per uri. */
  readonly #subscriptions = new Map<string, { stream: string, uris: Map<string, () => void> }>()
  /** Sessions created here and not known to have ended, by server (maxSessions). */
  readonly #created = new Map<string, Set<string>>()
  readonly #sweep: NodeJS.Timeout
  #sweeping = false

  constructor (options: PooledSessionsOptions) {
    this.#o = options
    this.#sweep = setInterval(() => {
      if (this.#sweeping) return
      this.#sweeping = true
      this.#sweepNow().catch(err => { this.#o.log.warn({ err }, 'pooled sessions sweep failed') }).finally(() => { this.#sweeping = false })
    }, SWEEP_MS)
    this.#sweep.unref()
  }

  /**
   * Before a new session's record is written: the pool can describe its backend (a child started
   * and initialised once per pool, not per session), and the server's maxSessions is not reached.
   */
  async prepare (server: string, tenant: string | null): Promise<void> {
    const config = this.#o.live.servers[server]
    const max = config?.maxSessions ?? Infinity
    if ((this.#created.get(server)?.size ?? 0) >= max) {
      throw withRetryAfter(new GW_ERR_BACKEND_CAPACITY(server, max), CAPACITY_RETRY_AFTER_S)
    }
    await this.#o.pool.info(server, tenant)
  }

  created (record: SessionRecord): void {
    let set = this.#created.get(record.server)
    if (set === undefined) this.#created.set(record.server, set = new Set())
    set.add(record.id)
  }

  /** Sessions created on this replica that are still open, by server (metrics). */
  sessionsByServer (): Map<string, number> {
    const counts = new Map<string, number>()
    for (const [server, set] of this.#created) if (set.size > 0) counts.set(server, set.size)
    return counts
  }

  /**
   * Before a POST's stream opens: a pool connection for its request, if it needs the backend, so a
   * pool that stays busy is an HTTP 503 with Retry-After, not an error inside a 200 stream.
   */
  async admit (record: SessionRecord, requests: readonly JsonRpcRequest[]): Promise<PooledRoute> {
    const route = new PooledRoute()
    const wanted = requests.filter(r => !ANSWERED_HERE.has(r.method))
    // A batch (2025-03-26) takes its connections as its requests run, one at a time as they come
    // free: reserved all at once, a batch larger than poolMax would wait for its own.
    const [only] = wanted
    if (only === undefined || wanted.length > 1) return route
    route.set(only, await this.#o.pool.reserve(record.server, record.tenant ?? null))
    return route
  }

  /** One client message of a pooled session (its request's answer goes to `streamId`). */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, route?: PooledRoute): Promise<void> {
    if (isResponse(message)) { this.answer(record.id, message); return }
    if (!isRequest(message)) {
      if (message.method === 'notifications/cancelled') await this.#cancel(record.id, message, true)
      // Others (initialized, roots/list_changed) concern a backend connection the session does not hold.
      return
    }
    const target = streamId ?? (record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM)
    const reservation = route?.take(message)
    try {
      if (ANSWERED_HERE.has(message.method)) {
        reservation?.release()
        await this.#answerHere(record, message, target)
        return
      }
      this.#run(record, message, target, reservation)
    } catch (err) {
      reservation?.release()
      throw err
    }
  }

  /** The client's answer to a server-to-client request sent from here (by its opaque id). */
  answer (sid: string, response: JsonRpcResponse): boolean {
    const id = response.id
    if (typeof id !== 'string') return false
    const ask = this.#asks.get(id)
    // Only the session it was sent to may answer it.
    if (ask === undefined || ask.sid !== sid) return false
    this.#asks.delete(id)
    ask.call.answer(response)
    return true
  }

  /**
   * A client message another replica passed here (a cancellation of a request running here, an
   * answer to a request asked from here). False when nothing here knows it.
   */
  fromEnvelope (sid: string, message: JsonRpcMessage): boolean {
    if (isResponse(message)) return this.answer(sid, message)
    if (isNotification(message) && message.method === 'notifications/cancelled') {
      this.#cancel(sid, message, false).catch(() => {})
      return this.#calls.has(sid)
    }
    return false
  }

  /** A session's GET (or legacy) stream is held here now: it gets the pool's list_changed. */
  listen (record: SessionRecord): void {
    const key = topicKey(record.server, record.tenant ?? null)
    let set = this.#listening.get(key)
    if (set === undefined) {
      this.#listening.set(key, set = new Set())
      this.#register(record.server, record.tenant ?? null)
    }
    set.add(record.id)
  }

  /**
   * A session-level notification of a (server, tenant) pool: `forwarded` when another replica's
   * pool saw it (then only list_changed applies here: resources/updated belongs to the sessions
   * that subscribed on the replica whose pool holds the subscription).
   */
  onServerEvent (server: string, tenant: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    if (!isNotification(message)) return
    if (LIST_CHANGED.test(message.method)) {
      const set = this.#listening.get(topicKey(server, tenant))
      if (set === undefined) return
      for (const sid of set) {
        const stream = this.#o.writes(sid, GET_STREAM) ? GET_STREAM : this.#o.writes(sid, LEGACY_STREAM) ? LEGACY_STREAM : null
        if (stream === null) { set.delete(sid); continue }
        this.#append(sid, stream, message)
      }
      return
    }
    if (message.method !== RESOURCE_UPDATED || forwarded) return
    const uri = isRecord(message.params) ? message.params.uri : undefined
    if (typeof uri !== 'string') return
    for (const [sid, subscribed] of this.#subscriptions) {
      if (subscribed.uris.has(uri)) this.#append(sid, subscribed.stream, message)
    }
  }

  /** What this replica holds of a session ends (DELETE, idle, end-session): its calls answered with `err`. */
  endLocal (sid: string, err: GatewayError): void {
    const calls = this.#calls.get(sid)
    this.#calls.delete(sid)
    for (const local of calls?.values() ?? []) {
      local.call?.cancel('session ended')
      this.#append(sid, local.streamId, toJsonRpcError(err, local.clientId))
    }
    for (const [id, ask] of this.#asks) if (ask.sid === sid) this.#asks.delete(id)
    for (const release of this.#subscriptions.get(sid)?.uris.values() ?? []) release()
    this.#subscriptions.delete(sid)
    for (const set of this.#listening.values()) set.delete(sid)
    for (const set of this.#created.values()) set.delete(sid)
  }

  stop (): void {
    clearInterval(this.#sweep)
    for (const { uris } of this.#subscriptions.values()) for (const release of uris.values()) release()
    this.#subscriptions.clear()
  }

  // ---- requests ------------------------------------------------------------------------------

  /** What a backend would answer from its per-connection state, answered from the session's record. */
  async #answerHere (record: SessionRecord, request: JsonRpcRequest, streamId: string): Promise<void> {
    const { server } = record
    const tenant = record.tenant ?? null
    const params = isRecord(request.params) ? request.params : {}
    const reply = (result: Record<string, unknown>): void => { this.#append(record.id, streamId, { jsonrpc: '2.0', id: request.id, result }) }
    const fail = (code: number, message: string): void => { this.#append(record.id, streamId, errorResponse(request.id, code, message)) }
    switch (request.method) {
      case 'ping':
        reply({})
        return
      case 'initialize': {
        const info = await this.#info(server, tenant)
        // The client's hop has its own negotiated version (SPEC.md G-1).
        reply(initializeResult(info, record.protocolVersion))
        return
      }
      case 'logging/setLevel': {
        const info = await this.#info(server, tenant)
        if (info.capabilities.logging === undefined) { fail(JSONRPC_METHOD_NOT_FOUND, 'Method not found: logging/setLevel'); return }
        if (typeof params.level !== 'string' || !isLogLevel(params.level)) { fail(-32602, `Invalid params: level must be one of ${LOG_LEVELS.join(', ')}`); return }
        await this.#establish(record, { logLevel: { level: params.level } })
        reply({})
        return
      }
      default: {
        // resources/subscribe, resources/unsubscribe
        const info = await this.#info(server, tenant)
        const resources = info.capabilities.resources
        if (!isRecord(resources) || resources.subscribe !== true) { fail(JSONRPC_METHOD_NOT_FOUND, `Method not found: ${request.method}`); return }
        const uri = params.uri
        if (typeof uri !== 'string' || uri === '' || uri.length > 2048) { fail(-32602, 'Invalid params: uri must be a non-empty string'); return }
        const current = new Set(record.established?.subscriptions ?? [])
        if (request.method === 'resources/subscribe') {
          await this.#subscribe(record, uri)
          current.add(uri)
        } else {
          const uris = this.#subscriptions.get(record.id)?.uris
          uris?.get(uri)?.()
          uris?.delete(uri)
          current.delete(uri)
        }
        await this.#establish(record, { subscriptions: [...current] })
        reply({})
      }
    }
  }

  async #info (server: string, tenant: string | null): Promise<BackendInfo> {
    return await this.#o.pool.info(server, tenant)
  }

  /** One upstream subscription per uri per pool (the pool counts them); resources/updated come back here. */
  async #subscribe (record: SessionRecord, uri: string): Promise<void> {
    if (this.#subscriptions.get(record.id)?.uris.has(uri) === true) return
    const release = await this.#o.pool.hold(record.server, record.tenant ?? null, [uri])
    let subscribed = this.#subscriptions.get(record.id)
    if (subscribed === undefined) this.#subscriptions.set(record.id, subscribed = { stream: record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM, uris: new Map() })
    if (subscribed.uris.has(uri)) { release(); return }
    subscribed.uris.set(uri, release)
  }

  /** Stores what the session established (its record is the backend's memory of it). */
  async #establish (record: SessionRecord, patch: Partial<EstablishedState>): Promise<void> {
    const established: EstablishedState = {
      initialized: true,
      logLevel: null,
      subscriptions: [],
      backendVersion: null,
      ...record.established,
      ...patch
    }
    record.established = established
    await this.#o.store.update(record.id, { established })
  }

  /** A request on a pooled connection: its key replaces its id and progress token there. */
  #run (record: SessionRecord, request: JsonRpcRequest, streamId: string, reservation: Reservation | undefined): void {
    const sid = record.id
    const local: LocalCall = { sid, clientId: request.id, streamId, call: null }
    let calls = this.#calls.get(sid)
    if (calls === undefined) this.#calls.set(sid, calls = new Map())
    const id = idKey(request.id)
    calls.set(id, local)
    const sink = new SessionSink(this, record, request, local)
    const build = (key: string): JsonRpcRequest => {
      const params = isRecord(request.params) ? request.params : undefined
      if (params === undefined || progressTokenOf(request) === undefined) return { ...request, id: key }
      const meta = params._meta as Record<string, unknown>
      return { ...request, id: key, params: { ...params, _meta: { ...meta, progressToken: key } } }
    }
    const logLevel = levelOf(record.established?.logLevel)
    const started = reservation !== undefined
      ? Promise.resolve(reservation.run(build, sink, { logLevel }))
      : this.#o.pool.call(record.server, record.tenant ?? null, build, sink, { logLevel })
    started.then(call => {
      // Ended (or cancelled) while it waited for a connection: the backend is told at once.
      if (this.#calls.get(sid)?.get(id) !== local) { call.cancel('session ended or request cancelled'); return }
      local.call = call
    }, (err: unknown) => {
      this.#settled(local)
      const gwErr = isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(record.server, err instanceof Error ? err.message : String(err))
      this.#append(sid, streamId, toJsonRpcError(gwErr, request.id))
    })
  }

  /** The request is over here (answered, failed, cancelled). */
  #settled (local: LocalCall): void {
    const calls = this.#calls.get(local.sid)
    const id = idKey(local.clientId)
    if (calls?.get(id) !== local) return
    calls.delete(id)
    if (calls.size === 0) this.#calls.delete(local.sid)
  }

  /**
   * notifications/cancelled of a request running here: the backend is told, and the request's
   * stream gets the cancelled mark (never sent; it settles the request, U-CAN-1). A request
   * running on another replica (one the session's pending markers name) is told there.
   */
  async #cancel (sid: string, message: JsonRpcMessage, passOn: boolean): Promise<void> {
    const params = 'params' in message && isRecord(message.params) ? message.params : {}
    const requestId = params.requestId
    if (typeof requestId !== 'string' && typeof requestId !== 'number') return
    const local = this.#calls.get(sid)?.get(idKey(requestId))
    if (local !== undefined) {
      this.#settled(local)
      local.call?.cancel(typeof params.reason === 'string' ? params.reason.slice(0, 200) : 'cancelled by the client')
      this.#append(sid, local.streamId, cancelledAnswer(local.clientId))
      return
    }
    if (!passOn) return
    for (const replica of await this.#o.pendingReplicas(sid)) {
      if (replica !== this.#o.replicaId) await this.#o.forward(replica, sid, message).catch(() => {})
    }
  }

  // ---- backend -> client ---------------------------------------------------------------------

  /** @internal SessionSink: a message of a call, for its client stream. */
  deliver (local: LocalCall, message: JsonRpcMessage, final: boolean): void {
    if (final) {
      if (this.#calls.get(local.sid)?.get(idKey(local.clientId)) !== local) return // cancelled or ended
      this.#settled(local)
    }
    // A JSON-mode stream carries only answers: what comes before goes to the GET stream (flow 2).
    this.#append(local.sid, !final && isJsonStream(local.streamId) ? GET_STREAM : local.streamId, message)
  }

  /** @internal SessionSink: a server-to-client request of a call, sent to the client under its opaque id. */
  ask (local: LocalCall, request: JsonRpcRequest): void {
    if (local.call === null) {
      // The call is handed back in the turn its request was sent: a request this early waits for it.
      if (this.#calls.get(local.sid)?.get(idKey(local.clientId)) === local) setImmediate(() => { this.ask(local, request) })
      return
    }
    this.#asks.set(String(request.id), { sid: local.sid, call: local.call })
    this.#append(local.sid, isJsonStream(local.streamId) ? GET_STREAM : local.streamId, request)
  }

  /** @internal SessionSink: the backend withdrew a server-to-client request. */
  withdraw (id: unknown): void {
    if (typeof id === 'string') this.#asks.delete(id)
  }

  #append (sid: string, streamId: string, message: JsonRpcMessage): void {
    this.#o.append(sid, streamId, message).catch(err => { this.#o.log.warn({ err, sid: shortHash(sid) }, 'pooled session message not appended') })
  }

  // ---- upkeep --------------------------------------------------------------------------------

  #register (server: string, tenant: string | null): void {
    this.#o.store.addListener(listenTopic(server, tenant), this.#o.replicaId, LISTEN_REGISTRATION_MS)
      .catch(err => { this.#o.log.warn({ err, server }, 'pooled sessions: event registration failed') })
  }

  /** Forgets sessions that ended elsewhere or expired (their subscriptions let go), renews registrations. */
  async #sweepNow (): Promise<void> {
    const started = performance.now()
    for (const [key, set] of this.#listening) {
      for (const sid of set) if (!this.#o.writes(sid, GET_STREAM) && !this.#o.writes(sid, LEGACY_STREAM)) set.delete(sid)
      if (set.size === 0) { this.#listening.delete(key); continue }
      const [server = '', tenant = ''] = key.split('\0')
      this.#register(server, tenant === '' ? null : tenant)
    }
    const known = new Set<string>([...this.#subscriptions.keys()])
    for (const set of this.#created.values()) for (const sid of set) known.add(sid)
    let i = 0
    const batch: string[] = []
    const check = async (): Promise<void> => {
      const alive = await Promise.all(batch.map(async sid => await this.#o.store.exists(sid).catch(() => true)))
      batch.forEach((sid, n) => { if (alive[n] === false) this.endLocal(sid, new GW_ERR_INTERNAL('session expired')) })
      batch.length = 0
    }
    for (const sid of known) {
      await breathe(i++)
      batch.push(sid)
      if (batch.length >= 100) await check()
    }
    await check()
    const ms = performance.now() - started
    if (ms > 1000) this.#o.log.info({ sessions: known.size, ms: Math.round(ms) }, 'pooled sessions sweep was slow')
  }
}

/** Receives what the pool sends of one call of a session, in the session's own terms. */
class SessionSink {
  readonly #owner: PooledSessions
  readonly #local: LocalCall
  readonly #progressToken: RequestId | undefined
  readonly #capabilities: Record<string, unknown>
  readonly #minLevel: number

  constructor (owner: PooledSessions, record: SessionRecord, request: JsonRpcRequest, local: LocalCall) {
    this.#owner = owner
    this.#local = local
    this.#progressToken = progressTokenOf(request)
    this.#capabilities = capabilitiesOf(record.initializeParams)
    const level = levelOf(record.established?.logLevel)
    this.#minLevel = level === null ? 0 : isLogLevel(level) ? LOG_LEVELS.indexOf(level) : 0
  }

  onMessage (message: JsonRpcMessage): void {
    const local = this.#local
    if (isResponse(message)) {
      this.#owner.deliver(local, { ...message, id: local.clientId } as JsonRpcResponse, true)
      return
    }
    if (isRequest(message)) {
      const capability = capabilityNeededBy(message.method)
      if (capability !== undefined && this.#capabilities[capability] === undefined) {
        // Never forward what the client did not declare (SPEC.md L-4, G-3).
        local.call?.answer(errorResponse(message.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${message.method} (no '${capability}' capability)`))
        return
      }
      this.#owner.ask(local, message)
      return
    }
    const params = isRecord(message.params) ? message.params : {}
    switch (message.method) {
      case 'notifications/progress':
        if (this.#progressToken === undefined) return
        this.#owner.deliver(local, { ...message, params: { ...params, progressToken: this.#progressToken } }, false)
        return
      case 'notifications/message': {
        const level = isLogLevel(params.level) ? LOG_LEVELS.indexOf(params.level) : -1
        if (level >= 0 && level < this.#minLevel) return
        this.#owner.deliver(local, message, false)
        return
      }
      case 'notifications/cancelled':
        this.#owner.withdraw(params.requestId)
        this.#owner.deliver(local, message, false)
        return
      default:
        this.#owner.deliver(local, message, false)
    }
  }
}

/** The initialize result of a pooled session: the pool's backend as it described itself, at the client's version. */
export function initializeResult (info: BackendInfo, protocolVersion: string): Record<string, unknown> {
  return {
    protocolVersion,
    capabilities: info.capabilities,
    serverInfo: info.serverInfo,
    ...(info.instructions !== undefined ? { instructions: info.instructions } : {})
  }
}

function levelOf (logLevel: Record<string, unknown> | null | undefined): string | null {
  const level = logLevel?.level
  return typeof level === 'string' ? level : null
}

function topicKey (server: string, tenant: string | null): string {
  return `${server}\0${tenant ?? ''}`
}
