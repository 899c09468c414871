// Client stream writers. Writers pull from the stream's event log after their cursor,
// so a lost or duplicate wake, a slow client and a resume with Last-Event-ID are one
// case. One exception: a stream's last answer, handed over on the replica that got it when nothing
// else is on its way (answerDirectly; docs/design-notes.md, the request path). Frames follow the
// SSE format; event ids are `<streamId>.<entryId>` (event-log.ts).
import { once } from 'node:events'
import { ANSWERED_DIRECTLY, compareEntryIds, formatEventId, type LogEntry } from '../state/event-log.js'
import { isResponse, type JsonRpcMessage, type JsonRpcResponse, type RequestId } from '../core/jsonrpc.js'
import { errorHeaders, isCancelledAnswer, toJsonRpcError, type GatewayError } from '../core/errors.js'
import { tracing } from '../telemetry/tracing.js'
import { streamKindOf } from '../telemetry/metrics.js'
import { startKeepAlive, stopKeepAlive, type KeepAliveSlot } from './keep-alive.js'
import type { ClientWriter, WriterEndReason, WriterOptions } from '../routing/replica/writer.js'

const PAGE = 100

/** A writer's headers once they were sent: nothing reads them again. */
const SENT_HEADERS: Record<string, string> = Object.freeze({}) as Record<string, string>

export type { WriterEndReason, WriterMode } from '../routing/replica/writer.js'
/** A StreamWriter's options (routing/replica/writer.ts). */
export type StreamWriterOptions = WriterOptions

export class StreamWriter implements ClientWriter {
  readonly sid: string
  readonly streamId: string
  readonly #options: StreamWriterOptions
  #cursor: string | null
  #remaining: number
  #pumping = false
  #again = false
  #ended = false
  #started = false
  #advanced = false
  /**
   * Ordinal (LogEntry.seq) of the last entry delivered, so a jump means entries were trimmed
   * unseen: 0 for a stream read from its start, 1 after a new stream's priming entry, null while
   * unknown (a resume: asked of the log in start()).
   */
  #lastSeq: number | null
  /** Built only when a write must wait for drain (rare): it stops that wait when the writer ends. */
  #closed: AbortController | undefined
  /** JSON mode: the answers so far (made on the first; SSE streams never need it). */
  #collected: JsonRpcResponse[] | undefined
  /** Request ids of a POST stream answered so far. */
  #answered: Set<RequestId> | undefined
  /** Where this stream waits for its keep-alives (http/keep-alive.ts), once the SSE stream is open. */
  #keepAlive: KeepAliveSlot | undefined
  /** Lazy SSE: whether the headers are still held, the answers held meanwhile, and the delay. */
  #holding = false
  #held: LogEntry[] | undefined
  #lazyTimer: NodeJS.Timeout | undefined
  /** The frame of the stream's last answer, written together with the end of the response. */
  #tail: string | undefined
  #preamble: string | undefined
  /** Requests answered as one JSON body by answerDirectly, never in the log: their markers go with it (EventLog.discard). */
  #direct: RequestId[] | undefined
  /**
   * Appends to this stream started on this replica and not yet done (ClientStreams.append): while
   * one is in flight, an answer must not overtake it (answerDirectly).
   */
  appending = 0
  /**
   * A POST stream whose requests left before the store had its say (ClientStreams.openPost,
   * `mark`): settles once the verdict on the session, or the stream's mark, was applied (primed,
   * or refused). Appends to the stream and wakes of it wait for it; the SSE stream opens only
   * after its mark.
   */
  marking: Promise<void> | undefined
  /** Such a stream not marked yet: marks it (once; `marking` then covers it). Cleared when called. */
  markLater: (() => void) | undefined
  /** The SSE stream was due to open (start, the lazy delay) while marking: it opens once primed. */
  #openWhenPrimed = false
  /** Whether the client was sent an event id of this stream (it can resume it elsewhere). */
  #idSent = false

  constructor (options: StreamWriterOptions) {
    this.#options = options
    this.sid = options.sid
    this.streamId = options.streamId
    this.#cursor = options.cursor
    this.#remaining = options.expectedResponses
    this.#lastSeq = options.cursor === null ? 0 : options.fresh === true ? 1 : null
    this.#preamble = options.preamble
    // A resumed stream: its client holds an event id of it (the one it resumed from).
    if (options.cursor !== null && options.fresh !== true) this.#idSent = true
  }

  /**
   * A new POST stream's start, known once its requests are marked pending (ClientStreams.openPost):
   * the priming entry's id and the preamble that writes it. Before start(), or after it while
   * nothing was written (a stream started before its mark: it opens now if it was due to).
   */
  primed (cursor: string | null, preamble: string | undefined): void {
    if (this.#started && (this.#keepAlive !== undefined || this.#advanced)) throw new Error('a stream writer is primed before it writes')
    this.#cursor = cursor
    this.#lastSeq = cursor === null ? 0 : 1
    this.#preamble = preamble
    if (this.#openWhenPrimed) {
      this.#openWhenPrimed = false
      this.#openSse()
    }
  }

  get cursor (): string | null { return this.#cursor }
  /** Whether this writer wrote an entry (its cursor is then one the log gave, not the client's). */
  get advanced (): boolean { return this.#advanced }
  get ended (): boolean { return this.#ended }
  /** Whether the client was sent an event id (the SSE stream opened): only then can it resume this stream. */
  get resumable (): boolean { return this.#keepAlive !== undefined }
  /**
   * Whether the client holds an event id of this stream, or will when a held stream opens (its
   * priming event): if not, a client whose stream ends now cannot resume it for its answers.
   */
  get clientCanResume (): boolean {
    return this.#idSent || (this.#keepAlive === undefined && this.#preamble?.startsWith('id:') === true)
  }

  /** Sends headers (SSE), starts keep-alives, and writes what the log already holds. */
  async start (): Promise<void> {
    if (this.#started) return
    this.#started = true
    const { res } = this.#options
    res.on('close', () => { if (!res.writableFinished) this.#finish('client-closed') })
    const lazyMs = this.#options.lazyMs ?? 0
    if (this.#options.mode === 'sse' && Number.isFinite(this.#remaining) && (lazyMs > 0 || this.marking !== undefined || this.markLater !== undefined)) {
      this.#holding = true
      if (lazyMs > 0) {
        this.#lazyTimer = setTimeout(() => { this.#openOnceMarked() }, lazyMs)
        this.#lazyTimer.unref()
      } else {
        this.#openOnceMarked()
      }
    } else if (this.#options.mode !== 'json') {
      this.#openSse()
    }
    if (this.#cursor === ANSWERED_DIRECTLY) {
      // Resumed after answers written outside the log: nothing is left for this stream.
      this.#finish('complete')
      return
    }
    if (this.#cursor !== null && Number.isFinite(this.#remaining) && this.#options.fresh !== true) {
      // A resumed POST stream: responses at or before the cursor were already delivered.
      try {
        this.#remaining -= await this.#countResponsesThrough(this.#cursor)
      } catch (err) {
        this.#options.log.error({ err, stream: this.streamId }, 'stream resume failed')
        this.#finish('error')
        return
      }
      if (this.#remaining <= 0) { this.#finish('complete'); return }
    }
    if (this.#options.metrics !== undefined && this.#lastSeq === null && this.#cursor !== null) {
      // Marked as pumping meanwhile, so a wake now is left to the wake() below (which a resumed,
      // non-fresh stream always runs) and never reads with the ordinal still unknown.
      this.#pumping = true
      try {
        this.#lastSeq = await this.#options.eventLog.seqOf(this.sid, this.streamId, this.#cursor).catch(() => null)
      } finally {
        this.#pumping = false
      }
    }
    if (this.#options.fresh === true && !this.#again) return
    await this.wake()
  }

  /** The SSE stream is due (the lazy delay ran out): open now, or once the stream's mark is in (its priming id). */
  #openOnceMarked (): void {
    if (this.markLater === undefined && this.marking === undefined) {
      this.#openSse()
      return
    }
    this.#openWhenPrimed = true
    this.markLater?.()
  }

  /**
   * Sends the SSE headers and the preamble, writes any answers held meanwhile, and starts
   * keep-alives. Lazy streams open here on their first non-answer, their delay, or their end
   * (an end while still marking opens without the priming event: its id is not known yet).
   */
  #openSse (): void {
    if (this.#ended || this.#keepAlive !== undefined) return
    const { res } = this.#options
    this.#holding = false
    clearTimeout(this.#lazyTimer)
    res.writeHead(200, {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache, no-transform',
      // No `connection` header: Node sets it, honouring a client's `Connection: close`.
      'x-accel-buffering': 'no',
      ...this.#options.headers
    })
    const held = this.#held
    this.#held = undefined
    const first = (this.#preamble ?? '') + (held === undefined ? '' : held.map(entry => this.#frame(entry)).join(''))
    if (this.#preamble?.startsWith('id:') === true) this.#idSent = true
    if (first !== '') res.write(first)
    else res.flushHeaders()
    // What only the opening needed goes now: an idle stream lives for hours (heap per idle session,
    // docs/performance.md). Node keeps the header block it sent as a tree of ~30 concatenated
    // strings (about 1 KB); reading one character makes V8 flatten it into one string.
    this.#preamble = undefined
    this.#options.headers = SENT_HEADERS
    const sent: unknown = (res as unknown as { _header?: unknown })._header
    if (typeof sent === 'string') sent.charCodeAt(0)
    this.#keepAlive = startKeepAlive(this.#options.keepAliveMs, this)
  }

  /** Called by the keep-alive timer (http/keep-alive.ts) about every keepAliveMs while open. */
  keepAlive (): void {
    if (this.#ended) return
    this.#options.res.write(': keepalive\n\n')
    // A POST stream still waiting for answers also reads its log: a wake lost on the bus (a
    // Redis failover drops what was in flight) delays an answer by one interval, never forever.
    if (Number.isFinite(this.#remaining) && this.#remaining > 0) void this.wake()
  }

  /** Something was appended to this stream's log: pull it. Safe to call any number of times. */
  async wake (): Promise<void> {
    if (this.#ended) return
    if (!this.#started || this.#pumping) { this.#again = true; return }
    this.#pumping = true
    try {
      let page: LogEntry[]
      do {
        this.#again = false
        page = await this.#options.eventLog.readAfter(this.sid, this.streamId, this.#cursor, PAGE)
        for (const entry of page) {
          if (this.#ended || await this.#deliver(entry)) return
        }
      } while (!this.#ended && (this.#again || page.length === PAGE))
    } catch (err) {
      this.#options.log.error({ err, stream: this.streamId }, 'stream writer failed')
      this.#finish('error')
    } finally {
      this.#pumping = false
    }
  }

  /**
   * The entry just appended to this stream, handed over by the appender on this replica. When it
   * is the one after the last this writer delivered (and nothing is being read), it is written
   * at once, without reading the log back; otherwise this is a wake.
   */
  async offer (entry: LogEntry): Promise<void> {
    if (this.#ended) return
    if (!this.#started || this.#pumping || this.#again || this.#lastSeq === null || entry.seq !== this.#lastSeq + 1) {
      await this.wake()
      return
    }
    this.#pumping = true
    try {
      if (await this.#deliver(entry)) return
    } catch (err) {
      this.#options.log.error({ err, stream: this.streamId }, 'stream writer failed')
      this.#finish('error')
      return
    } finally {
      this.#pumping = false
    }
    if (this.#again) await this.wake()
  }

  /** Writes one entry after the cursor; true when that completed the stream. */
  async #deliver (entry: LogEntry): Promise<boolean> {
    this.#countLost(entry.seq)
    const answer = entry.message !== null && isResponse(entry.message) ? entry.message : null
    if (answer !== null && isCancelledAnswer(answer)) {
      this.#cursor = entry.entryId
      this.#advanced = true
      return this.#settleCancelled(answer)
    }
    await this.#emit(entry, answer !== null && this.#remaining === 1)
    this.#cursor = entry.entryId
    this.#advanced = true
    if (answer === null) return false
    // Tracing on: the SERVER span of the request this answers ends here.
    if (tracing !== null) tracing.responded(this.sid, this.streamId, answer)
    if (--this.#remaining > 0) return false
    this.#complete()
    return true
  }

  /**
   * A request of this stream the client cancelled (errors.ts cancelledAnswer): counted as settled,
   * never written. When it was the last one the stream waited for, no answer will come:
   * - nothing sent yet (a held lazy stream, a JSON response): #complete answers with what came,
   *   202 and no body when nothing did (the client withdrew its request; there is no answer to send);
   * - an SSE stream whose client holds no event id of it: it ends (the client cannot resume it);
   * - an SSE stream whose client holds one stays open until the client closes it, as an SDK server
   *   leaves it: a client (the v1 SDK) reconnects to a stream that ends without an answer, and
   *   the stream it resumes would end the same way, once a second.
   * True when the stream ended.
   */
  #settleCancelled (answer: JsonRpcResponse): boolean {
    const id = answer.id
    if (this.#options.requestIds !== undefined && id !== null && id !== undefined) (this.#answered ??= new Set()).add(id)
    if (--this.#remaining > 0) return false
    if (this.#keepAlive !== undefined && this.#idSent) return false
    this.#complete()
    return true
  }

  /**
   * The answer that completes this POST stream (and its JSON), handed over by this replica's relay
   * before it reaches the log (docs/design-notes.md, The request path). Taken only when nothing
   * else is on its way to the stream (no append in flight here, no read of the log) and it is the
   * last answer the stream waits for:
   * - 'json': the stream is still held (lazy SSE) or is a JSON response, so the answers go out as
   *   one JSON body now. The client never had an event id, so the answer never needs the log: the
   *   caller does not append it, and the log goes with the request's marker when the writer ends
   *   (EventLog.discard).
   * - 'sse': the SSE stream is open; the answer is its last frame now, with the ANSWERED_DIRECTLY
   *   id (a client resuming from it gets nothing twice). The caller still appends it, so a client
   *   whose connection dropped before this frame finds it in the log when it resumes.
   * undefined, with nothing done, otherwise: the caller appends as usual.
   */
  answerDirectly (message: JsonRpcResponse, json: string): 'json' | 'sse' | undefined {
    const id = message.id
    if (!this.#started || this.#ended || this.#pumping || this.#again || this.appending > 0 || this.#remaining !== 1) return undefined
    const { mode } = this.#options
    const open = this.#keepAlive !== undefined && mode === 'sse'
    if (!this.#holding && !open && mode !== 'json') return undefined
    if (id === null || id === undefined || this.#answered?.has(id) === true || this.#options.requestIds?.includes(id) !== true) return undefined
    // A cancelled request on an open SSE stream: its copy in the log settles it (#deliver).
    const cancelled = isCancelledAnswer(message)
    if (cancelled && open) return undefined
    const answered = this.#answered ??= new Set()
    answered.add(id)
    if (tracing !== null && !cancelled) tracing.responded(this.sid, this.streamId, message)
    this.#remaining = 0
    if (open) {
      // Written with the end of the response, as #emit writes a last answer. The stream wrote an
      // entry (its append gives the log's copy the completed stream's TTL, see #onWriterEnd).
      this.#tail = `id: ${formatEventId(this.streamId, ANSWERED_DIRECTLY)}\ndata: ${json}\n\n`
      this.#advanced = true
      this.#finish('complete')
      return 'sse'
    }
    const direct = this.#direct ??= []
    direct.push(id)
    if (cancelled) {
      // Nothing to write for it (#settleCancelled): the answers before it, if any, go now.
    } else if (mode === 'json') {
      const collected = this.#collected ??= []
      collected.push(message)
    } else {
      const held = this.#held ??= []
      held.push({ entryId: ANSWERED_DIRECTLY, message, json, seq: 0 })
    }
    this.#complete()
    return 'json'
  }

  /** Requests answered as one JSON body by answerDirectly, whose markers the log still has. */
  get answeredDirectly (): RequestId[] { return this.#direct ?? [] }

  /** Ends the stream from the gateway's side; SSE clients get a `retry` hint to reconnect. */
  end (reason: WriterEndReason, retryMs?: number): void {
    if (this.#ended) return
    const { res } = this.#options
    // A held lazy stream ends as the SSE stream it would have been: priming id, then the hint.
    if (this.#holding && reason !== 'client-closed') this.#openSse()
    if (this.#options.mode !== 'json' && res.headersSent && !res.writableEnded && retryMs !== undefined) {
      res.write(`retry: ${retryMs}\n\n`)
    }
    if (this.#options.mode === 'json' && !res.headersSent && reason !== 'released') {
      // No answer will come on this JSON response: say why with the transport's status codes.
      const [status, code, message] = reason === 'session-ended' ? [404, -32001, 'Session not found'] : [503, -32000, 'The gateway is shutting down']
      res.writeHead(status, { 'content-type': 'application/json', ...(status === 503 ? { 'retry-after': '1' } : {}), ...this.#options.headers })
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message, data: { source: 'gateway' } } }))
    }
    this.#finish(reason)
  }

  /**
   * The stream's requests are refused after all (ClientStreams.openPost: marking them failed):
   * while nothing was sent, the response is the HTTP error the request would have got before its
   * stream started (status and JSON-RPC error, as the error handler writes them). Ends the writer
   * ('session-ended' for a 404, else 'error'); false when it had sent something already (then the
   * caller answers otherwise).
   */
  refuse (err: GatewayError): boolean {
    const { res } = this.#options
    if (this.#ended || res.headersSent) return false
    const status = err.statusCode ?? 500
    this.#options.metrics?.httpRefusal(status, err.code)
    this.#holding = false
    clearTimeout(this.#lazyTimer)
    const requestIds = this.#options.requestIds ?? []
    const id = this.#options.batch === true || requestIds.length !== 1 ? null : requestIds[0] ?? null
    res.writeHead(status, { 'content-type': 'application/json', ...errorHeaders(err), ...this.#options.headers })
    res.end(JSON.stringify(toJsonRpcError(err, id)))
    this.#finish(status === 404 ? 'session-ended' : 'error')
    return true
  }

  #countLost (seq: number): void {
    const metrics = this.#options.metrics
    const last = this.#lastSeq
    this.#lastSeq = seq
    if (metrics === undefined) return
    // A resume from an entry the log no longer has: some messages were lost, how many is unknown.
    if (last === null) { if (seq > 1) metrics.resumeCursorMissing(streamKindOf(this.streamId)); return }
    if (seq > last + 1) metrics.eventLogLost(streamKindOf(this.streamId), seq - last - 1)
  }

  /** Whether this is a POST stream with requests still unanswered. */
  get awaitsAnswers (): boolean {
    return !this.#ended && (this.#options.requestIds ?? []).some(id => this.#answered?.has(id) !== true)
  }

  /**
   * The log cannot be reached (Redis is away): every request of this POST stream not yet answered
   * gets `answer(id)` written directly (not in the log: its event id is ANSWERED_DIRECTLY, so a
   * client resuming from it gets nothing twice), and the stream ends.
   * Never silence, even when the store is gone.
   */
  failUnanswered (answer: (id: RequestId) => JsonRpcResponse): RequestId[] {
    if (this.#ended || !this.#started) return []
    if (this.#holding) this.#openSse()
    const { res, mode } = this.#options
    const failed: RequestId[] = []
    const answered = this.#answered ??= new Set()
    for (const id of this.#options.requestIds ?? []) {
      if (answered.has(id)) continue
      answered.add(id)
      failed.push(id)
      const message = answer(id)
      if (mode === 'json') (this.#collected ??= []).push(message)
      else res.write(`id: ${formatEventId(this.streamId, ANSWERED_DIRECTLY)}\ndata: ${JSON.stringify(message)}\n\n`)
    }
    this.#complete()
    return failed
  }

  async #emit (entry: LogEntry, last: boolean): Promise<void> {
    const { mode, res } = this.#options
    // Only a POST stream's answers are counted (awaitsAnswers, failUnanswered): a GET stream keeps no set.
    if (this.#options.requestIds !== undefined && entry.message !== null && isResponse(entry.message) && entry.message.id !== null && entry.message.id !== undefined) (this.#answered ??= new Set()).add(entry.message.id)
    if (mode === 'json') {
      if (entry.message !== null && isResponse(entry.message)) (this.#collected ??= []).push(entry.message)
      return
    }
    if (this.#holding) {
      if (entry.message !== null && isResponse(entry.message)) {
        (this.#held ??= []).push(entry)
        return
      }
      this.#openSse()
    }
    if (last) {
      // The stream's last answer: written with the end of the response, in one write.
      this.#tail = this.#frame(entry)
      return
    }
    const frame = this.#frame(entry)
    if (!res.write(frame)) {
      this.#closed ??= new AbortController()
      await once(res, 'drain', { signal: this.#closed.signal }).catch(() => {})
    }
  }

  #frame (entry: LogEntry): string {
    this.#idSent = true
    const id = `id: ${formatEventId(this.streamId, entry.entryId)}\n`
    if (entry.message === null) {
      // Priming event: an id and empty data, with the reconnect hint (H-POST-7).
      const retry = this.#options.retryMs === undefined ? '' : `retry: ${this.#options.retryMs}\n`
      return `${id}${retry}data: \n\n`
    }
    const data = `data: ${entry.json}\n\n`
    return this.#options.mode === 'legacy' ? `event: message\n${id}${data}` : `${id}${data}`
  }

  #complete (): void {
    const { res, mode } = this.#options
    if ((mode === 'json' && !res.headersSent && this.#collected === undefined) || (this.#holding && this.#held === undefined)) {
      // Every request was cancelled by its client before anything was sent (#settleCancelled).
      this.#holding = false
      clearTimeout(this.#lazyTimer)
      res.writeHead(202, this.#options.headers)
      res.end()
    } else if (mode === 'json' && !res.headersSent) {
      const collected = this.#collected ?? []
      const body = this.#options.batch === true ? collected : collected[0]
      res.writeHead(200, { 'content-type': 'application/json', ...this.#options.headers })
      res.end(JSON.stringify(body))
    } else if (this.#holding) {
      // Every answer came before anything else: one JSON body, as the transport allows (H-POST-2).
      const held = this.#held ?? []
      const body = this.#options.batch === true ? `[${held.map(entry => entry.json).join(',')}]` : held[0]?.json ?? 'null'
      this.#holding = false
      res.writeHead(200, { 'content-type': 'application/json', ...this.#options.headers })
      res.end(body)
    }
    this.#finish('complete')
  }

  #finish (reason: WriterEndReason): void {
    if (this.#ended) return
    // A held lazy stream that ends without its answers ends as the SSE stream it would have been.
    if (this.#holding && reason !== 'client-closed') this.#openSse()
    this.#ended = true
    if (this.#keepAlive !== undefined) stopKeepAlive(this.#options.keepAliveMs, this, this.#keepAlive)
    clearTimeout(this.#lazyTimer)
    this.#closed?.abort()
    const { res } = this.#options
    // The last answer's frame goes with the end of the chunked body: one write, not two.
    if (!res.writableEnded) {
      if (this.#tail !== undefined) res.end(this.#tail)
      else res.end()
    }
    this.#options.onEnd(this, reason)
  }

  async #countResponsesThrough (cursor: string): Promise<number> {
    let count = 0
    let from: string | null = null
    for (;;) {
      const page: LogEntry[] = await this.#options.eventLog.readAfter(this.sid, this.streamId, from, PAGE)
      for (const entry of page) {
        if (compareEntryIds(entry.entryId, cursor) > 0) return count
        if (entry.message !== null && isResponse(entry.message as JsonRpcMessage)) count++
      }
      if (page.length < PAGE) return count
      from = page[page.length - 1]?.entryId ?? null
    }
  }
}
