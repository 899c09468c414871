// Terminal dispatch (ARCHITECTURE.md section 5): a client message goes to the replica that owns
// the session's backend connection; a message for a client is appended to its stream's log and
// the stream's holder is woken. Local first: when owner or holder is this replica, no bus hop.
//
// Owner side: backend request ids are gateway-minted integers (SPEC.md J-3) mapped back to the
// client's ids, except for Streamable HTTP backends ("direct" sessions, see OwnedSession.direct),
// whose ids pass through; server-to-client requests get opaque ids `s.<replica>.<seq>` so any
// replica can route the client's answer back here (flow 3). Holder side: StreamWriters pull from
// the log.
import { randomBytes } from 'node:crypto'
import type { Logger } from 'pino'
import type { Bus, Envelope } from '../state/bus.js'
import type { Config, ServerConfig } from '../config/schema.js'
import {
  GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_CONFLICT, GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN,
  isGatewayError, toJsonRpcError, type GatewayError
} from '../core/errors.js'
import { GET_STREAM, LEGACY_STREAM, type EventLog } from '../state/event-log.js'
import {
  errorResponse, isNotification, isRequest, isResponse, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../core/jsonrpc.js'
import { shortHash } from '../telemetry/logger.js'
import type { SessionRecord, SessionStore } from '../state/session-store.js'
import { StreamWriter, type WriterEndReason, type WriterMode } from '../http/sse.js'
import type { SupervisedHandlers, SupervisedOpenOptions } from '../backends/supervisor.js'

/** What the router needs of the supervisor (src/supervisor.ts implements it). */
export interface BackendSessionHandle {
  send (message: JsonRpcMessage): Promise<void>
  /** Streamable HTTP: start or stop the backend's GET stream (only the lease holder listens). */
  setListening (listening: boolean, fromEventId?: string | null): void
}
export interface BackendPool {
  open (sid: string, server: string, handlers: SupervisedHandlers, options?: SupervisedOpenOptions): Promise<BackendSessionHandle>
  stop (sid: string): Promise<void>
  stopAll (options?: { detach?: boolean }): Promise<void>
}

export interface RouterOptions {
  replicaId: string
  config: Readonly<Config>
  store: SessionStore
  eventLog: EventLog
  bus: Bus
  backends: BackendPool
  log: Logger
}

interface InFlight {
  backendId: RequestId
  clientId: RequestId
  streamId: string
  method: string
  progressToken: RequestId | undefined
  timer: NodeJS.Timeout
}

interface PendingClientRequest {
  backendId: RequestId
  streamId: string
  timer: NodeJS.Timeout
}

/** A session whose backend connection lives on this replica. */
interface OwnedSession {
  sid: string
  server: string
  legacy: boolean
  /**
   * Streamable HTTP backends: every replica that takes a request for the session opens its own
   * connection to the same backend session and sends directly; ids pass through unchanged so
   * replicas never collide. Only the owner (GET lease holder) listens to the backend's GET stream.
   */
  direct: boolean
  /** Whether this replica holds the owner lease (always, for routed sessions). */
  isOwner: boolean
  protocolVersion: string
  clientCapabilities: Record<string, unknown>
  backend: BackendSessionHandle | null
  nextId: number
  /** Keyed by idKey(backend id). */
  inFlight: Map<string, InFlight>
  /** idKey(client id) -> idKey(backend id). */
  byClientId: Map<string, string>
  byToken: Map<string, string>
  pending: Map<string, PendingClientRequest>
  log: Logger
}

const SESSION_ID = /^[A-Za-z0-9_-]{16,64}$/
/** Session-level notifications always go to the GET stream, never a request's stream. */
const SESSION_LEVEL = /\/list_changed$|^notifications\/resources\/updated$/
/** Server-to-client requests and the client capability each needs (SPEC.md L-4). */
const NEEDS_CAPABILITY: Record<string, string> = {
  'sampling/createMessage': 'sampling',
  'elicitation/create': 'elicitation',
  'roots/list': 'roots'
}

/** How long a completed request stream's log stays for a late resume. */
export const COMPLETED_STREAM_TTL_MS = 60_000

/** Request stream ids say their kind and how many responses end them: `r1_xxxx`, `j3_xxxx`. */
export function newRequestStreamId (mode: 'sse' | 'json', responses: number): string {
  return `${mode === 'sse' ? 'r' : 'j'}${responses}_${randomBytes(9).toString('base64url')}`
}
export function expectedResponsesOf (streamId: string): number {
  const match = /^[rj](\d{1,4})_/.exec(streamId)
  return match === null ? Infinity : Number(match[1])
}
const isJsonStream = (streamId: string): boolean => streamId.startsWith('j')
const idKey = (id: RequestId): string => typeof id === 'number' ? `n${id}` : `s${id}`
const writerKey = (sid: string, streamId: string): string => `${sid}\n${streamId}`

export function isValidSessionId (sid: string): boolean {
  return SESSION_ID.test(sid)
}

export class Router {
  readonly replicaId: string
  readonly #o: RouterOptions
  readonly #owned = new Map<string, OwnedSession>()
  readonly #writers = new Map<string, StreamWriter>()
  readonly #lastTouch = new Map<string, number>()
  readonly #opening = new Map<string, Promise<OwnedSession>>()
  /** Replica liveness seen recently (replica -> until), so a forwarded message skips the check. */
  readonly #aliveUntil = new Map<string, number>()
  #tick: NodeJS.Timeout | undefined
  #seq = 0
  #stopping = false

  constructor (options: RouterOptions) {
    this.#o = options
    this.replicaId = options.replicaId
  }

  get #leaseMs (): number { return this.#o.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#o.config.sessions.idleTimeoutMs }

  async start (): Promise<void> {
    await this.#o.bus.start(this.replicaId, envelope => { this.#onEnvelope(envelope) })
    await this.#o.store.heartbeat(this.replicaId, this.#leaseMs).catch(() => {})
    const every = Math.max(250, Math.min(5000, Math.floor(this.#leaseMs / 3), Math.floor(this.#idleMs / 4)))
    this.#tick = setInterval(() => { this.#onTick().catch(err => this.#o.log.warn({ err }, 'router tick failed')) }, every)
    this.#tick.unref()
  }

  /** Graceful stop: streams end with a retry hint, leases released, backends stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    clearInterval(this.#tick)
    for (const writer of [...this.#writers.values()]) writer.end('shutdown', this.#o.config.http.retryMs)
    const owned = [...this.#owned.values()]
    for (const session of owned) this.#failAll(session, new GW_ERR_SHUTTING_DOWN())
    await Promise.allSettled(owned.map(s => this.#o.store.releaseOwner(s.sid, this.replicaId)))
    this.#owned.clear()
    // With shared sessions (Redis), HTTP backend sessions outlive this replica: another one
    // resumes them. Alone, nothing can resume them, so they are ended (DELETE).
    await this.#o.backends.stopAll({ detach: this.#o.config.redis !== undefined })
    await this.#o.bus.close()
  }

  get stopping (): boolean { return this.#stopping }

  // ---- sessions ----------------------------------------------------------------------------

  /** Creates a session owned by this replica and starts its backend connection. */
  async createSession (input: Omit<SessionRecord, 'id' | 'createdAt' | 'backendSessionId'>, forwardedHeaders?: Record<string, string>): Promise<SessionRecord> {
    if (this.#stopping) throw new GW_ERR_SHUTTING_DOWN()
    const record: SessionRecord = { ...input, id: randomBytes(24).toString('base64url'), backendSessionId: null, createdAt: Date.now() }
    await this.#o.store.create(record, this.#idleMs)
    await this.#o.store.claimOwner(record.id, this.replicaId, this.#leaseMs)
    try {
      await this.#openOwned(record, forwardedHeaders)
    } catch (err) {
      await this.#o.store.delete(record.id).catch(() => {})
      throw err
    }
    return record
  }

  /** The session if it exists and belongs to this principal; another principal sees none (G-5). */
  async getSession (sid: string, principal: string): Promise<SessionRecord | null> {
    if (!isValidSessionId(sid)) return null
    const record = await this.#o.store.get(sid)
    if (record === null || record.principal !== principal) return null
    this.#touch(sid)
    return record
  }

  async updateSession (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<void> {
    await this.#o.store.update(sid, patch)
    const owned = this.#owned.get(sid)
    if (owned !== undefined) {
      if (patch.protocolVersion !== undefined) owned.protocolVersion = patch.protocolVersion
      if (patch.initializeParams != null) owned.clientCapabilities = capabilitiesOf(patch.initializeParams)
    }
  }

  /** Ends a session everywhere (DELETE, legacy stream closed, backend gone). */
  async endSession (sid: string, reason: string): Promise<void> {
    const owner = await this.#o.store.getOwner(sid).catch(() => null)
    const getHolder = await this.#o.store.getHolder(sid, GET_STREAM).catch(() => null)
    await this.#o.store.delete(sid)
    await this.#o.eventLog.deleteSession(sid)
    const envelope: Envelope = { kind: 'end-session', sid, reason }
    for (const replica of new Set([owner, getHolder])) {
      if (replica !== null && replica !== this.replicaId) await this.#o.bus.send(replica, envelope).catch(() => {})
    }
    await this.#endLocal(sid, reason)
  }

  // ---- client -> backend -------------------------------------------------------------------

  /**
   * Hands one client message to the session's owner. `streamId` is the client stream that gets
   * the answer (and related messages) of a request; null for notifications and responses.
   */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null): Promise<void> {
    const sid = record.id
    if (isResponse(message)) {
      // An answer to a server-to-client request goes to the replica named in its opaque id (flow 3).
      const replica = replicaOfOpaqueId(message.id)
      const local = this.#owned.get(sid)
      if (replica === this.replicaId || replica === null) { if (local !== undefined) this.#deliverLocal(local, message, null); return }
      // The id is client input: only a live replica gets an envelope (no inbox for made-up names).
      if (await this.#isAlive(replica)) await this.#o.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
      return
    }
    const local = this.#owned.get(sid)
    // Direct sessions send requests from here; their notifications go to the lease holder, whose
    // connection saw initialize and runs the backend's GET stream.
    if (local !== undefined && (local.isOwner || isRequest(message))) { this.#deliverLocal(local, message, streamId); return }
    if (isRequest(message) && this.#isDirect(record.server) && record.backendSessionId !== null) {
      this.#deliverLocal(await this.#openDirect(record), message, streamId)
      return
    }
    const owner = await this.#o.store.getOwner(sid)
    if (owner !== null && owner !== this.replicaId && await this.#isAlive(owner)) {
      await this.#o.bus.send(owner, { kind: 'deliver', sid, streamId, message })
      return
    }
    if (this.#isDirect(record.server) && record.backendSessionId !== null) {
      // The lease holder is gone but the backend session lives on: take it over here.
      const opened = local ?? await this.#openDirect(record)
      await this.#claimLease(opened)
      this.#deliverLocal(opened, message, streamId)
      return
    }
    // The owner is gone: a stdio child (or legacy SSE upstream) died with it, so the session
    // is over (ARCHITECTURE.md 6).
    await this.endSession(sid, 'owner replica gone')
    throw new GW_ERR_SESSION_NOT_FOUND()
  }

  // ---- backend -> client (holder side) -----------------------------------------------------

  /** Appends to a client stream's log and wakes its holder (local call, or a bus wake). */
  async append (sid: string, streamId: string, message: JsonRpcMessage | null): Promise<string> {
    const { entryId, holder } = await this.#o.eventLog.append(sid, streamId, message, this.#idleMs)
    if (holder === this.replicaId) {
      void this.#writers.get(writerKey(sid, streamId))?.wake()
    } else if (holder !== null) {
      await this.#o.bus.send(holder, { kind: 'wake', sid, streamId }).catch(err => {
        this.#o.log.warn({ err, sid: shortHash(sid) }, 'wake not sent; the entry waits in the log')
      })
    }
    return entryId
  }

  /** Opens a client stream on this replica: claims the holder lease, then tails the log. */
  async openStream (options: {
    res: import('node:http').ServerResponse
    sid: string
    streamId: string
    mode: WriterMode
    cursor: string | null
    fresh?: boolean
    batch?: boolean
    headers: Record<string, string>
    retryMs?: number
    preamble?: string
    /** A new standalone GET stream: 409 if this replica already writes one (checked atomically). */
    exclusive?: boolean
    log: import('fastify').FastifyBaseLogger
  }): Promise<StreamWriter> {
    const { sid, streamId } = options
    const key = writerKey(sid, streamId)
    const current = this.#writers.get(key)
    if (options.exclusive === true && current !== undefined && !current.ended) {
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    current?.end('released')
    const writer = new StreamWriter({
      ...options,
      eventLog: this.#o.eventLog,
      expectedResponses: expectedResponsesOf(streamId),
      keepAliveMs: this.#o.config.http.keepAliveMs,
      onEnd: (w, reason) => { this.#onWriterEnd(w, reason) }
    })
    this.#writers.set(key, writer)
    let previous: string | null
    try {
      previous = await this.#o.store.claimHolder(sid, streamId, this.replicaId, this.#leaseMs)
    } catch (err) {
      // Not started, so nothing was written: forget it and let the error handler answer.
      if (this.#writers.get(key) === writer) this.#writers.delete(key)
      throw err
    }
    if (options.exclusive === true && previous !== null && previous !== this.replicaId && await this.#isAlive(previous)) {
      // Another replica opened this session's GET stream at the same moment and is alive: hand the
      // stream back to it and refuse this one, as a local second GET is refused.
      await this.#o.store.claimHolder(sid, streamId, previous, this.#leaseMs).catch(() => {})
      if (this.#writers.get(key) === writer) this.#writers.delete(key)
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    if (previous !== null && previous !== this.replicaId) {
      await this.#o.bus.send(previous, { kind: 'release', sid, streamId }).catch(() => {})
    }
    return writer
  }

  /** Whether a live GET stream exists for the session (one standalone GET stream, H-GET-3). */
  async hasLiveStream (sid: string, streamId: string): Promise<boolean> {
    const local = this.#writers.get(writerKey(sid, streamId))
    if (local !== undefined && !local.ended) return true
    const holder = await this.#o.store.getHolder(sid, streamId)
    return holder !== null && holder !== this.replicaId && await this.#o.store.isAlive(holder)
  }

  /** Whether a stream of this session has a log (a Last-Event-ID must name one, H-RES-2). */
  async streamExists (sid: string, streamId: string): Promise<boolean> {
    return await this.#o.eventLog.hasStream(sid, streamId)
  }

  /** Where a new GET stream without Last-Event-ID starts: after what was last written. */
  async streamCursor (sid: string, streamId: string): Promise<string | null> {
    return await this.#o.store.getCursor(sid, streamId)
  }

  /** Replica liveness, cached for a quarter lease: a dead owner is still noticed within a lease. */
  async #isAlive (replica: string): Promise<boolean> {
    const now = Date.now()
    if ((this.#aliveUntil.get(replica) ?? 0) > now) return true
    const alive = await this.#o.store.isAlive(replica)
    if (alive) this.#aliveUntil.set(replica, now + this.#leaseMs / 4)
    else this.#aliveUntil.delete(replica)
    return alive
  }

  // ---- owner side ----------------------------------------------------------------------

  #isDirect (server: string): boolean {
    return this.#o.config.servers[server]?.transport === 'streamable-http'
  }

  /** Opens this replica's own connection to a direct session's backend session (deduplicated). */
  async #openDirect (record: SessionRecord): Promise<OwnedSession> {
    const existing = this.#owned.get(record.id)
    if (existing !== undefined) return existing
    let opening = this.#opening.get(record.id)
    if (opening === undefined) {
      opening = (async () => {
        const owned = await this.#openOwned(record, undefined, false)
        await this.#claimLease(owned)
        return owned
      })().finally(() => this.#opening.delete(record.id))
      this.#opening.set(record.id, opening)
    }
    return await opening
  }

  /** Takes the owner lease of a direct session if it is free, and then listens to the backend. */
  async #claimLease (owned: OwnedSession): Promise<void> {
    if (owned.isOwner) return
    const owner = await this.#o.store.claimOwner(owned.sid, this.replicaId, this.#leaseMs)
    if (owner === this.replicaId) {
      owned.isOwner = true
      const record = await this.#o.store.get(owned.sid)
      owned.backend?.setListening(true, record?.backendGetEventId ?? null)
      owned.log.info('took the backend GET-stream lease')
    }
  }

  async #openOwned (record: SessionRecord, forwardedHeaders?: Record<string, string>, isOwner = true): Promise<OwnedSession> {
    const direct = this.#isDirect(record.server)
    const owned: OwnedSession = {
      sid: record.id,
      server: record.server,
      legacy: record.transport === 'legacy',
      direct,
      isOwner,
      protocolVersion: record.protocolVersion,
      clientCapabilities: capabilitiesOf(record.initializeParams),
      backend: null,
      nextId: 1,
      inFlight: new Map(),
      byClientId: new Map(),
      byToken: new Map(),
      pending: new Map(),
      log: this.#o.log.child({ sid: shortHash(record.id), backend: record.server })
    }
    this.#owned.set(record.id, owned)
    try {
      owned.backend = await this.#o.backends.open(record.id, record.server, {
        onMessage: message => { this.#fromBackend(owned, message).catch(err => owned.log.error({ err }, 'backend message not routed')) },
        onRestarting: info => {
          owned.log.warn({ reason: info.reason, attempt: info.attempt, delayMs: info.delayMs }, 'backend restarting')
          this.#failAll(owned, new GW_ERR_BACKEND_UNAVAILABLE(owned.server, `backend stopped (${info.reason}); restarting`))
        },
        onGone: reason => {
          owned.log.warn({ reason }, 'backend gone; ending session')
          this.#failAll(owned, new GW_ERR_BACKEND_UNAVAILABLE(owned.server, reason))
          this.endSession(owned.sid, reason).catch(err => owned.log.error({ err }, 'session end failed'))
        }
      }, {
        backendSessionId: record.backendSessionId,
        // A resumed HTTP backend session speaks the version its backend negotiated (G-1, H-PV-1).
        protocolVersion: record.backendProtocolVersion ?? record.protocolVersion,
        initializeParams: record.initializeParams,
        ...(forwardedHeaders !== undefined ? { forwardedHeaders } : {}),
        ...(direct ? { listen: isOwner, getStreamLastEventId: record.backendGetEventId ?? null } : {}),
        // HTTP backends: any replica that takes the session over resumes this backend session.
        // On a new backend session (first initialize, or a re-initialise after a 404) the old GET
        // stream position means nothing for it.
        onBackendSessionId: backendSessionId => {
          this.#o.store.update(record.id, { backendSessionId, backendGetEventId: null }).catch(err => owned.log.warn({ err }, 'backend session id not stored'))
        },
        onBackendProtocolVersion: backendProtocolVersion => {
          this.#o.store.update(record.id, { backendProtocolVersion }).catch(err => owned.log.warn({ err }, 'backend protocol version not stored'))
        },
        // The replica that takes the GET lease over resumes the backend's stream from here, so
        // nothing the backend sent meanwhile is lost (it replays, if it keeps an event store).
        ...(direct
          ? { onGetStreamEventId: (backendGetEventId: string) => { this.#o.store.update(record.id, { backendGetEventId }).catch(err => owned.log.warn({ err }, 'backend GET event id not stored')) } }
          : {})
      })
    } catch (err) {
      this.#owned.delete(record.id)
      throw err
    }
    return owned
  }

  #deliverLocal (owned: OwnedSession, message: JsonRpcMessage, streamId: string | null): void {
    this.#touch(owned.sid)
    if (isRequest(message) && message.method === 'initialize' && owned.legacy) {
      // A legacy session negotiates on a POST that may have landed on another replica, which
      // stored the outcome: take version and capabilities from the record before forwarding.
      this.#o.store.get(owned.sid).then(record => {
        if (record !== null) {
          owned.protocolVersion = record.protocolVersion
          owned.clientCapabilities = capabilitiesOf(record.initializeParams)
        }
        this.#forwardRequest(owned, message, streamId ?? LEGACY_STREAM)
      }, err => {
        this.#reply(owned, streamId ?? LEGACY_STREAM, toJsonRpcError(asGatewayError(err, owned.server), message.id))
      })
      return
    }
    if (isRequest(message)) {
      this.#forwardRequest(owned, message, streamId ?? (owned.legacy ? LEGACY_STREAM : GET_STREAM))
    } else if (isNotification(message)) {
      this.#forwardNotification(owned, message)
    } else {
      this.#forwardClientResponse(owned, message)
    }
  }

  #forwardRequest (owned: OwnedSession, request: JsonRpcRequest, streamId: string): void {
    if (request.method === 'ping') {
      // Answered here: a client's liveness check is about the gateway (SPEC.md L-8 REC).
      this.#reply(owned, streamId, { jsonrpc: '2.0', id: request.id, result: {} })
      return
    }
    const backend = owned.backend
    if (backend === null) {
      this.#reply(owned, streamId, toJsonRpcError(new GW_ERR_BACKEND_UNAVAILABLE(owned.server, 'not connected'), request.id))
      return
    }
    // Routed sessions mint ids (one child may see the gateway's own requests too); direct ones
    // pass the client's ids through, unique in the session, so replicas sharing one backend
    // session never collide (SPEC.md J-3).
    const backendId: RequestId = owned.direct ? request.id : owned.nextId++
    const key = idKey(backendId)
    const timeoutMs = this.#serverConfig(owned.server).requestTimeoutMs
    const entry: InFlight = {
      backendId,
      clientId: request.id,
      streamId,
      method: request.method,
      progressToken: progressTokenOf(request),
      timer: setTimeout(() => { this.#onRequestTimeout(owned, key, timeoutMs) }, timeoutMs)
    }
    entry.timer.unref()
    owned.inFlight.set(key, entry)
    owned.byClientId.set(idKey(request.id), key)
    if (entry.progressToken !== undefined) owned.byToken.set(idKey(entry.progressToken), streamId)
    backend.send({ ...request, id: backendId }).catch(err => {
      if (this.#settle(owned, key) === undefined) return
      this.#reply(owned, streamId, toJsonRpcError(asGatewayError(err, owned.server), request.id))
    })
  }

  #forwardNotification (owned: OwnedSession, notification: JsonRpcNotification): void {
    let outgoing: JsonRpcNotification = notification
    if (notification.method === 'notifications/cancelled') {
      const params = asRecord(notification.params)
      const requestId = params.requestId
      if (typeof requestId !== 'string' && typeof requestId !== 'number') return
      const key = owned.byClientId.get(idKey(requestId))
      const entry = key === undefined ? undefined : owned.inFlight.get(key)
      if (key === undefined || entry === undefined) {
        // Direct sessions: the request may be in flight from another replica; the id is the
        // backend's id too, so the backend can still be told. Routed: unknown, MAY be ignored (U-CAN-1).
        if (!owned.direct) return
      } else {
        if (entry.method === 'initialize') return // initialize is never cancelled (L-5)
        this.#settle(owned, key)
        outgoing = { ...notification, params: { ...params, requestId: entry.backendId } }
      }
    }
    owned.backend?.send(outgoing).catch(err => owned.log.warn({ err, method: notification.method }, 'notification not delivered to backend'))
  }

  #forwardClientResponse (owned: OwnedSession, response: JsonRpcResponse): void {
    const id = response.id
    if (typeof id !== 'string') return
    const pending = owned.pending.get(id)
    if (pending === undefined) return // late or unknown answer: ignored
    owned.pending.delete(id)
    clearTimeout(pending.timer)
    owned.backend?.send({ ...response, id: pending.backendId } as JsonRpcResponse)
      .catch(err => owned.log.warn({ err }, 'client answer not delivered to backend'))
  }

  async #fromBackend (owned: OwnedSession, message: JsonRpcMessage): Promise<void> {
    if (isRequest(message)) { await this.#fromBackendRequest(owned, message); return }
    if (isNotification(message)) { await this.#fromBackendNotification(owned, message); return }
    const id = message.id
    if (id === undefined || id === null) return
    const entry = this.#settle(owned, idKey(id))
    if (entry === undefined) return // cancelled or timed out: a late answer is dropped
    let response: JsonRpcResponse = { ...message, id: entry.clientId }
    if (entry.method === 'initialize' && 'result' in response && isRecord(response.result)) {
      // The client's hop has its own negotiated version (SPEC.md G-1).
      response = { ...response, result: { ...response.result, protocolVersion: owned.protocolVersion } }
    }
    await this.append(owned.sid, entry.streamId, response)
    if (entry.method === 'initialize' && 'error' in response) {
      // A session whose initialize failed is of no use, and its child counts against maxSessions:
      // end it once the client has had a moment to read the error.
      setTimeout(() => { this.endSession(owned.sid, 'initialize failed').catch(() => {}) }, 1000).unref()
    }
  }

  async #fromBackendNotification (owned: OwnedSession, notification: JsonRpcNotification): Promise<void> {
    const params = asRecord(notification.params)
    if (notification.method === 'notifications/progress') {
      const token = params.progressToken
      const streamId = (typeof token === 'string' || typeof token === 'number') ? owned.byToken.get(idKey(token)) : undefined
      if (streamId === undefined) return // progress for no active request (U-PROG-1)
      await this.append(owned.sid, isJsonStream(streamId) ? GET_STREAM : streamId, notification)
      return
    }
    if (notification.method === 'notifications/cancelled') {
      // The backend withdrew one of its own requests to the client: use the client-facing id.
      const requestId = params.requestId
      for (const [opaque, pending] of owned.pending) {
        if (pending.backendId === requestId) {
          owned.pending.delete(opaque)
          clearTimeout(pending.timer)
          await this.append(owned.sid, pending.streamId, { ...notification, params: { ...params, requestId: opaque } })
          return
        }
      }
      return
    }
    await this.append(owned.sid, this.#pickStream(owned, notification.method), notification)
  }

  async #fromBackendRequest (owned: OwnedSession, request: JsonRpcRequest): Promise<void> {
    const backend = owned.backend
    if (request.method === 'ping') {
      await backend?.send({ jsonrpc: '2.0', id: request.id, result: {} }).catch(() => {})
      return
    }
    const capability = NEEDS_CAPABILITY[request.method]
    if (capability !== undefined && owned.clientCapabilities[capability] === undefined) {
      // Never forward what the client did not declare (SPEC.md L-4, G-3).
      await backend?.send(errorResponse(request.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${request.method} (no '${capability}' capability)`)).catch(() => {})
      return
    }
    const opaque = `s.${this.replicaId}.${++this.#seq}`
    const streamId = this.#pickStream(owned, request.method)
    const timeoutMs = this.#o.config.sessions.clientRequestTimeoutMs
    const timer = setTimeout(() => {
      if (!owned.pending.delete(opaque)) return
      backend?.send(errorResponse(request.id, -32006, `Client did not answer ${request.method} within ${timeoutMs} ms`)).catch(() => {})
    }, timeoutMs)
    timer.unref()
    owned.pending.set(opaque, { backendId: request.id, streamId, timer })
    await this.append(owned.sid, streamId, { ...request, id: opaque })
  }

  /** Flow 2: progress by token; other messages to the one in-flight request's stream, else GET. */
  #pickStream (owned: OwnedSession, method: string): string {
    if (owned.legacy) return LEGACY_STREAM
    if (!SESSION_LEVEL.test(method) && owned.inFlight.size === 1) {
      const [only] = owned.inFlight.values()
      if (only !== undefined && !isJsonStream(only.streamId) && only.method !== 'initialize') return only.streamId
    }
    return GET_STREAM
  }

  #onRequestTimeout (owned: OwnedSession, key: string, timeoutMs: number): void {
    const entry = this.#settle(owned, key)
    if (entry === undefined) return
    // Stop waiting and tell the backend (SPEC.md L-7), except for initialize, which is never
    // cancelled (L-5), and HTTP backends, whose connection sends its own cancel on its deadline.
    if (entry.method !== 'initialize' && this.#o.config.servers[owned.server]?.transport === 'stdio') owned.backend?.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: entry.backendId, reason: 'gateway timeout' } }).catch(() => {})
    this.#reply(owned, entry.streamId, toJsonRpcError(new GW_ERR_BACKEND_TIMEOUT(owned.server, timeoutMs), entry.clientId))
  }

  /** Removes an in-flight request; returns it if it was still in flight. */
  #settle (owned: OwnedSession, key: string): InFlight | undefined {
    const entry = owned.inFlight.get(key)
    if (entry === undefined) return undefined
    owned.inFlight.delete(key)
    owned.byClientId.delete(idKey(entry.clientId))
    if (entry.progressToken !== undefined) owned.byToken.delete(idKey(entry.progressToken))
    clearTimeout(entry.timer)
    return entry
  }

  /** Every request in flight gets a JSON-RPC error at once (backend died, shutdown). */
  #failAll (owned: OwnedSession, err: GatewayError): void {
    for (const key of [...owned.inFlight.keys()]) {
      const entry = this.#settle(owned, key)
      if (entry !== undefined) this.#reply(owned, entry.streamId, toJsonRpcError(err, entry.clientId))
    }
    for (const pending of owned.pending.values()) clearTimeout(pending.timer)
    owned.pending.clear()
  }

  #reply (owned: OwnedSession, streamId: string, message: JsonRpcMessage): void {
    this.append(owned.sid, streamId, message).catch(err => owned.log.error({ err }, 'reply not appended'))
  }

  #serverConfig (server: string): ServerConfig & { requestTimeoutMs: number } {
    const config = this.#o.config.servers[server]
    if (config === undefined) throw new Error(`unknown server ${server}`)
    return config
  }

  // ---- lifecycle ---------------------------------------------------------------------------

  #onEnvelope (envelope: Envelope): void {
    switch (envelope.kind) {
      case 'deliver': {
        const owned = this.#owned.get(envelope.sid)
        if (owned !== undefined) { this.#deliverLocal(owned, envelope.message, envelope.streamId); return }
        const message = envelope.message
        if (isRequest(message) && envelope.streamId !== null) {
          this.append(envelope.sid, envelope.streamId, toJsonRpcError(new GW_ERR_SESSION_NOT_FOUND(), message.id)).catch(() => {})
        }
        return
      }
      case 'wake':
        void this.#writers.get(writerKey(envelope.sid, envelope.streamId))?.wake()
        return
      case 'release':
        this.#writers.get(writerKey(envelope.sid, envelope.streamId))?.end('released')
        return
      case 'end-session':
        this.#endLocal(envelope.sid, envelope.reason).catch(err => this.#o.log.error({ err }, 'local session end failed'))
    }
  }

  async #endLocal (sid: string, reason: string): Promise<void> {
    for (const writer of [...this.#writers.values()]) {
      if (writer.sid === sid) writer.end('session-ended')
    }
    const owned = this.#owned.get(sid)
    this.#lastTouch.delete(sid)
    if (owned === undefined) return
    this.#owned.delete(sid)
    this.#failAll(owned, new GW_ERR_BACKEND_UNAVAILABLE(owned.server, `session ended: ${reason}`))
    owned.log.info({ reason }, 'session ended')
    await this.#o.backends.stop(sid)
  }

  #onWriterEnd (writer: StreamWriter, reason: WriterEndReason): void {
    const { sid, streamId } = writer
    const key = writerKey(sid, streamId)
    if (this.#writers.get(key) === writer) this.#writers.delete(key)
    if (reason === 'released' || reason === 'session-ended') return
    const store = this.#o.store
    // Only a cursor the log gave: a client-sent Last-Event-ID never becomes the stored position.
    if (writer.cursor !== null && writer.advanced && (streamId === GET_STREAM || streamId === LEGACY_STREAM)) {
      store.setCursor(sid, streamId, writer.cursor, this.#idleMs).catch(() => {})
    }
    if (reason === 'complete') {
      // A completed request stream gets no more entries: its holder lease just lapses, and its log
      // is kept only briefly for a client whose socket died right after the answer (not the whole
      // idle timeout: a busy session would hold every answer it ever sent).
      this.#o.eventLog.expire(sid, streamId, COMPLETED_STREAM_TTL_MS).catch(() => {})
    } else {
      store.releaseHolder(sid, streamId, this.replicaId).catch(() => {})
    }
    if (streamId === LEGACY_STREAM && reason !== 'shutdown') {
      // A legacy HTTP+SSE session lives as long as its stream (2024-11-05 has no resumption).
      this.endSession(sid, 'legacy stream closed').catch(err => this.#o.log.warn({ err }, 'legacy session end failed'))
    }
  }

  /** Refreshes the session TTL, at most every tenth of the idle timeout (saves store round trips). */
  #touch (sid: string): void {
    const now = Date.now()
    const last = this.#lastTouch.get(sid) ?? 0
    if (now - last < this.#idleMs / 10) return
    this.#lastTouch.set(sid, now)
    this.#o.store.touch(sid, this.#idleMs).catch(() => {})
  }

  async #onTick (): Promise<void> {
    const store = this.#o.store
    await store.heartbeat(this.replicaId, this.#leaseMs)
    const stale = Date.now() - this.#idleMs
    for (const [sid, at] of this.#lastTouch) if (at < stale) this.#lastTouch.delete(sid)
    for (const owned of [...this.#owned.values()]) {
      const [alive, leased] = await Promise.all([
        store.get(owned.sid).then(r => r !== null),
        owned.isOwner ? store.renewOwner(owned.sid, this.replicaId, this.#leaseMs) : Promise.resolve(false)
      ])
      if (!alive) {
        // Idle timeout reached (or deleted elsewhere): stop the backend (idle reaping).
        await this.endSession(owned.sid, 'idle timeout')
      } else if (owned.direct) {
        if (owned.isOwner && !leased) {
          owned.isOwner = false
          owned.backend?.setListening(false)
          owned.log.warn('backend GET-stream lease lost; no longer listening')
        }
        // A free lease (its holder died) is taken by a replica that still serves the session.
        if (!owned.isOwner) await this.#claimLease(owned)
        // The holder keeps its backend GET stream wanted: this re-arms a stream that gave up
        // (e.g. a stale stream of a dead holder answered 409 for a while). A no-op when connected.
        else owned.backend?.setListening(true)
      } else if (!leased) {
        owned.log.warn('owner lease lost; stopping backend')
        await this.#endLocal(owned.sid, 'owner lease lost')
      }
    }
    const remoteOwned = new Set<string>()
    for (const writer of [...this.#writers.values()]) {
      // Holder leases are renewed here, every third of a lease. An open stream keeps its session
      // alive: the tick runs at least every quarter idle timeout, and touch() also says whether
      // the session still exists (a stream whose session is gone ends).
      const [alive, held] = await Promise.all([
        store.touch(writer.sid, this.#idleMs),
        store.renewHolder(writer.sid, writer.streamId, this.replicaId, this.#leaseMs)
      ])
      if (!alive) writer.end('session-ended')
      // Another replica holds the stream now (it resumed it, or won a race for it): wakes go there,
      // so this writer would starve; end it and let the client reconnect.
      else if (!held && !writer.ended) writer.end('released', this.#o.config.http.retryMs)
      else if (!this.#owned.has(writer.sid)) remoteOwned.add(writer.sid)
    }
    for (const sid of remoteOwned) {
      const owner = await store.getOwner(sid)
      if (owner !== null && await store.isAlive(owner)) continue
      const record = await store.get(sid)
      if (record !== null && this.#isDirect(record.server) && record.backendSessionId !== null) {
        // The backend session outlives the replica: this one, serving the client's stream, takes it over.
        await this.#claimLease(await this.#openDirect(record))
      } else {
        // The owner died with its children: end the session now so the client re-initialises
        // instead of waiting on a stream nothing will ever write to (ARCHITECTURE.md section 6).
        await this.endSession(sid, 'owner replica gone')
      }
    }
  }
}

/** The replica named in an opaque server-to-client request id `s.<replica>.<seq>`. */
function replicaOfOpaqueId (id: RequestId | null | undefined): string | null {
  if (typeof id !== 'string') return null
  const match = /^s\.([A-Za-z0-9_-]{1,100})\.\d{1,15}$/.exec(id)
  return match?.[1] ?? null
}

function asRecord (value: unknown): Record<string, unknown> {
  return isRecord(value) ? value : {}
}

function isRecord (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

function capabilitiesOf (initializeParams: Record<string, unknown> | null): Record<string, unknown> {
  return asRecord(initializeParams?.capabilities)
}

function asGatewayError (err: unknown, server: string): GatewayError {
  return isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(server, err instanceof Error ? err.message : String(err), { cause: err })
}
