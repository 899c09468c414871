// Pooled sessions (docs/architecture.md, "A pooled call"; docs/behaviour.md, "Pooled sessions"): a
// 2025-era session of a `sessions: pooled` stdio server holds no child. Its record keeps what a
// backend would have kept for it (pooled-session-state.ts: the client's capabilities, its log
// level, its subscriptions); each request borrows a connection of the (server, tenant) pool
// (upstream/pool.ts) on the replica that received it and gives it back with its answer. No owner:
// any replica serves the session with its own pool, and losing a replica loses no session (only
// the requests it was running, which get -32007 as on a dedicated session). This module is the
// request path.
//
// What keeps one session's traffic from another's:
// - A connection runs one request at a time (upstream/pool.ts), under a pool-wide key as its id
//   and progress token, so answers, progress, logs and the backend's server-to-client requests on
//   that connection can only belong to that request; this module maps the key back to the
//   session's own id and token. Logs are filtered by the session's level, and the connection is
//   set to that level before the request runs.
// - A server-to-client request is sent to the client only if the session declared the capability
//   it needs (else the backend hears -32601); its answer returns to the call by its opaque id,
//   on the replica the id names, and only from the session it was sent to.
// - Tasks (MCP spec, "Tasks"): a task lives in the child whose connection ran its task-augmented
//   request, so the gateway records it (pooled-tasks.ts here, the task store for every replica:
//   pooled-task-remote.ts) under an id of its own and sends every request about it to that
//   connection, on whichever replica holds it (pooled-task-requests.ts); a session sees and names
//   only its own tasks.
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import type { ServerSource } from '../../config/live.js'
import { GW_ERR_INTERNAL, GW_ERR_SESSION_NOT_FOUND, cancelledAnswer, toJsonRpcError, type GatewayError } from '../../core/errors.js'
import {
  errorResponse, idKey, isNotification, isRecord, isRequest, isResponse, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../../core/jsonrpc.js'
import { capabilityNeededBy, isLogLevel, LOG_LEVELS } from '../../core/mcp.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import type { SessionRecord, SessionStore } from '../../state/session-store.js'
import type { TaskStore } from '../../state/task-store.js'
import { shortHash } from '../../telemetry/logger.js'
import { breathe } from '../replica/upkeep.js'
import type { ConnectionPool, PooledCall, Reservation } from '../upstream/pool.js'
import { progressForClient, underGatewayKey } from '../upstream/progress-tokens.js'
import { asGatewayError, capabilitiesOf, isJsonStream } from '../upstream/relay.js'
import { kindNameOf, serverConfigOf } from '../../config/server-kind.js'
import { ANSWERED_HERE, logLevelOf, PooledSessionState } from './pooled-session-state.js'
import { RemoteTasks } from './pooled-task-remote.js'
import { PooledTaskRequests } from './pooled-task-requests.js'
import { TASK_METHODS } from './pooled-tasks.js'

/** How often sessions that ended elsewhere (or expired) are forgotten here, and registrations renewed. */
const SWEEP_MS = 5_000

export interface PooledSessionsOptions {
  replicaId: string
  pool: ConnectionPool
  live: ServerSource
  store: SessionStore
  /** The records of tasks, read by every replica (pooled-task-remote.ts). */
  tasks: TaskStore
  /** Whether a replica's heartbeat is there now. */
  isAlive: (replica: string) => Promise<boolean>
  log: Logger
  /** Appends to a client stream's log and wakes its holder (ClientStreams.append). */
  append: (sid: string, streamId: string, message: JsonRpcMessage) => Promise<unknown>
  /** Appends an answer unless the stream's log holds one to its request already (ClientStreams.append `once`). */
  answerOnce: (sid: string, streamId: string, message: JsonRpcMessage) => Promise<unknown>
  /** Whether this replica writes that stream now (ClientStreams.writes). */
  writes: (sid: string, streamId: string) => boolean
  /** Replicas that serve requests of the session now (their pending markers), for a cancellation. */
  pendingReplicas: (sid: string) => Promise<string[]>
  /** Puts a client message in another replica's inbox (`streamId`: where a request's answer goes). */
  forward: (replica: string, sid: string, message: JsonRpcMessage, streamId?: string) => Promise<void>
}

/** The pool connections a POST of a pooled session reserved before its stream opened: one per backend request. */
export class PoolReservations {
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
  /** The connection it runs on, once reserved. */
  connectionId: string | null
}

export class PooledSessions {
  readonly #options: PooledSessionsOptions
  readonly #state: PooledSessionState
  /** Requests running here, by session, then idKey(client id). */
  readonly #calls = new Map<string, Map<string, LocalCall>>()
  /** Server-to-client requests sent to a client from here, by opaque id. */
  readonly #asks = new Map<string, { sid: string, call: PooledCall }>()
  /** The session's tasks and the client's requests about them. */
  readonly #tasks: PooledTaskRequests
  /** The task store, as pooled sessions read it. */
  readonly #remote: RemoteTasks
  readonly #sweep: NodeJS.Timeout
  #sweeping = false

  constructor (options: PooledSessionsOptions) {
    this.#options = options
    this.#state = new PooledSessionState({ ...options, append: (sid, streamId, message) => { this.#append(sid, streamId, message) } })
    this.#remote = new RemoteTasks({ replicaId: options.replicaId, tasks: options.tasks, isAlive: options.isAlive })
    this.#tasks = new PooledTaskRequests({
      pool: options.pool,
      remote: this.#remote,
      log: options.log,
      forward: async (replica, sid, streamId, request) => { await options.forward(replica, sid, request, streamId) },
      append: (sid, streamId, message) => { this.#append(sid, streamId, message) },
      answerOnce: async (sid, streamId, message) => { await options.answerOnce(sid, streamId, message) },
      track: (sid, clientId, streamId, connectionId) => {
        const local = this.#track(sid, clientId, streamId, connectionId)
        return { current: () => this.#current(local), settle: () => { this.#settled(local) } }
      },
      run: (record, request, streamId, connectionId) => { this.#run(record, request, streamId, undefined, connectionId) }
    })
    this.#sweep = setInterval(() => {
      if (this.#sweeping) return
      this.#sweeping = true
      this.#sweepNow().catch(err => { this.#options.log.warn({ err }, 'pooled sessions sweep failed') }).finally(() => { this.#sweeping = false })
    }, SWEEP_MS)
    this.#sweep.unref()
  }

  /** Before a new session's record is written: its backend can be described, and maxSessions is not reached. */
  async prepare (server: string, tenant: string | null, subject?: string): Promise<void> {
    await this.#state.prepare(server, tenant, subject)
  }

  created (record: SessionRecord): void {
    this.#state.created(record)
  }

  /** Sessions created on this replica that are still open, by server (metrics). */
  sessionsByServer (): Map<string, number> {
    return this.#state.sessionsByServer()
  }

  /**
   * Before a POST's stream opens: a pool connection for its request, if it needs the backend, so a
   * pool that stays busy is an HTTP 503 with Retry-After, not an error inside a 200 stream.
   */
  async admit (record: SessionRecord, requests: readonly JsonRpcRequest[]): Promise<PoolReservations | string> {
    const reservations = new PoolReservations()
    // A request about a task another replica holds goes there; its marker names that replica, so
    // losing it answers the request (-32007) wherever it waits.
    const [first, ...others] = requests
    if (first !== undefined && others.length === 0 && TASK_METHODS.has(first.method) && !this.#tasks.holds(record.id, first)) {
      const holder = await this.#remote.replicaFor(record, first)
      if (holder !== undefined) return holder
    }
    // A task's requests go to the connection that holds it, taken when they run.
    const wanted = requests.filter(r => !ANSWERED_HERE.has(r.method) && !TASK_METHODS.has(r.method))
    // A batch (2025-03-26) takes its connections as its requests run, one at a time as they come
    // free: reserved all at once, a batch larger than poolMax would wait for its own.
    const [only] = wanted
    if (only === undefined || wanted.length > 1) return reservations
    reservations.set(only, await this.#options.pool.reserve(record.server, record.tenant ?? null, record.subjectDigest))
    return reservations
  }

  /** One client message of a pooled session (its request's answer goes to `streamId`). */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, reservations?: PoolReservations, holder?: string): Promise<void> {
    if (isResponse(message)) { this.answer(record.id, message); return }
    if (!isRequest(message)) {
      if (message.method === 'notifications/cancelled') await this.#cancel(record.id, message, true)
      // Others (initialized, roots/list_changed) concern a backend connection the session does not hold.
      return
    }
    const target = streamId ?? (record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM)
    const reservation = reservations?.take(message)
    try {
      if (ANSWERED_HERE.has(message.method)) {
        reservation?.release()
        await this.#state.answerHere(record, message, target)
        return
      }
      if (TASK_METHODS.has(message.method)) {
        reservation?.release()
        if (holder !== undefined) await this.#options.forward(holder, record.id, message, target)
        else this.#tasks.request(record, message, target)
        return
      }
      if (await this.#tasks.refusesNew(record, message, target)) { reservation?.release(); return }
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
    // A task's request (its elicitation) answered: the task named by the backend's id again.
    ask.call.answer(this.#tasks.answerForBackend(sid, response))
    return true
  }

  /**
   * A client message another replica passed here (a cancellation of a request running here, an
   * answer to a request asked from here). False when nothing here knows it.
   */
  fromEnvelope (sid: string, message: JsonRpcMessage, streamId: string | null = null): boolean {
    if (isRequest(message) && streamId !== null && TASK_METHODS.has(message.method)) {
      // A task request another replica passed here, as the task's holder.
      this.#options.store.get(sid).then(record => {
        // Only a pooled session's (a session of another kind whose relay is not here is gone here).
        if (record === null || kindNameOf(serverConfigOf(this.#options.live, record.server)) !== 'pooled') {
          this.#append(sid, streamId, toJsonRpcError(new GW_ERR_SESSION_NOT_FOUND(), message.id))
        } else this.#tasks.request(record, message, streamId, true)
      }, (err: unknown) => { this.#append(sid, streamId, toJsonRpcError(asGatewayError(err, '?'), message.id)) })
      return true
    }
    if (isResponse(message)) return this.answer(sid, message)
    if (isNotification(message) && message.method === 'notifications/cancelled') {
      this.#cancel(sid, message, false).catch(() => {})
      return this.#calls.has(sid)
    }
    return false
  }

  /** A session's GET (or legacy) stream is held here now: it gets the pool's list_changed. */
  listen (record: SessionRecord): void {
    this.#state.listen(record)
  }

  /** A session-level notification of a (server, tenant) pool (`forwarded`: another replica's pool saw it). */
  onServerEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    this.#state.onServerEvent(server, tenant, subject, message, forwarded)
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
    this.#state.forget(sid)
    this.#tasks.sessionEnded(sid)
  }

  /** This replica stops gracefully: the tasks held here end failed (pooled-task-requests.ts). */
  async shutdownTasks (): Promise<void> {
    await this.#tasks.shutdown(this.#options.replicaId)
  }

  stop (): void {
    clearInterval(this.#sweep)
    this.#state.stop()
    this.#tasks.stop()
  }

  // ---- requests ------------------------------------------------------------------------------

  /**
   * A request on a pooled connection (`connectionId`: that one, a task's): its key replaces its id
   * and progress token there.
   */
  #run (record: SessionRecord, request: JsonRpcRequest, streamId: string, reservation: Reservation | undefined, connectionId?: string): void {
    const sid = record.id
    const local = this.#track(sid, request.id, streamId, null)
    const sink = new SessionSink(this, record, request, local)
    const build = (key: string): JsonRpcRequest => underGatewayKey(request, key)
    const logLevel = logLevelOf(record)
    const runOn = (reserved: Reservation): PooledCall => {
      local.connectionId = reserved.connectionId
      return reserved.run(build, sink, { logLevel })
    }
    const { pool } = this.#options
    const tenant = record.tenant ?? null
    const started = reservation !== undefined
      ? Promise.resolve(runOn(reservation))
      : (connectionId !== undefined ? pool.reserveOn(record.server, tenant, connectionId, record.subjectDigest) : pool.reserve(record.server, tenant, record.subjectDigest)).then(runOn)
    started.then(call => {
      // Ended (or cancelled) while it waited for a connection: the backend is told at once.
      if (!this.#current(local)) { call.cancel('session ended or request cancelled'); return }
      local.call = call
    }, (err: unknown) => {
      this.#settled(local)
      this.#append(sid, streamId, toJsonRpcError(asGatewayError(err, record.server), request.id))
    })
  }

  /** A request running (or waiting) here, among the session's calls: a cancellation or the session's end finds it. */
  #track (sid: string, clientId: RequestId, streamId: string, connectionId: string | null): LocalCall {
    const local: LocalCall = { sid, clientId, streamId, call: null, connectionId }
    let calls = this.#calls.get(sid)
    if (calls === undefined) this.#calls.set(sid, calls = new Map())
    calls.set(idKey(clientId), local)
    return local
  }

  /** Whether the request is still running here (not cancelled, its session not ended). */
  #current (local: LocalCall): boolean {
    return this.#calls.get(local.sid)?.get(idKey(local.clientId)) === local
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
   * stream gets the cancelled mark (never sent; it settles the request, see the MCP spec's
   * "Cancellation"). A request running on another replica (one the session's pending markers
   * name) is told there.
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
    for (const replica of await this.#options.pendingReplicas(sid)) {
      if (replica !== this.#options.replicaId) await this.#options.forward(replica, sid, message).catch(() => {})
    }
  }

  // ---- tasks (pooled-task-requests.ts) -------------------------------------------------------

  /** @internal SessionSink: a backend message of a call, in the session's task ids. */
  taskIdsForClient (local: LocalCall, message: JsonRpcMessage): JsonRpcMessage | undefined {
    return this.#tasks.forClient(local.sid, local.connectionId, message)
  }

  /** @internal SessionSink: a CreateTaskResult of a call: the task recorded, shown under the session's id. */
  async taskCreated (local: LocalCall, record: SessionRecord, response: JsonRpcResponse & { result: Record<string, unknown> }): Promise<JsonRpcResponse> {
    return await this.#tasks.created(record, local.connectionId, response)
  }

  /** Live tasks of replicas that are gone are failed in the store (every replica's sweep). */
  async sweepLostTasks (): Promise<void> {
    const failed = await this.#remote.sweepLost()
    if (failed > 0) this.#options.log.warn({ tasks: failed }, 'live tasks of a lost replica failed')
  }

  // ---- backend -> client ---------------------------------------------------------------------

  /** @internal SessionSink: a message of a call, for its client stream. */
  deliver (local: LocalCall, message: JsonRpcMessage, final: boolean): void {
    if (final) {
      if (!this.#current(local)) return // cancelled or ended
      this.#settled(local)
    }
    // A JSON-mode stream carries only answers: what comes before goes to the GET stream.
    this.#append(local.sid, !final && isJsonStream(local.streamId) ? GET_STREAM : local.streamId, message)
  }

  /** @internal SessionSink: a server-to-client request of a call, sent to the client under its opaque id. */
  ask (local: LocalCall, request: JsonRpcRequest): void {
    if (local.call === null) {
      // The call is handed back in the turn its request was sent: a request this early waits for it.
      if (this.#current(local)) setImmediate(() => { this.ask(local, request) })
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
    this.#options.append(sid, streamId, message).catch(err => { this.#options.log.warn({ err, sid: shortHash(sid) }, 'pooled session message not appended') })
  }

  // ---- upkeep --------------------------------------------------------------------------------

  /** Forgets sessions that ended elsewhere or expired (their subscriptions let go), renews registrations. */
  async #sweepNow (): Promise<void> {
    const started = performance.now()
    this.#state.renewListening()
    await this.sweepLostTasks().catch(err => { this.#options.log.warn({ err }, 'lost tasks not failed') })
    const known = new Set([...this.#state.sessionsKnown(), ...this.#tasks.sessions()])
    let i = 0
    const batch: string[] = []
    const check = async (): Promise<void> => {
      const alive = await Promise.all(batch.map(async sid => await this.#options.store.exists(sid).catch(() => true)))
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
    if (ms > 1000) this.#options.log.info({ sessions: known.size, ms: Math.round(ms) }, 'pooled sessions sweep was slow')
  }
}

/** Receives what the pool sends of one call of a session, in the session's own terms. */
class SessionSink {
  readonly #owner: PooledSessions
  readonly #local: LocalCall
  readonly #progressToken: RequestId | undefined
  readonly #capabilities: Record<string, unknown>
  readonly #minLevel: number

  readonly #record: SessionRecord
  /** The request asked for a task (its answer may be a CreateTaskResult). */
  readonly #taskAugmented: boolean

  constructor (owner: PooledSessions, record: SessionRecord, request: JsonRpcRequest, local: LocalCall) {
    this.#owner = owner
    this.#local = local
    this.#record = record
    this.#taskAugmented = isRecord(request.params) && isRecord(request.params.task)
    this.#progressToken = progressTokenOf(request)
    this.#capabilities = capabilitiesOf(record.initializeParams)
    const level = logLevelOf(record)
    this.#minLevel = level === null ? 0 : isLogLevel(level) ? LOG_LEVELS.indexOf(level) : 0
  }

  onMessage (received: JsonRpcMessage): void {
    const local = this.#local
    if (isResponse(received)) {
      const response = { ...received, id: local.clientId } as JsonRpcResponse
      const created = this.#taskAugmented && 'result' in response && isRecord(response.result) && isRecord(response.result.task)
      if (!created) { this.#owner.deliver(local, this.#owner.taskIdsForClient(local, response) ?? response, true); return }
      // The task's record is in the store before the client sees its id.
      this.#owner.taskCreated(local, this.#record, response as JsonRpcResponse & { result: Record<string, unknown> })
        .then(shown => { this.#owner.deliver(local, shown, true) }, () => {})
      return
    }
    // The backend's task ids never reach the client: the session's own replace them, others go.
    const message = this.#owner.taskIdsForClient(local, received)
    if (message === undefined || isResponse(message)) return
    if (isRequest(message)) {
      const capability = capabilityNeededBy(message.method)
      if (capability !== undefined && this.#capabilities[capability] === undefined) {
        // Never forward what the client did not declare in its initialize (MCP spec, "Lifecycle": capability negotiation).
        local.call?.answer(errorResponse(message.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${message.method} (no '${capability}' capability)`))
        return
      }
      this.#owner.ask(local, message)
      return
    }
    const params = isRecord(message.params) ? message.params : {}
    switch (message.method) {
      case 'notifications/progress': {
        const progress = progressForClient(message, this.#progressToken)
        if (progress !== undefined) this.#owner.deliver(local, progress, false)
        return
      }
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
