// The client streams this replica holds (docs/design-notes.md, "Streams"): the table of their
// writers, how each one ends (and what its end leaves in the store), and the holder leases that
// say to the other replicas where a stream is written. Opening streams and appending to them is
// streams.ts; this is what it keeps once a stream is open.
import { GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN, toJsonRpcError, type GatewayError } from '../../core/errors.js'
import type { JsonRpcResponse, RequestId } from '../../core/jsonrpc.js'
import { GET_STREAM, LEGACY_STREAM, type PendingRequest } from '../../state/event-log.js'
import { shortHash } from '../../telemetry/logger.js'
import { streamKindOf, type StreamKind } from '../../telemetry/metrics.js'
import { tracing } from '../../telemetry/tracing.js'
import type { ReplicaContext } from './context.js'
import { expectedResponsesOf, isRequestStreamId } from './stream-ids.js'
import { inBatches } from './upkeep.js'
import type { ClientWriter, WriterEndReason } from './writer.js'

/** How long a completed request stream's log stays for a late resume. */
export const COMPLETED_STREAM_TTL_MS = 60_000

/**
 * Every PRUNE_EVERY streams that end leaving their keys to expire, the session of the last one
 * has PRUNE_SAMPLE of its listed streams checked for lapsed ones (EventLog.prune). Sampling twice
 * as many as were added keeps a session's list near twice the streams it has alive (those of the
 * last COMPLETED_STREAM_TTL_MS), however long it runs; a busy session ends more streams, so it is
 * pruned more often. Off the request path: one read and one script per PRUNE_EVERY streams.
 */
export const PRUNE_EVERY = 32
export const PRUNE_SAMPLE = 2 * PRUNE_EVERY

/** What a stream's end means when nobody here said more (the client closed it, a write failed). */
const WHY: Record<WriterEndReason, string> = {
  complete: 'every answer was written',
  'client-closed': 'the client closed the connection',
  released: 'another replica holds the stream now',
  shutdown: 'the replica is shutting down',
  'session-ended': 'the session ended',
  error: 'writing or resuming the stream failed'
}

export interface HeldStreamsOptions extends ReplicaContext {
  /** A legacy HTTP+SSE session lives as long as its one stream. */
  endSession: (sid: string, reason: string) => Promise<void>
}

export class HeldStreams {
  readonly #services: HeldStreamsOptions
  /**
   * Writers by session, then stream: a session's streams are found without a scan of all. A
   * session that has had one stream at a time here (an idle one holds only its GET stream) keeps
   * the writer itself, not a map of one (heap per idle session).
   */
  readonly #writers = new Map<string, ClientWriter | Map<string, ClientWriter>>()
  /** Every writer's end callback: one function, not a closure per stream. */
  readonly onEnd = (writer: ClientWriter, reason: WriterEndReason): void => { this.#onWriterEnd(writer, reason) }
  /** POST streams' catch-all deadlines (ClientStreams.openPost), cleared when their writer completes. */
  readonly #deadlines = new Map<ClientWriter, NodeJS.Timeout>()
  /** Why the gateway ended a stream, until #onWriterEnd logs it. */
  readonly #why = new WeakMap<ClientWriter, string>()
  /** Streams ended here that left keys to expire (PRUNE_EVERY). */
  #lapsing = 0

  constructor (services: HeldStreamsOptions) {
    this.#services = services
  }

  get #leaseMs (): number { return this.#services.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#services.config.sessions.idleTimeoutMs }

  /**
   * A POST stream's catch-all deadline: `passed` runs after `ms` unless the stream completes, its
   * session ends or the replica shuts down first (#onWriterEnd).
   */
  setDeadline (writer: ClientWriter, ms: number, passed: () => void): void {
    this.#deadlines.set(writer, setTimeout(() => {
      this.#deadlines.delete(writer)
      passed()
    }, ms).unref())
  }

  /**
   * A POST refused after its stream opened (ClientStreams.openPost, `mark`): its deadline goes, and
   * the stream carries the refusal, or ends with its session if it can no longer.
   */
  refuse (writer: ClientWriter, refusal: GatewayError): void {
    clearTimeout(this.#deadlines.get(writer))
    this.#deadlines.delete(writer)
    this.#why.set(writer, `requests refused: ${refusal.code}`)
    if (!writer.refuse(refusal)) this.#endWithSession(writer, refusal)
  }

  /** Whether this replica writes the stream now (it holds it and the writer is live). */
  writes (sid: string, streamId: string): boolean {
    const writer = this.get(sid, streamId)
    return writer !== undefined && !writer.ended
  }

  /** Another replica took the stream over: stop writing it. */
  release (sid: string, streamId: string): void {
    const writer = this.get(sid, streamId)
    if (writer !== undefined) this.end(writer, 'released', 'the client resumed the stream on another replica')
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
    this.end(writer, 'session-ended', why)
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
      this.end(writer, 'shutdown', 'the replica is shutting down', retryMs)
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
    const { store, replicaId, log } = this.#services
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
            this.end(writer, 'released', 'another replica holds the stream now', this.#services.config.http.retryMs)
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
  end (writer: ClientWriter, reason: WriterEndReason, why: string, retryMs?: number): void {
    if (writer.ended) return
    this.#why.set(writer, why)
    writer.end(reason, retryMs)
  }

  /** The writer of a stream held here, ended or not. */
  get (sid: string, streamId: string): ClientWriter | undefined {
    const writers = this.#writers.get(sid)
    if (writers instanceof Map) return writers.get(streamId)
    return writers?.streamId === streamId ? writers : undefined
  }

  /** Registers a new writer (it replaces one of the same stream). */
  add (writer: ClientWriter): void {
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
  forget (writer: ClientWriter): void {
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
    this.#services.log.info({ sid: shortHash(writer.sid), stream: writer.streamId, reason, why }, 'client stream ended')
  }

  #onWriterEnd (writer: ClientWriter, reason: WriterEndReason): void {
    const { sid, streamId } = writer
    this.forget(writer)
    // A POST stream the client dropped (or resumed on another replica) keeps its catch-all
    // deadline: the answer it writes reaches whoever holds the stream by then (append wakes it).
    if (reason === 'complete' || reason === 'session-ended' || reason === 'shutdown') clearTimeout(this.#deadlines.get(writer))
    this.#deadlines.delete(writer)
    if (tracing !== null) tracing.streamEnded(sid, streamId, reason)
    this.#logEnd(writer, reason)
    if (reason === 'released' || reason === 'session-ended') return
    const store = this.#services.store
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
        this.#services.eventLog.discard(sid, streamId, this.#services.replicaId, writer.answeredDirectly).catch(() => {})
      } else if (!writer.advanced || expectedResponsesOf(streamId) !== 1) this.#services.eventLog.expire(sid, streamId, COMPLETED_STREAM_TTL_MS).catch(() => {})
    } else if (!keyless) {
      store.releaseHolder(sid, streamId, this.#services.replicaId).catch(() => {})
    }
    // Discarded (no keys left) or shut down (the process goes): nothing to prune for.
    if (reason !== 'shutdown' && !keyless && (reason !== 'complete' || writer.resumable) && ++this.#lapsing % PRUNE_EVERY === 0) {
      this.#services.eventLog.prune(sid, PRUNE_SAMPLE).catch(err => this.#services.log.debug({ err }, 'stream prune failed'))
    }
    if (streamId === LEGACY_STREAM && reason !== 'shutdown') {
      // A legacy HTTP+SSE session lives as long as its stream (2024-11-05 has no resumption).
      this.#services.endSession(sid, 'legacy stream closed').catch(err => this.#services.log.warn({ err }, 'legacy session end failed'))
    }
  }
}
