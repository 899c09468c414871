// Client streams on this replica: the holder side of a request (docs/architecture.md, "A client
// request"). Delivery to a client is "append to the stream's log, then wake the holder"; the
// holder's ClientWriter pulls after its cursor, so a lost wake, a slow client and a resume are one
// case. Local first: when this replica holds the stream, the wake is a method call, not a bus
// envelope, and a stream's last answer is written before its append (docs/design-notes.md, the
// request path). This file opens streams and appends to them; held-streams.ts keeps them once
// open (their writers, their ends, their holder leases).
import { setTimeout as sleep } from 'node:timers/promises'
import type { ServerResponse } from 'node:http'
import type { FastifyBaseLogger } from 'fastify'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_CONFLICT, GW_ERR_SESSION_NOT_FOUND, GW_ERR_STORE_UNAVAILABLE, isGatewayError, toJsonRpcError, type GatewayError } from '../../core/errors.js'
import { isResponse, type JsonRpcMessage, type JsonRpcResponse, type RequestId } from '../../core/jsonrpc.js'
import type { ClientWriter, WriterFactory, WriterMode } from './writer.js'
import { ANSWERED_DIRECTLY, type AppendResult, type PendingRequest } from '../../state/event-log.js'
import { shortHash } from '../../telemetry/logger.js'
import type { StreamKind } from '../../telemetry/metrics.js'
import type { PreparedWake, WokenEntry } from '../../state/bus.js'
import { COMPLETED_STREAM_TTL_MS, HeldStreams, type HeldStreamsOptions } from './held-streams.js'
import { expectedResponsesOf, isRequestStreamId } from './stream-ids.js'
import type { TaskEvents } from './task-events.js'

export { COMPLETED_STREAM_TTL_MS, PRUNE_EVERY, PRUNE_SAMPLE } from './held-streams.js'
export { expectedResponsesOf, isRequestStreamId, newRequestStreamId } from './stream-ids.js'

/**
 * How long after the backend's own deadline a POST stream's holder answers what is still
 * unanswered (ClientStreams.openPost): the serving replica's timer always comes first; this one
 * catches a request that never reached a relay (a bus envelope lost in a Redis failover).
 */
export const POST_DEADLINE_GRACE_MS = 5_000
/**
 * The largest entry (JSON characters) a wake carries to a holder on another replica (it saves
 * that replica reading the log back). Bigger ones are read from the log as before, so
 * the bus never carries a large answer twice.
 */
export const WAKE_ENTRY_MAX_CHARS = 8_192

/**
 * How long an append that failed because the store's connection is away is tried again: across a
 * blink of the connection, a Redis restart or a Sentinel failover (seconds), not a long outage,
 * which the holders' own watch answers (ReplicaWatch, the heartbeat).
 */
export const APPEND_RETRY_MS = 5_000
const APPEND_RETRY_EVERY_MS = 50

/**
 * The client refused the command while disconnected (no offline queue): it never reached Redis.
 * ioredis says so only in its message ("Stream isn't writeable …", "Cluster isn't ready …").
 */
function neverSent (err: unknown): boolean {
  const cause = err instanceof Error ? err.cause : undefined
  return cause instanceof Error && cause.message.endsWith('and enableOfflineQueue options is false')
}

export interface OpenStreamOptions {
  res: ServerResponse
  sid: string
  streamId: string
  mode: WriterMode
  cursor: string | null
  fresh?: boolean
  batch?: boolean
  headers: Record<string, string>
  retryMs?: number
  preamble?: string
  /** Lazy SSE (StreamWriterOptions.lazyMs). */
  lazyMs?: number
  /** A POST stream: its requests' ids (answered directly if the store becomes unreachable). */
  requestIds?: RequestId[]
  /** A new standalone GET stream: 409 if this replica already writes one (checked atomically). */
  exclusive?: boolean
  log: FastifyBaseLogger
}

/** A POST's new stream (ClientStreams.openPost): its cursor is the priming entry, if any. */
export interface OpenPostOptions extends Omit<OpenStreamOptions, 'cursor' | 'fresh' | 'preamble' | 'exclusive'> {
  requestIds: RequestId[]
  /** Whether the stream starts with a priming entry (an event id the client can resume from before any answer). */
  priming: boolean
  /** The stream's first bytes, given the priming entry's id. */
  preamble: (primingId: string) => string
  /** The replica whose relay sends these requests to the backend (default this one). */
  servedBy?: string
  /** The backend's deadline: past it (and POST_DEADLINE_GRACE_MS), unanswered requests get -32006 here. */
  deadline?: { server: string, timeoutMs: number }
  /**
   * When the requests may leave, against their mark (see openPost). 'first' (the default): once
   * the mark is in. 'alongside': now; they go through the bus, which delivers them only after the
   * mark (Bus.ordered). 'when-needed': now, to a backend connection on this replica; the mark waits
   * until the stream needs its log.
   */
  mark?: 'first' | 'alongside' | 'when-needed'
  /**
   * The session's record was read from the store for this very request (not from a cache), so
   * with 'when-needed' nothing more is asked of Redis: the session existed a moment ago, as in
   * one process.
   */
  recordRead?: boolean
}

export interface ClientStreamsOptions extends HeldStreamsOptions {
  /** Replica liveness (cached by Ownership). */
  isAlive: (replica: string) => Promise<boolean>
  /** Makes a client stream's writer (the HTTP layer's, handed down by app.ts). */
  newWriter: WriterFactory
  /** Sees every message for a client: the tasks it tells of (metrics, audit, the console's view). */
  taskEvents?: TaskEvents
}

export class ClientStreams {
  readonly #services: ClientStreamsOptions
  /** The streams held here once open: their writers, ends and holder leases. */
  readonly #held: HeldStreams

  constructor (services: ClientStreamsOptions) {
    this.#services = services
    this.#held = new HeldStreams(services)
  }

  get #leaseMs (): number { return this.#services.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#services.config.sessions.idleTimeoutMs }

  /**
   * Appends to a client stream's log and wakes its holder (local call, or a bus wake). An answer
   * on a POST stream is written only while its request is pending (EventLog.append `answers`):
   * exactly one answer per request, whoever gives it. `claimed`: the caller took the request's
   * marker already (claimOrphans). `expectedHolder`: the replica expected to hold the stream (the
   * one that sent the request here): a small entry's wake to it goes with the append (Bus.prepareWake).
   * `once`: an answer on a stream that keeps no markers (the legacy stream) is written only if the
   * log holds no answer to its request yet (EventLog.append `answers` with no marker).
   * Returns '' when nothing was written.
   */
  async append (sid: string, streamId: string, message: JsonRpcMessage | null, claimed = false, expectedHolder?: string, once = false): Promise<string> {
    if (message !== null) this.#services.taskEvents?.toClient(sid, message)
    const response = message !== null && isResponse(message) && isRequestStreamId(streamId)
    const answers = !claimed && message !== null && isResponse(message) && (response || once) && message.id != null ? message.id : undefined
    // The one answer of a one-request stream completes it: the log is kept only briefly from now
    // on (see #onWriterEnd), set in the same step rather than by a command of its own.
    const ttlMs = response && expectedResponsesOf(streamId) === 1 ? Math.min(this.#idleMs, COMPLETED_STREAM_TTL_MS) : this.#idleMs
    // The writer of this stream here, if any. From now until this append is done, no later answer
    // overtakes it (ClientWriter.appending), also while it waits for the stream's mark.
    const local = this.#held.get(sid, streamId)
    if (local !== undefined) local.appending++
    let json: string | undefined
    let appended: AppendResult
    try {
      // A stream opened before its mark (openPost, `mark`): the verdict on the session first.
      if (local?.marking !== undefined) await local.marking
      if (response && answers !== undefined && local !== undefined) {
        // Local fast path: the answer that completes a stream written here goes to its client before
        // the log's round trip (ClientWriter.answerDirectly). As one JSON body it never needs the log
        // (#onWriterEnd drops log and marker, if it was marked); as an SSE stream's last frame it is
        // appended after. Serialised once, for the direct write and the log alike. This append's
        // own count is left out of the writer's check, which is about appends ahead of it.
        json = JSON.stringify(message)
        local.appending--
        const direct = local.answerDirectly(message as JsonRpcResponse, json)
        local.appending++
        if (direct === 'json') return ANSWERED_DIRECTLY
      }
      // Into the log: a stream not marked yet is marked first (its priming entry comes first).
      if (local !== undefined && !local.ended && local.markLater !== undefined) local.markLater()
      if (local?.marking !== undefined) await local.marking
      let wake: PreparedWake | undefined
      if (expectedHolder !== undefined && expectedHolder !== this.#services.replicaId && message !== null) {
        json ??= JSON.stringify(message)
        if (json.length <= WAKE_ENTRY_MAX_CHARS) wake = this.#services.bus.prepareWake(expectedHolder, sid, streamId, json)
      }
      appended = await this.#appendRetrying(sid, streamId, message, ttlMs, answers, json, wake)
    } finally {
      if (local !== undefined) local.appending--
    }
    const { entryId, holder, entry } = appended
    // Written: the holder's wake went with it (the expected holder still held the stream).
    if (entryId === '' || appended.woken === true) return entryId
    if (holder === this.#services.replicaId) {
      // Local first: the writer here takes the entry as appended, without reading it back.
      const writer = this.#held.get(sid, streamId)
      if (writer !== undefined) void (entry !== undefined ? writer.offer(entry) : writer.wake())
    } else if (holder !== null) {
      // A small entry rides with the wake, so the holder need not read the log back for it.
      const woken = entry !== undefined && entry.json !== '' && entry.json.length <= WAKE_ENTRY_MAX_CHARS ? { entryId: entry.entryId, json: entry.json, seq: entry.seq } : undefined
      await this.#services.bus.send(holder, { kind: 'wake', sid, streamId, entry: woken }).catch(err => {
        this.#services.log.warn({ err, sid: shortHash(sid) }, 'wake not sent; the entry waits in the log')
      })
    }
    return entryId
  }

  /**
   * EventLog.append, tried again while the store's connection comes back (bounded,
   * APPEND_RETRY_MS): an answer the backend gave is not dropped for a blink of Redis.
   * An answer (`answers`) is safe to send again: a try that was applied after all took its marker
   * and left it in the log, so the next one writes nothing. Any other entry is sent again only
   * when the try never left (refused while disconnected), so a notification is not written twice.
   */
  async #appendRetrying (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, answers: RequestId | undefined, json: string | undefined, wake: PreparedWake | undefined): Promise<AppendResult> {
    const until = Date.now() + APPEND_RETRY_MS
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#services.eventLog.append(sid, streamId, message, ttlMs, answers, json, wake)
      } catch (err) {
        const retry = isGatewayError(err) && err.code === 'GW_ERR_STORE_UNAVAILABLE' && (answers !== undefined || neverSent(err))
        if (!retry || Date.now() >= until || this.#services.config.redis === undefined) throw err
        if (attempt === 0) this.#services.log.warn({ err, sid: shortHash(sid) }, 'append failed; trying again while the store reconnects')
        do await sleep(APPEND_RETRY_EVERY_MS)
        while (!this.#services.store.isReady() && Date.now() < until)
      }
    }
  }

  /** Opens a client stream on this replica: claims the holder lease, then tails the log. */
  async open (options: OpenStreamOptions): Promise<ClientWriter> {
    const { sid, streamId } = options
    const replicaId = this.#services.replicaId
    const current = this.#held.get(sid, streamId)
    if (options.exclusive === true && current !== undefined && !current.ended) {
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    if (current !== undefined) this.#held.end(current, 'released', 'a new connection to this replica took the stream over')
    const writer = this.#register(options, options.cursor, options.fresh === true)
    let previous: string | null
    try {
      previous = await this.#services.store.claimHolder(sid, streamId, replicaId, this.#leaseMs)
    } catch (err) {
      // Not started, so nothing was written: forget it and let the error handler answer.
      this.#held.forget(writer)
      throw err
    }
    if (options.exclusive === true && previous !== null && previous !== replicaId && await this.#services.isAlive(previous)) {
      // Another replica opened this session's GET stream at the same moment and is alive: hand the
      // stream back to it and refuse this one, as a local second GET is refused.
      await this.#services.store.claimHolder(sid, streamId, previous, this.#leaseMs).catch(() => {})
      this.#held.forget(writer)
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    if (previous !== null && previous !== replicaId) {
      await this.#services.bus.send(previous, { kind: 'release', sid, streamId }).catch(() => {})
    }
    return writer
  }

  /**
   * Opens a POST's new stream on this replica: records its requests as pending, claims the holder
   * lease and appends the priming entry (`preamble` gets its id), all in one step of the log
   * (EventLog.markPending): a new stream has no previous holder to hand it back from. The writer
   * is registered first, so a wake for an answer that comes at once is never lost.
   *
   * Not waiting for the mark (it was a Redis round trip before every call), the writer
   * is returned at once and whatever could overtake the mark waits for it (`ClientWriter.marking`):
   * every append to the stream and every wake of it (answers included, so a session found gone
   * answers 404, not the backend's result) and the opening of the SSE stream (its priming id).
   * - `mark: 'when-needed'` (the requests' backend connection is on this replica): the requests
   *   reach the backend while only the verdict on the session (an EXISTS) is on its way; the mark
   *   is made when the stream first needs its log (markLater).
   * - `mark: 'alongside'` (another replica's relay serves them, Bus.ordered): the mark is sent now,
   *   and the bus envelope sent after it on the same connection reaches the owner only once the
   *   mark is applied, so the answer finds its marker in place.
   */
  async openPost (options: OpenPostOptions): Promise<ClientWriter> {
    const { preamble, priming, servedBy, deadline, sid, streamId, requestIds } = options
    const writer = this.#register(options, null, true)
    const mark = async (): Promise<string | null> => await this.#services.eventLog.markPending(sid, streamId, requestIds, this.#idleMs, priming, servedBy ?? this.#services.replicaId, { replicaId: this.#services.replicaId, leaseMs: this.#leaseMs })
    // Only while Redis answers: with the store known away, the mark fails before anything is sent.
    const order = options.mark === undefined || !this.#services.store.isReady() ? 'first' : options.mark
    if (order === 'when-needed') {
      // The verdict on the session goes alongside the requests; the mark itself waits until the
      // stream needs it (an append to its log, or the SSE stream opening), which a quick answer
      // given as one JSON body never does.
      writer.markLater = () => {
        writer.markLater = undefined
        const verdict = writer.marking ?? Promise.resolve()
        this.#gate(writer, verdict.then(async () => {
          if (writer.ended) return
          const primingId = await mark()
          if (!writer.ended) writer.primed(primingId, primingId === null ? undefined : preamble(primingId))
        }))
      }
      // With Redis the record may have been read before (Sessions.get, #owned); when it was read
      // for this request (recordRead, and always in one process), there is nothing to ask.
      if (this.#services.config.redis !== undefined && options.recordRead !== true) this.#gate(writer, this.#services.store.exists(sid).then(found => { if (!found) throw new GW_ERR_SESSION_NOT_FOUND() }))
    } else if (order === 'alongside') {
      // Issued now, before the caller's envelope: the mark is also the verdict (a session gone is a 404).
      this.#gate(writer, mark().then(primingId => { if (!writer.ended) writer.primed(primingId, primingId === null ? undefined : preamble(primingId)) }))
    } else {
      let primingId: string | null
      try {
        primingId = await mark()
      } catch (err) {
        this.#held.forget(writer)
        throw err
      }
      writer.primed(primingId, primingId === null ? undefined : preamble(primingId))
    }
    if (deadline !== undefined) {
      // Every accepted request gets an answer even if it never reached a relay: past the backend's
      // deadline, whatever is still unanswered is answered here. An answer given already wins
      // (append writes only while a request is pending), so this adds nothing when all is well.
      this.#held.setDeadline(writer, deadline.timeoutMs + POST_DEADLINE_GRACE_MS, () => {
        // Made only when the deadline passes: an error (with its stack) per POST would be hot-path waste.
        const timeout = new GW_ERR_BACKEND_TIMEOUT(deadline.server, deadline.timeoutMs)
        for (const id of requestIds) {
          this.append(sid, streamId, toJsonRpcError(timeout, id)).catch(err => this.#services.log.warn({ err, sid: shortHash(sid) }, 'deadline answer not appended'))
        }
      })
    }
    return writer
  }

  /**
   * Sets `writer.marking` to `work` until it settles: appends to the stream and its opening wait
   * for it. A failure refuses the POST (#markFailed); the gate itself never rejects.
   */
  #gate (writer: ClientWriter, work: Promise<void>): void {
    const gate: Promise<void> = work.then(() => {}, (err: unknown) => { this.#markFailed(writer, err) }).finally(() => {
      if (writer.marking === gate) writer.marking = undefined
    })
    writer.marking = gate
  }

  /**
   * The verdict or the mark of a stream opened before them failed (openPost, `mark`): the
   * POST is refused as it would have been before its stream started, with the error's status: 404
   * when the session is gone (deleted or expired meanwhile), 503 when Redis cannot be reached. The
   * request may be running already; its answer finds no writer and no marker. Refusing is what
   * the gateway does for any request while the store is away (and for requests in flight then),
   * and a stream without its marker and priming entry could carry nothing but a direct answer.
   */
  #markFailed (writer: ClientWriter, err: unknown): void {
    if (writer.ended) return
    const refusal = isGatewayError(err) ? err : new GW_ERR_STORE_UNAVAILABLE('the requests could not be recorded')
    if (refusal.code !== 'GW_ERR_SESSION_NOT_FOUND') this.#services.log.warn({ err, sid: shortHash(writer.sid) }, 'requests not marked pending; refused')
    this.#held.refuse(writer, refusal)
  }

  /**
   * Makes and registers a stream's writer. Its options are one literal of a fixed shape, not a
   * spread of the caller's: a spread of this many properties cost microseconds per POST.
   */
  #register (options: OpenStreamOptions | OpenPostOptions, cursor: string | null, fresh: boolean): ClientWriter {
    const writer = this.#services.newWriter({
      res: options.res,
      sid: options.sid,
      streamId: options.streamId,
      eventLog: this.#services.eventLog,
      mode: options.mode,
      cursor,
      expectedResponses: expectedResponsesOf(options.streamId),
      requestIds: options.requestIds,
      batch: options.batch,
      fresh,
      headers: options.headers,
      keepAliveMs: this.#services.config.http.keepAliveMs,
      retryMs: options.retryMs,
      preamble: typeof options.preamble === 'string' ? options.preamble : undefined,
      lazyMs: options.lazyMs,
      onEnd: this.#held.onEnd,
      log: options.log,
      metrics: this.#services.metrics.registry === null ? undefined : this.#services.metrics
    })
    this.#held.add(writer)
    return writer
  }

  /** New entries in a stream this replica holds: its writer pulls them, or writes `entry` at once (ClientWriter.offer). */
  wake (sid: string, streamId: string, entry?: WokenEntry): void {
    const writer = this.#held.get(sid, streamId)
    if (writer === undefined) return
    if (writer.marking !== undefined) {
      // Its mark is still on its way (openPost, `mark`): the entry follows the priming entry.
      void writer.marking.then(() => { this.wake(sid, streamId, entry) })
      return
    }
    if (entry === undefined) { void writer.wake(); return }
    let message: JsonRpcMessage
    try {
      message = JSON.parse(entry.json) as JsonRpcMessage
    } catch {
      void writer.wake()
      return
    }
    void writer.offer({ entryId: entry.entryId, json: entry.json, seq: entry.seq, message })
  }

  /** Whether a live GET stream exists for the session (a session has one standalone GET stream at most). */
  async hasLive (sid: string, streamId: string): Promise<boolean> {
    const local = this.#held.get(sid, streamId)
    if (local !== undefined && !local.ended) return true
    const holder = await this.#services.store.getHolder(sid, streamId)
    return holder !== null && holder !== this.#services.replicaId && await this.#services.store.isAlive(holder)
  }

  /** Whether a stream of this session has a log (a Last-Event-ID must name one of the session's streams). */
  async exists (sid: string, streamId: string): Promise<boolean> {
    return await this.#services.eventLog.hasStream(sid, streamId)
  }

  /** Where a new GET stream without Last-Event-ID starts: after what was last written. */
  async cursor (sid: string, streamId: string): Promise<string | null> {
    return await this.#services.store.getCursor(sid, streamId)
  }

  // ---- the streams held here (held-streams.ts) ----------------------------------------------

  /** Whether this replica writes the stream now (it holds it and the writer is live). */
  writes (sid: string, streamId: string): boolean { return this.#held.writes(sid, streamId) }

  /** Another replica took the stream over: stop writing it. */
  release (sid: string, streamId: string): void { this.#held.release(sid, streamId) }

  /** Streams written here, by kind (read when metrics are scraped). */
  countByKind (): Map<StreamKind, number> { return this.#held.countByKind() }

  /** Sessions with a POST stream open here: their owner is watched (HeldStreams.awaitingSessions). */
  awaitingSessions (): Set<string> { return this.#held.awaitingSessions() }

  /** The store is unreachable: POST streams here answer their open requests (HeldStreams.failAwaiting). */
  failAwaiting (answer: (id: RequestId) => JsonRpcResponse): Array<PendingRequest & { sid: string }> { return this.#held.failAwaiting(answer) }

  /** The session ended: its streams here end too (HeldStreams.endSession). */
  endSession (sid: string, err: GatewayError): void { this.#held.endSession(sid, err) }

  /** Shutdown: every stream ends with a retry hint (HeldStreams.endAll). */
  endAll (retryMs: number): void { this.#held.endAll(retryMs) }

  /** Holder leases renewed; returns the sessions that still have a stream held here (HeldStreams.renew). */
  async renew (): Promise<Set<string>> { return await this.#held.renew() }
}
