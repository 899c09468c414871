// Client streams on this replica: the holder side of ARCHITECTURE.md flows 1, 2 and 4. Delivery
// to a client is "append to the stream's log, then wake the holder"; the holder's ClientWriter
// pulls after its cursor, so a lost wake, a slow client and a resume are one case.
// Local first: when this replica holds the stream, the wake is a method call, not a bus envelope,
// and a stream's last answer is written before its append (docs/design-notes.md, the request path).
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { ServerResponse } from 'node:http'
import type { FastifyBaseLogger } from 'fastify'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_CONFLICT, GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN, GW_ERR_STORE_UNAVAILABLE, isGatewayError, toJsonRpcError, type GatewayError } from '../../core/errors.js'
import { isResponse, type JsonRpcMessage, type JsonRpcResponse, type RequestId } from '../../core/jsonrpc.js'
import type { ClientWriter, WriterEndReason, WriterFactory, WriterMode } from './writer.js'
import { ANSWERED_DIRECTLY, GET_STREAM, LEGACY_STREAM, type AppendResult, type PendingRequest } from '../../state/event-log.js'
import { shortHash } from '../../telemetry/logger.js'
import { tracing } from '../../telemetry/tracing.js'
import { streamKindOf, type StreamKind } from '../../telemetry/metrics.js'
import type { PreparedWake, WokenEntry } from '../../state/bus.js'
import type { ReplicaContext } from './context.js'
import { inBatches } from './upkeep.js'

/** How long a completed request stream's log stays for a late resume. */
export const COMPLETED_STREAM_TTL_MS = 60_000

/**
 * How long after the backend's own deadline a POST stream's holder answers what is still
 * unanswered (ClientStreams.openPost): the serving replica's timer always comes first; this one
 * catches a request that never reached a relay (a bus envelope lost in a Redis failover).
 */
export const POST_DEADLINE_GRACE_MS = 5_000
/**
 * The largest entry (JSON characters) a wake carries to a holder on another replica (issue 10:
 * it saves that replica reading the log back). Bigger ones are read from the log as before, so
 * the bus never carries a large answer twice.
 */
export const WAKE_ENTRY_MAX_CHARS = 8_192

/**
 * Every PRUNE_EVERY streams that end leaving their keys to expire, the session of the last one
 * has PRUNE_SAMPLE of its listed streams checked for lapsed ones (EventLog.prune). Sampling twice
 * as many as were added keeps a session's list near twice the streams it has alive (those of the
 * last COMPLETED_STREAM_TTL_MS), however long it runs; a busy session ends more streams, so it is
 * pruned more often. Off the request path: one read and one script per PRUNE_EVERY streams.
 */
export const PRUNE_EVERY = 32
export const PRUNE_SAMPLE = 2 * PRUNE_EVERY

/** A per-process random prefix: stream ids are unique across replicas and restarts without a syscall each. */
const STREAM_PREFIX = randomBytes(9).toString('base64url')

/**
 * How long an append that failed because the store's connection is away is tried again (issue
 * 28): across a blink of the connection, a Redis restart or a Sentinel failover (seconds), not a
 * long outage, which the holders' own watch answers (Router #onBeat).
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
let streamSeq = 0

/** What a stream's end means when nobody here said more (the client closed it, a write failed). */
const WHY: Record<WriterEndReason, string> = {
  complete: 'every answer was written',
  'client-closed': 'the client closed the connection',
  released: 'another replica holds the stream now',
  shutdown: 'the replica is shutting down',
  'session-ended': 'the session ended',
  error: 'writing or resuming the stream failed'
}

/**
 * Request stream ids say their kind and how many responses end them: `r1_<prefix><seq>`,
 * `j3_<prefix><seq>`. They need only be unique (a stream belongs to its session, which the
 * principal check guards), so a counter after the process's random prefix does.
 */
export function newRequestStreamId (mode: 'sse' | 'json', responses: number): string {
  return `${mode === 'sse' ? 'r' : 'j'}${responses}_${STREAM_PREFIX}${(++streamSeq).toString(36)}`
}

/**
 * How many answers end a stream: a POST's stream id is `r` (SSE) or `j` (JSON), one to four
 * digits, then `_`; any other stream (GET, legacy) never ends by answers: Infinity. Read by hand,
 * not by a regular expression: it runs several times per call (issue 10).
 */
export function expectedResponsesOf (streamId: string): number {
  const kind = streamId.charCodeAt(0)
  if (kind !== 0x72 && kind !== 0x6a) return Infinity // r, j
  let n = 0
  for (let i = 1; i <= 5; i++) {
    const c = streamId.charCodeAt(i)
    if (c === 0x5f) return i === 1 ? Infinity : n // _
    if (c < 0x30 || c > 0x39 || i === 5) return Infinity
    n = n * 10 + c - 0x30
  }
  return Infinity
}

/** Whether a stream is a POST's own stream (it carries the answers of that POST's requests). */
export function isRequestStreamId (streamId: string): boolean {
  return expectedResponsesOf(streamId) !== Infinity
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
  /** Whether the stream starts with a priming entry (H-POST-7). */
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

export interface ClientStreamsOptions extends ReplicaContext {
  /** Replica liveness (cached by Ownership). */
  isAlive: (replica: string) => Promise<boolean>
  /** A legacy HTTP+SSE session lives as long as its one stream. */
  endSession: (sid: string, reason: string) => Promise<void>
  /** Makes a client stream's writer (the HTTP layer's, handed down by app.ts). */
  newWriter: WriterFactory
}

export class ClientStreams {
  readonly #o: ClientStreamsOptions
  /**
   * Writers by session, then stream: a session's streams are found without a scan of all. A
   * session that has had one stream at a time here (an idle one holds only its GET stream) keeps
   * the writer itself, not a map of one (heap per idle session, issue 10).
   */
  readonly #writers = new Map<string, ClientWriter | Map<string, ClientWriter>>()
  /** Every writer's end callback: one function, not a closure per stream. */
  readonly #onEnd = (writer: ClientWriter, reason: WriterEndReason): void => { this.#onWriterEnd(writer, reason) }
  /** POST streams' catch-all deadlines (openPost), cleared when their writer completes. */
  readonly #deadlines = new Map<ClientWriter, NodeJS.Timeout>()
  /** Why the gateway ended a stream, until #onWriterEnd logs it. */
  readonly #why = new WeakMap<ClientWriter, string>()
  /** Streams ended here that left keys to expire (PRUNE_EVERY). */
  #lapsing = 0

  constructor (options: ClientStreamsOptions) {
    this.#o = options
  }

  get #leaseMs (): number { return this.#o.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#o.config.sessions.idleTimeoutMs }

  /**
   * Appends to a client stream's log and wakes its holder (local call, or a bus wake). An answer
   * on a POST stream is written only while its request is pending (EventLog.append `answers`):
   * exactly one answer per request, whoever gives it. `claimed`: the caller took the request's
   * marker already (claimOrphans). `expectedHolder`: the replica expected to hold the stream (the
   * one that sent the request here): a small entry's wake to it goes with the append (Bus.prepareWake).
   * Returns '' when nothing was written.
   */
  async append (sid: string, streamId: string, message: JsonRpcMessage | null, claimed = false, expectedHolder?: string): Promise<string> {
    const response = message !== null && isResponse(message) && isRequestStreamId(streamId)
    const answers = !claimed && response && message.id != null ? message.id : undefined
    // The one answer of a one-request stream completes it: the log is kept only briefly from now
    // on (see #onWriterEnd), set in the same step rather than by a command of its own.
    const ttlMs = response && expectedResponsesOf(streamId) === 1 ? Math.min(this.#idleMs, COMPLETED_STREAM_TTL_MS) : this.#idleMs
    // The writer of this stream here, if any. From now until this append is done, no later answer
    // overtakes it (ClientWriter.appending), also while it waits for the stream's mark.
    const local = this.#get(sid, streamId)
    if (local !== undefined) local.appending++
    let json: string | undefined
    let appended: AppendResult
    try {
      // A stream opened before its mark (openPost, `mark`): the verdict on the session first.
      if (local?.marking !== undefined) await local.marking
      if (answers !== undefined && local !== undefined) {
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
      if (expectedHolder !== undefined && expectedHolder !== this.#o.replicaId && message !== null) {
        json ??= JSON.stringify(message)
        if (json.length <= WAKE_ENTRY_MAX_CHARS) wake = this.#o.bus.prepareWake(expectedHolder, sid, streamId, json)
      }
      appended = await this.#appendRetrying(sid, streamId, message, ttlMs, answers, json, wake)
    } finally {
      if (local !== undefined) local.appending--
    }
    const { entryId, holder, entry } = appended
    // Written: the holder's wake went with it (the expected holder still held the stream).
    if (entryId === '' || appended.woken === true) return entryId
    if (holder === this.#o.replicaId) {
      // Local first: the writer here takes the entry as appended, without reading it back.
      const writer = this.#get(sid, streamId)
      if (writer !== undefined) void (entry !== undefined ? writer.offer(entry) : writer.wake())
    } else if (holder !== null) {
      // A small entry rides with the wake, so the holder need not read the log back for it.
      const woken = entry !== undefined && entry.json !== '' && entry.json.length <= WAKE_ENTRY_MAX_CHARS ? { entryId: entry.entryId, json: entry.json, seq: entry.seq } : undefined
      await this.#o.bus.send(holder, { kind: 'wake', sid, streamId, entry: woken }).catch(err => {
        this.#o.log.warn({ err, sid: shortHash(sid) }, 'wake not sent; the entry waits in the log')
      })
    }
    return entryId
  }

  /**
   * EventLog.append, tried again while the store's connection comes back (bounded,
   * APPEND_RETRY_MS): an answer the backend gave is not dropped for a blink of Redis (issue 28).
   * An answer (`answers`) is safe to send again: a try that was applied after all took its marker
   * and left it in the log, so the next one writes nothing. Any other entry is sent again only
   * when the try never left (refused while disconnected), so a notification is not written twice.
   */
  async #appendRetrying (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, answers: RequestId | undefined, json: string | undefined, wake: PreparedWake | undefined): Promise<AppendResult> {
    const until = Date.now() + APPEND_RETRY_MS
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#o.eventLog.append(sid, streamId, message, ttlMs, answers, json, wake)
      } catch (err) {
        const retry = isGatewayError(err) && err.code === 'GW_ERR_STORE_UNAVAILABLE' && (answers !== undefined || neverSent(err))
        if (!retry || Date.now() >= until || this.#o.config.redis === undefined) throw err
        if (attempt === 0) this.#o.log.warn({ err, sid: shortHash(sid) }, 'append failed; trying again while the store reconnects')
        do await sleep(APPEND_RETRY_EVERY_MS)
        while (!this.#o.store.isReady() && Date.now() < until)
      }
    }
  }

  /** Opens a client stream on this replica: claims the holder lease, then tails the log. */
  async open (options: OpenStreamOptions): Promise<ClientWriter> {
    const { sid, streamId } = options
    const replicaId = this.#o.replicaId
    const current = this.#get(sid, streamId)
    if (options.exclusive === true && current !== undefined && !current.ended) {
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    if (current !== undefined) this.#end(current, 'released', 'a new connection to this replica took the stream over')
    const writer = this.#register(options, options.cursor, options.fresh === true)
    let previous: string | null
    try {
      previous = await this.#o.store.claimHolder(sid, streamId, replicaId, this.#leaseMs)
    } catch (err) {
      // Not started, so nothing was written: forget it and let the error handler answer.
      this.#delete(writer)
      throw err
    }
    if (options.exclusive === true && previous !== null && previous !== replicaId && await this.#o.isAlive(previous)) {
      // Another replica opened this session's GET stream at the same moment and is alive: hand the
      // stream back to it and refuse this one, as a local second GET is refused.
      await this.#o.store.claimHolder(sid, streamId, previous, this.#leaseMs).catch(() => {})
      this.#delete(writer)
      throw new GW_ERR_CONFLICT('Only one GET stream is allowed per session')
    }
    if (previous !== null && previous !== replicaId) {
      await this.#o.bus.send(previous, { kind: 'release', sid, streamId }).catch(() => {})
    }
    return writer
  }

  /**
   * Opens a POST's new stream on this replica: records its requests as pending, claims the holder
   * lease and appends the priming entry (`preamble` gets its id), all in one step of the log
   * (EventLog.markPending): a new stream has no previous holder to hand it back from. The writer
   * is registered first, so a wake for an answer that comes at once is never lost.
   *
   * Not waiting for the mark (issue 10: it was a Redis round trip before every call), the writer
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
    const mark = async (): Promise<string | null> => await this.#o.eventLog.markPending(sid, streamId, requestIds, this.#idleMs, priming, servedBy ?? this.#o.replicaId, { replicaId: this.#o.replicaId, leaseMs: this.#leaseMs })
    // Only while Redis answers: with the store known away, the mark fails before anything is sent.
    const order = options.mark === undefined || !this.#o.store.isReady() ? 'first' : options.mark
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
      if (this.#o.config.redis !== undefined && options.recordRead !== true) this.#gate(writer, this.#o.store.exists(sid).then(found => { if (!found) throw new GW_ERR_SESSION_NOT_FOUND() }))
    } else if (order === 'alongside') {
      // Issued now, before the caller's envelope: the mark is also the verdict (a session gone is a 404).
      this.#gate(writer, mark().then(primingId => { if (!writer.ended) writer.primed(primingId, primingId === null ? undefined : preamble(primingId)) }))
    } else {
      let primingId: string | null
      try {
        primingId = await mark()
      } catch (err) {
        this.#delete(writer)
        throw err
      }
      writer.primed(primingId, primingId === null ? undefined : preamble(primingId))
    }
    if (deadline !== undefined) {
      // Every accepted request gets an answer even if it never reached a relay: past the backend's
      // deadline, whatever is still unanswered is answered here. An answer given already wins
      // (append writes only while a request is pending), so this adds nothing when all is well.
      this.#deadlines.set(writer, setTimeout(() => {
        this.#deadlines.delete(writer)
        // Made only when the deadline passes: an error (with its stack) per POST would be hot-path waste.
        const timeout = new GW_ERR_BACKEND_TIMEOUT(deadline.server, deadline.timeoutMs)
        for (const id of requestIds) {
          this.append(sid, streamId, toJsonRpcError(timeout, id)).catch(err => this.#o.log.warn({ err, sid: shortHash(sid) }, 'deadline answer not appended'))
        }
      }, deadline.timeoutMs + POST_DEADLINE_GRACE_MS).unref())
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
    clearTimeout(this.#deadlines.get(writer))
    this.#deadlines.delete(writer)
    const refusal = isGatewayError(err) ? err : new GW_ERR_STORE_UNAVAILABLE('the requests could not be recorded')
    if (refusal.code !== 'GW_ERR_SESSION_NOT_FOUND') this.#o.log.warn({ err, sid: shortHash(writer.sid) }, 'requests not marked pending; refused')
    this.#why.set(writer, `requests refused: ${refusal.code}`)
    if (!writer.refuse(refusal)) this.#endWithSession(writer, refusal)
  }

  /**
   * Makes and registers a stream's writer. Its options are one literal of a fixed shape, not a
   * spread of the caller's: a spread of this many properties cost microseconds per POST (issue 10).
   */
  #register (options: OpenStreamOptions | OpenPostOptions, cursor: string | null, fresh: boolean): ClientWriter {
    const writer = this.#o.newWriter({
      res: options.res,
      sid: options.sid,
      streamId: options.streamId,
      eventLog: this.#o.eventLog,
      mode: options.mode,
      cursor,
      expectedResponses: expectedResponsesOf(options.streamId),
      requestIds: options.requestIds,
      batch: options.batch,
      fresh,
      headers: options.headers,
      keepAliveMs: this.#o.config.http.keepAliveMs,
      retryMs: options.retryMs,
      preamble: typeof options.preamble === 'string' ? options.preamble : undefined,
      lazyMs: options.lazyMs,
      onEnd: this.#onEnd,
      log: options.log,
      metrics: this.#o.metrics.registry === null ? undefined : this.#o.metrics
    })
    this.#set(writer)
    return writer
  }

  /** New entries in a stream this replica holds: its writer pulls them, or writes `entry` at once (ClientWriter.offer). */
  wake (sid: string, streamId: string, entry?: WokenEntry): void {
    const writer = this.#get(sid, streamId)
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

  /** Whether this replica writes the stream now (it holds it and the writer is live). */
  writes (sid: string, streamId: string): boolean {
    const writer = this.#get(sid, streamId)
    return writer !== undefined && !writer.ended
  }

  /** Another replica took the stream over: stop writing it. */
  release (sid: string, streamId: string): void {
    const writer = this.#get(sid, streamId)
    if (writer !== undefined) this.#end(writer, 'released', 'the client resumed the stream on another replica')
  }

  /** Whether a live GET stream exists for the session (one standalone GET stream, H-GET-3). */
  async hasLive (sid: string, streamId: string): Promise<boolean> {
    const local = this.#get(sid, streamId)
    if (local !== undefined && !local.ended) return true
    const holder = await this.#o.store.getHolder(sid, streamId)
    return holder !== null && holder !== this.#o.replicaId && await this.#o.store.isAlive(holder)
  }

  /** Whether a stream of this session has a log (a Last-Event-ID must name one, H-RES-2). */
  async exists (sid: string, streamId: string): Promise<boolean> {
    return await this.#o.eventLog.hasStream(sid, streamId)
  }

  /** Where a new GET stream without Last-Event-ID starts: after what was last written. */
  async cursor (sid: string, streamId: string): Promise<string | null> {
    return await this.#o.store.getCursor(sid, streamId)
  }

  /** Streams written here, by kind (read when metrics are scraped). */
  countByKind (): Map<StreamKind, number> {
    const counts = new Map<StreamKind, number>()
    for (const writer of this.#all()) {
      const kind = streamKindOf(writer.streamId)
      counts.set(kind, (counts.get(kind) ?? 0) + 1)
    }
    return counts
  }

  /**
   * Sessions with a POST stream open here (new, or resumed with Last-Event-ID): their owner is
   * watched, since the answers those streams wait for can only come from it.
   */
  awaitingSessions (): Set<string> {
    const sids = new Set<string>()
    for (const writer of this.#all()) if (!writer.ended && isRequestStreamId(writer.streamId)) sids.add(writer.sid)
    return sids
  }

  /**
   * The store is unreachable: every POST stream here answers its open requests with `answer`.
   * Returns them, so their markers can be taken once the store is back (no second answer then).
   */
  failAwaiting (answer: (id: RequestId) => JsonRpcResponse): Array<PendingRequest & { sid: string }> {
    const failed: Array<PendingRequest & { sid: string }> = []
    for (const writer of this.#all()) {
      if (!writer.awaitsAnswers) continue
      for (const id of writer.failUnanswered(answer)) failed.push({ sid: writer.sid, streamId: writer.streamId, id })
    }
    return failed
  }

  /**
   * The session ended: its streams here end too. A POST stream's requests still unanswered get
   * `err` first (every accepted request gets exactly one answer; none can come any more).
   */
  endSession (sid: string, err: GatewayError): void {
    const writers = this.#writers.get(sid)
    if (writers === undefined) return
    for (const writer of writers instanceof Map ? [...writers.values()] : [writers]) this.#endWithSession(writer, err)
  }

  #endWithSession (writer: ClientWriter, err: GatewayError, why = err.message): void {
    if (writer.awaitsAnswers) writer.failUnanswered(id => toJsonRpcError(err, id))
    this.#end(writer, 'session-ended', why)
  }

  /**
   * Shutdown: every stream ends with a retry hint so its client reconnects elsewhere. A POST stream
   * whose client holds no event id of it (a held stream without priming, an SSE stream that wrote
   * nothing yet) could not be resumed for its answers: they are an error now.
   */
  endAll (retryMs: number): void {
    let err: GatewayError | undefined
    for (const writer of this.#all()) {
      if (writer.awaitsAnswers && !writer.clientCanResume) {
        const shuttingDown = err ??= new GW_ERR_SHUTTING_DOWN()
        writer.failUnanswered(id => toJsonRpcError(shuttingDown, id))
      }
      this.#end(writer, 'shutdown', 'the replica is shutting down', retryMs)
    }
  }

  /**
   * Holder leases are renewed here, every third of a lease, in batches (SessionStore.keepStreams:
   * one round trip per batch with Redis) that give the event loop back as they go (upkeep.ts). An
   * open stream keeps its session alive: the tick runs at least every quarter idle timeout, and
   * the same call says whether the session still exists (a stream whose session is gone ends). A
   * lease that lapsed (the loop was blocked past it: a burst of child starts, a loaded machine)
   * and that no other replica took is taken again: only another holder ends a stream here.
   * Returns the sessions that still have a stream held here.
   */
  async renew (): Promise<Set<string>> {
    const { store, replicaId, log } = this.#o
    const held = new Set<string>()
    let reclaimed = 0
    const writers = this.#all().filter(writer => !writer.ended)
    await inBatches(writers, async batch => {
      // A stream not marked yet, or whose mark is on its way (openPost, `mark`), has no
      // holder lease to renew: no other replica can hold it (its client has no event id of it).
      const kept = await store.keepStreams(batch.map(writer => ({ sid: writer.sid, streamId: writer.streamId, leased: writer.markLater === undefined && writer.marking === undefined })), replicaId, this.#leaseMs, this.#idleMs)
      batch.forEach((writer, i) => {
        if (writer.ended) return
        switch (kept[i]) {
          case 'gone':
            this.#endWithSession(writer, new GW_ERR_SESSION_NOT_FOUND(), 'the session no longer exists')
            return
          case 'taken':
            // Another replica holds the stream now (it resumed it, or won a race for it): wakes go
            // there, so this writer would starve; end it and let the client reconnect.
            this.#end(writer, 'released', 'another replica holds the stream now', this.#o.config.http.retryMs)
            return
          case 'reclaimed':
            reclaimed++
        }
        held.add(writer.sid)
      })
    })
    if (reclaimed > 0) log.warn({ streams: reclaimed, leaseMs: this.#leaseMs }, 'holder leases had lapsed (the event loop was held past them) and nobody had taken them: claimed back')
    return held
  }

  /** Ends a stream from the gateway's side, saying why in the line #onWriterEnd logs. */
  #end (writer: ClientWriter, reason: WriterEndReason, why: string, retryMs?: number): void {
    if (writer.ended) return
    this.#why.set(writer, why)
    writer.end(reason, retryMs)
  }

  #get (sid: string, streamId: string): ClientWriter | undefined {
    const writers = this.#writers.get(sid)
    if (writers instanceof Map) return writers.get(streamId)
    return writers?.streamId === streamId ? writers : undefined
  }

  #set (writer: ClientWriter): void {
    const writers = this.#writers.get(writer.sid)
    if (writers === undefined || (!(writers instanceof Map) && writers.streamId === writer.streamId)) {
      this.#writers.set(writer.sid, writer)
    } else if (writers instanceof Map) {
      writers.set(writer.streamId, writer)
    } else {
      this.#writers.set(writer.sid, new Map([[writers.streamId, writers], [writer.streamId, writer]]))
    }
  }

  /** Forgets the writer if it is still the one registered for its stream. */
  #delete (writer: ClientWriter): void {
    const writers = this.#writers.get(writer.sid)
    if (writers === writer) {
      this.#writers.delete(writer.sid)
      return
    }
    if (!(writers instanceof Map) || writers.get(writer.streamId) !== writer) return
    writers.delete(writer.streamId)
    // A map, once made, stays while a stream is left: going back to one writer would make a new
    // map for every POST of a session whose GET stream is open.
    if (writers.size === 0) this.#writers.delete(writer.sid)
  }

  /** A snapshot of every writer (callers end some while iterating). */
  #all (): ClientWriter[] {
    const all: ClientWriter[] = []
    for (const writers of this.#writers.values()) {
      if (writers instanceof Map) for (const writer of writers.values()) all.push(writer)
      else all.push(writers)
    }
    return all
  }

  /**
   * Every stream that ends other than by its last answer is logged, with why: a client that
   * lost its stream (and its server-initiated messages) is explained by one line.
   */
  #logEnd (writer: ClientWriter, reason: WriterEndReason): void {
    if (reason === 'complete' && isRequestStreamId(writer.streamId)) return
    const why = this.#why.get(writer) ?? WHY[reason]
    this.#o.log.info({ sid: shortHash(writer.sid), stream: writer.streamId, reason, why }, 'client stream ended')
  }

  #onWriterEnd (writer: ClientWriter, reason: WriterEndReason): void {
    const { sid, streamId } = writer
    this.#delete(writer)
    // A POST stream the client dropped (or resumed on another replica) keeps its catch-all
    // deadline: the answer it writes reaches whoever holds the stream by then (append wakes it).
    if (reason === 'complete' || reason === 'session-ended' || reason === 'shutdown') clearTimeout(this.#deadlines.get(writer))
    this.#deadlines.delete(writer)
    if (tracing !== null) tracing.streamEnded(sid, streamId, reason)
    this.#logEnd(writer, reason)
    if (reason === 'released' || reason === 'session-ended') return
    const store = this.#o.store
    // Only a cursor the log gave: a client-sent Last-Event-ID never becomes the stored position.
    if (writer.cursor !== null && writer.advanced && (streamId === GET_STREAM || streamId === LEGACY_STREAM)) {
      store.setCursor(sid, streamId, writer.cursor, this.#idleMs).catch(() => {})
    }
    // Ended before it was ever marked (openPost, 'when-needed'; a quick call answered as one JSON
    // body on the local path): it has no keys, so there is nothing to drop or release.
    const keyless = writer.markLater !== undefined
    if (!keyless && reason === 'complete') {
      // A completed request stream gets no more entries: its holder lease just lapses, and its log
      // is kept only briefly for a client whose socket died right after the answer (not the whole
      // idle timeout: a busy session would hold every answer it ever sent). A one-request stream
      // completed by an answer from its log got that TTL with the answer (append). Answered as
      // one JSON body (lazy SSE, json mode), the client never had an event id to resume from:
      // the log and the holder lease go at once.
      if (!writer.resumable) {
        this.#o.eventLog.discard(sid, streamId, this.#o.replicaId, writer.answeredDirectly).catch(() => {})
      } else if (!writer.advanced || expectedResponsesOf(streamId) !== 1) this.#o.eventLog.expire(sid, streamId, COMPLETED_STREAM_TTL_MS).catch(() => {})
    } else if (!keyless) {
      store.releaseHolder(sid, streamId, this.#o.replicaId).catch(() => {})
    }
    // Discarded (no keys left) or shut down (the process goes): nothing to prune for.
    if (reason !== 'shutdown' && !keyless && (reason !== 'complete' || writer.resumable) && ++this.#lapsing % PRUNE_EVERY === 0) {
      this.#o.eventLog.prune(sid, PRUNE_SAMPLE).catch(err => this.#o.log.debug({ err }, 'stream prune failed'))
    }
    if (streamId === LEGACY_STREAM && reason !== 'shutdown') {
      // A legacy HTTP+SSE session lives as long as its stream (2024-11-05 has no resumption).
      this.#o.endSession(sid, 'legacy stream closed').catch(err => this.#o.log.warn({ err }, 'legacy session end failed'))
    }
  }
}
