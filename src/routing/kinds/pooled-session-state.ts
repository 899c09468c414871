// What a backend would have kept per connection for a pooled session, kept by the gateway instead
// (the session holds no connection: kinds/pooled-sessions.ts runs its requests on the pool): the
// session's record holds its log level and subscriptions, and this replica holds who listens here,
// which upstream subscriptions it took, and how many sessions it created (maxSessions).
//
// - The methods a backend answers from that state (initialize, ping, logging/setLevel,
//   resources/subscribe and unsubscribe) are answered here, from the record and the pool's
//   description of its backend.
// - Session-level notifications: `list_changed` goes to every session of the (server, tenant)
//   whose GET (or legacy) stream is held here, and to the replicas registered for the topic;
//   `resources/updated` only to the sessions that subscribed to that URI on this replica, whose
//   pool holds the one upstream subscription per URI. Where each subject has a pool of its own (a
//   per-user credential) both go to that subject's sessions only, and the topic names the subject
//   (listenTopic): one user's backend account shows nothing of itself to another.
import type { Logger } from 'pino'
import type { ServerSource } from '../../config/live.js'
import { GW_ERR_BACKEND_CAPACITY, withRetryAfter } from '../../core/errors.js'
import { errorResponse, isNotification, isRecord, JSONRPC_METHOD_NOT_FOUND, type JsonRpcMessage, type JsonRpcRequest } from '../../core/jsonrpc.js'
import { isLogLevel, LOG_LEVELS } from '../../core/mcp.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import type { EstablishedState, SessionRecord, SessionStore } from '../../state/session-store.js'
import { LISTEN_REGISTRATION_MS, listenTopic, type BackendInfo, type ConnectionPool } from '../upstream/pool.js'
import { poolKey } from '../upstream/ports.js'

/** Retry-After of a new session refused at a pooled server's maxSessions. */
const CAPACITY_RETRY_AFTER_S = 5
/** Session-level notifications (never a request's). */
const LIST_CHANGED = /\/list_changed$/
const RESOURCE_UPDATED = 'notifications/resources/updated'
/** Methods the gateway answers for a pooled session itself: what a backend would keep per connection. */
export const ANSWERED_HERE: ReadonlySet<string> = new Set(['initialize', 'ping', 'logging/setLevel', 'resources/subscribe', 'resources/unsubscribe'])

export interface PooledSessionStateOptions {
  replicaId: string
  pool: ConnectionPool
  live: ServerSource
  store: SessionStore
  log: Logger
  /** Appends to a client stream (failures logged by the caller). */
  append: (sid: string, streamId: string, message: JsonRpcMessage) => void
  /** Whether this replica writes that stream now (ClientStreams.writes). */
  writes: (sid: string, streamId: string) => boolean
}

/** The sessions of one (server, tenant) pool whose GET or legacy stream is held here. */
interface Listeners {
  server: string
  tenant: string | null
  /** The one subject whose pool they hear (a per-user credential); null: the tenant's pool. */
  subject: string | null
  sessions: Set<string>
}

export class PooledSessionState {
  readonly #options: PooledSessionStateOptions
  /** Sessions whose GET or legacy stream is held here, by the poolKey of the pool whose events they hear. */
  readonly #listening = new Map<string, Listeners>()
  /** Upstream subscriptions taken here, by session: the stream their updates go to, whose pool's updates they hear, and a release per uri. */
  readonly #subscriptions = new Map<string, { stream: string, subject: string | null, uris: Map<string, () => void> }>()
  /** Sessions created here and not known to have ended, by server (maxSessions). */
  readonly #created = new Map<string, Set<string>>()

  constructor (options: PooledSessionStateOptions) {
    this.#options = options
  }

  /**
   * Before a new session's record is written: the pool can describe its backend (a child started
   * and initialised once per pool, not per session), and the server's maxSessions is not reached.
   */
  async prepare (server: string, tenant: string | null, subject?: string): Promise<void> {
    const config = this.#options.live.servers[server]
    const max = config?.maxSessions ?? Infinity
    if ((this.#created.get(server)?.size ?? 0) >= max) {
      throw withRetryAfter(new GW_ERR_BACKEND_CAPACITY(server, max), CAPACITY_RETRY_AFTER_S)
    }
    await this.#options.pool.info(server, tenant, subject)
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

  /** Sessions this replica keeps anything of (created here, or subscribed here). */
  sessionsKnown (): Set<string> {
    const known = new Set<string>([...this.#subscriptions.keys()])
    for (const set of this.#created.values()) for (const sid of set) known.add(sid)
    return known
  }

  /** A session's GET (or legacy) stream is held here now: it gets the pool's list_changed. */
  listen (record: SessionRecord): void {
    const tenant = record.tenant ?? null
    const subject = this.#options.pool.eventSubject(record.server, tenant, record.subjectDigest)
    const key = poolKey(record.server, tenant, subject)
    let listeners = this.#listening.get(key)
    if (listeners === undefined) {
      this.#listening.set(key, listeners = { server: record.server, tenant, subject, sessions: new Set() })
      this.#register(record.server, tenant, subject)
    }
    listeners.sessions.add(record.id)
  }

  /** Forgets listeners whose stream is no longer held here, and renews this replica's registration for the topics still heard. */
  renewListening (): void {
    for (const [key, { server, tenant, subject, sessions }] of this.#listening) {
      for (const sid of sessions) if (!this.#options.writes(sid, GET_STREAM) && !this.#options.writes(sid, LEGACY_STREAM)) sessions.delete(sid)
      if (sessions.size === 0) { this.#listening.delete(key); continue }
      this.#register(server, tenant, subject)
    }
  }

  /**
   * A session-level notification of a (server, tenant) pool, or of `subject`'s own: `forwarded`
   * when another replica's pool saw it (then only list_changed applies here: resources/updated
   * belongs to the sessions that subscribed on the replica whose pool holds the subscription).
   */
  onServerEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    if (!isNotification(message)) return
    if (LIST_CHANGED.test(message.method)) {
      const sessions = this.#listening.get(poolKey(server, tenant, subject))?.sessions
      if (sessions === undefined) return
      for (const sid of sessions) {
        const stream = this.#options.writes(sid, GET_STREAM) ? GET_STREAM : this.#options.writes(sid, LEGACY_STREAM) ? LEGACY_STREAM : null
        if (stream === null) { sessions.delete(sid); continue }
        this.#options.append(sid, stream, message)
      }
      return
    }
    if (message.method !== RESOURCE_UPDATED || forwarded) return
    const uri = isRecord(message.params) ? message.params.uri : undefined
    if (typeof uri !== 'string') return
    for (const [sid, subscribed] of this.#subscriptions) {
      if (subscribed.subject === subject && subscribed.uris.has(uri)) this.#options.append(sid, subscribed.stream, message)
    }
  }

  /** What a backend would answer from its per-connection state (ANSWERED_HERE), answered from the session's record. */
  async answerHere (record: SessionRecord, request: JsonRpcRequest, streamId: string): Promise<void> {
    const { server } = record
    const tenant = record.tenant ?? null
    const params = isRecord(request.params) ? request.params : {}
    const reply = (result: Record<string, unknown>): void => { this.#options.append(record.id, streamId, { jsonrpc: '2.0', id: request.id, result }) }
    const fail = (code: number, message: string): void => { this.#options.append(record.id, streamId, errorResponse(request.id, code, message)) }
    switch (request.method) {
      case 'ping':
        reply({})
        return
      case 'initialize': {
        const info = await this.#info(server, tenant, record.subjectDigest)
        // The client's hop negotiated its own version: the gateway is a separate MCP peer on each side.
        reply(initializeResult(info, record.protocolVersion))
        return
      }
      case 'logging/setLevel': {
        const info = await this.#info(server, tenant, record.subjectDigest)
        if (info.capabilities.logging === undefined) { fail(JSONRPC_METHOD_NOT_FOUND, 'Method not found: logging/setLevel'); return }
        if (typeof params.level !== 'string' || !isLogLevel(params.level)) { fail(-32602, `Invalid params: level must be one of ${LOG_LEVELS.join(', ')}`); return }
        await this.#establish(record, { logLevel: { level: params.level } })
        reply({})
        return
      }
      default: {
        // resources/subscribe, resources/unsubscribe
        const info = await this.#info(server, tenant, record.subjectDigest)
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

  /** What this replica holds of a session's state ends: its subscriptions let go. */
  forget (sid: string): void {
    for (const release of this.#subscriptions.get(sid)?.uris.values() ?? []) release()
    this.#subscriptions.delete(sid)
    for (const { sessions } of this.#listening.values()) sessions.delete(sid)
    for (const set of this.#created.values()) set.delete(sid)
  }

  stop (): void {
    for (const { uris } of this.#subscriptions.values()) for (const release of uris.values()) release()
    this.#subscriptions.clear()
  }

  async #info (server: string, tenant: string | null, subject: string | undefined): Promise<BackendInfo> {
    return await this.#options.pool.info(server, tenant, subject)
  }

  /** One upstream subscription per uri per pool (the pool counts them); resources/updated come back here. */
  async #subscribe (record: SessionRecord, uri: string): Promise<void> {
    if (this.#subscriptions.get(record.id)?.uris.has(uri) === true) return
    const release = await this.#options.pool.hold(record.server, record.tenant ?? null, [uri], record.subjectDigest)
    let subscribed = this.#subscriptions.get(record.id)
    if (subscribed === undefined) {
      const subject = this.#options.pool.eventSubject(record.server, record.tenant ?? null, record.subjectDigest)
      this.#subscriptions.set(record.id, subscribed = { stream: record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM, subject, uris: new Map() })
    }
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
    await this.#options.store.update(record.id, { established })
  }

  #register (server: string, tenant: string | null, subject: string | null): void {
    this.#options.store.addListener(listenTopic(server, tenant, subject), this.#options.replicaId, LISTEN_REGISTRATION_MS)
      .catch(err => { this.#options.log.warn({ err, server }, 'pooled sessions: event registration failed') })
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

/** The log level the session set (logging/setLevel), if any. */
export function logLevelOf (record: SessionRecord): string | null {
  const level = record.established?.logLevel?.level
  return typeof level === 'string' ? level : null
}
