// Streamable HTTP backends (docs/spec-rules.md §5; the gateway is the client here): POST per message, JSON or
// SSE replies resumed with Last-Event-ID, the backend's standalone GET stream (only the replica
// holding the session's lease listens), and re-initialisation when the backend answers 404.
import { randomUUID } from 'node:crypto'
import type { IncomingHttpHeaders } from 'node:http'
import type { Dispatcher } from 'undici'
import type { EventSourceMessage } from 'eventsource-parser'
import type { HttpServerConfig } from '../config/schema.js'
import { classify, isNotification, isRequest, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../core/jsonrpc.js'
import { DELETE_TIMEOUT_MS, HttpBackend, type HttpBackendOpenOptions, type Pending, type SseCursor } from './http-base.js'
import type { Credential } from '../credentials/types.js'
import { describe, drain, errorDetail, headerValue, mediaType, MAX_BODY_BYTES, pumpSse, readText, SseExchange, type Body, type SseHandler } from './http-io.js'

export class StreamableHttpBackend extends HttpBackend implements SseHandler {
  #sessionId: string | null
  #protocolVersion: string | undefined
  /** While set, other POSTs wait: an initialize is getting the session id, or a re-init runs. */
  #gate: Promise<void> | null = null
  #reinit: Promise<boolean> | null = null
  #listen: boolean
  #get: GetLoop | null = null
  #getCursor: SseCursor = {}
  /** The backend answered 405 to GET: it offers no stream, so listening again is pointless. */
  #noGetStream = false

  constructor (options: HttpBackendOpenOptions, config: HttpServerConfig) {
    super(options, config)
    this.#sessionId = options.backendSessionId ?? null
    this.#protocolVersion = options.protocolVersion
    this.#listen = options.listen ?? true
    if (options.getStreamLastEventId != null) this.#getCursor.lastId = options.getStreamLastEventId
    if (this.#sessionId !== null) {
      // Failover: the session was initialised by another replica (H-SES-6: no initialize).
      this.initialized = true
      if (this.#listen) this.#openGet()
    }
  }

  get listening (): boolean {
    return this.#listen
  }

  get backendSessionId (): string | null {
    return this.#sessionId
  }

  startListening (fromEventId?: string | null): void {
    if (this.#noGetStream) return
    // A replica taking the lease over resumes where the previous holder's stream got to.
    if (fromEventId != null && this.#get === null) this.#getCursor.lastId = fromEventId
    this.#listen = true
    if (this.initialized && this.isOpen) this.#openGet()
  }

  stopListening (): void {
    this.#listen = false
    this.#get?.stop()
    this.#get = null
  }

  async send (message: JsonRpcMessage): Promise<void> {
    this.assertOpen()
    if (isRequest(message)) {
      this.rememberInitialize(message)
      const p = this.track(message)
      // Errors reach the router as the request's JSON-RPC error, never as a rejection.
      this.#runRequest(message, p, false).catch((err: unknown) => {
        this.fail(p, this.unavailable(describe(err), err))
      }).finally(() => { this.exchangeEnded(p) })
      return
    }
    if (isNotification(message) && message.method === 'notifications/cancelled') this.forgetCancelled(message)
    await this.postNotification(message)
    if (isNotification(message) && message.method === 'notifications/initialized') {
      this.initialized = true
      if (this.#listen) this.#openGet()
    }
  }

  protected override onInitializeResult (result: unknown): void {
    const version = (result as { protocolVersion?: unknown } | null)?.protocolVersion
    if (typeof version === 'string') {
      this.#protocolVersion = version
      // Replicas that resume this backend session must send the backend's version (H-PV-1).
      this.handlers.onBackendProtocolVersion?.(version)
    }
  }

  // -- POST ------------------------------------------------------------------------------------

  async #waitGate (): Promise<void> {
    while (this.#gate !== null) await this.#gate
  }

  /** POSTs one message with the protocol headers; returns the reply and the session id it carried. */
  async #post (message: JsonRpcMessage, signal: AbortSignal, timeout: number, bypassGate: boolean): Promise<{ res: Dispatcher.ResponseData, sid: string | null }> {
    if (!bypassGate) await this.#waitGate()
    const isInit = isRequest(message) && message.method === 'initialize'
    const sid = isInit ? null : this.#sessionId
    const headers = this.baseHeaders()
    headers.accept = 'application/json, text/event-stream' // H-POST-1
    headers['content-type'] = 'application/json'
    if (sid !== null) headers['mcp-session-id'] = sid
    if (!isInit && this.#protocolVersion !== undefined) headers['mcp-protocol-version'] = this.#protocolVersion // H-PV-1
    // timeout 0: a request, whose deadline is its own timer (#onTimeout), so undici never races it.
    const res = await this.request(this.requests, 'POST', this.url, headers, signal, { body: JSON.stringify(message), headersTimeout: timeout, bodyTimeout: timeout })
    // The session id comes with the InitializeResult (H-SES-1); a late reply from an old
    // session must not overwrite the current one.
    const returned = headerValue(res.headers, 'mcp-session-id')
    if (returned !== undefined && returned !== '' && (isInit || this.#sessionId === null) && returned !== this.#sessionId) {
      this.#sessionId = returned
      this.#reportSessionId(returned)
    }
    return { res, sid }
  }

  #reportSessionId (sid: string | null): void {
    try {
      this.handlers.onBackendSessionId?.(sid)
    } catch (err) {
      this.log.error({ err }, 'onBackendSessionId handler threw')
    }
  }

  async #runRequest (request: JsonRpcRequest, p: Pending, retried: boolean, bypassGate = false): Promise<void> {
    const signal = p.abort.signal
    let open: (() => void) | undefined
    if (request.method === 'initialize' && !bypassGate) {
      // Until this initialize's reply brings the session id, other messages would go without it.
      // Taken synchronously when free, so a message sent right after send() already waits.
      while (this.#gate !== null) await this.#gate
      this.#gate = new Promise<void>(resolve => { open = resolve })
    }
    let exchange: { res: Dispatcher.ResponseData, sid: string | null }
    try {
      exchange = await this.#post(request, signal, 0, bypassGate || open !== undefined)
    } catch (err) {
      if (this.isPending(p)) this.fail(p, this.unavailable(describe(err), err))
      return
    } finally {
      if (open !== undefined) {
        this.#gate = null
        open()
      }
    }
    const { res, sid } = exchange
    if (!this.isPending(p)) {
      res.body.destroy()
      return
    }
    if (res.statusCode === 404 && sid !== null && !retried) {
      // H-SES-3: the backend ended its session; start over, then retry this request once.
      await drain(res.body)
      if (await this.#reinitialise(sid)) {
        await this.#runRequest(request, p, true, bypassGate)
      } else {
        this.fail(p, this.unavailable('the backend session expired and could not be re-initialised'), { status: 404 })
        this.#giveUpWithoutParams()
      }
      return
    }
    try {
      await this.#consumeReply(res, p)
    } catch (err) {
      if (this.isPending(p)) this.fail(p, this.unavailable(describe(err), err), { status: res.statusCode })
    }
  }

  /** Reads a POST reply to request p: JSON (one message or an array), SSE, 202, or an error. */
  async #consumeReply (res: Dispatcher.ResponseData, p: Pending): Promise<void> {
    const status = res.statusCode
    if (status === 202) {
      // Accepted without a body: the answer can only come on the GET stream; the deadline bounds it.
      await drain(res.body)
      return
    }
    if (status < 200 || status >= 300) {
      const detail = await errorDetail(res.body)
      this.fail(p, this.unavailable(`the backend answered HTTP ${status}`), { status, ...detail })
      return
    }
    const type = mediaType(res.headers)
    if (type === 'text/event-stream') {
      await this.#readPostStream(res.body, p)
      return
    }
    if (type === 'application/json') {
      const text = await readText(res.body, MAX_BODY_BYTES)
      let value: unknown
      try {
        value = JSON.parse(text)
      } catch {
        this.fail(p, this.unavailable('the backend sent a body that is not JSON'), { status })
        return
      }
      const list = Array.isArray(value) ? value as unknown[] : [value]
      if (list.length === 0 || list.some(v => classify(v).kind === 'invalid')) {
        this.fail(p, this.unavailable('the backend sent a body that is not JSON-RPC'), { status })
        return
      }
      for (const v of list) this.deliver(v)
      if (this.isPending(p)) this.fail(p, this.unavailable('the backend reply did not carry the response'), { status })
      return
    }
    await drain(res.body)
    this.fail(p, this.unavailable(`the backend sent an unexpected Content-Type '${type}'`), { status })
  }

  /**
   * Reads the SSE stream a POST opened. If it drops before the response and an event id was
   * seen, resumes with GET + Last-Event-ID, honouring the server's retry (H-BC-3, H-RES-2).
   */
  async #readPostStream (body: Body, p: Pending): Promise<void> {
    const cursor: SseCursor = {}
    let lastError: unknown = null
    try {
      await this.#pump(body, cursor, p)
    } catch (err) {
      lastError = err
    }
    let attempt = 0
    while (this.isPending(p)) {
      if (cursor.lastId === undefined) {
        const reason = lastError === null ? 'the response stream ended before the response' : `the response stream failed: ${describe(lastError)}`
        this.fail(p, this.unavailable(reason, lastError ?? undefined))
        return
      }
      if (attempt >= this.config.reconnect.maxAttempts) {
        this.fail(p, this.unavailable('the response stream was lost and could not be resumed'))
        return
      }
      if (!await this.waitBeforeRetry(attempt++, cursor.retryMs, p.abort.signal)) return
      if (!this.isPending(p)) return
      try {
        const res = await this.#openStream(cursor.lastId, p.abort.signal)
        if (res.statusCode !== 200 || mediaType(res.headers) !== 'text/event-stream') {
          await drain(res.body)
          this.fail(p, this.unavailable(`resuming the response stream answered HTTP ${res.statusCode}`), { status: res.statusCode })
          return
        }
        lastError = null
        await this.#pump(res.body, cursor, p)
      } catch (err) {
        lastError = err
      }
    }
  }

  /** Feeds one SSE body; garbage data fails the request the stream carries. */
  async #pump (body: Body, cursor: SseCursor, p: Pending): Promise<void> {
    await pumpSse(body, event => { this.#onEvent(cursor, event, p) }, ms => { cursor.retryMs = ms })
  }

  /**
   * What one SSE event does: moves the cursor, then delivers a `message` event's data. A POST's
   * stream (p) fails its request on garbage; the GET stream (p null) reports its event ids instead
   * (reportId) while it belongs to the current backend session.
   */
  #onEvent (cursor: SseCursor, event: EventSourceMessage, p: Pending | null, reportId = false): void {
    if (event.id !== undefined) {
      cursor.lastId = event.id
      if (reportId) this.handlers.onGetStreamEventId?.(event.id)
    }
    if (event.event !== undefined && event.event !== 'message') return
    if (!this.deliverData(event.data) && p !== null) {
      this.fail(p, this.unavailable('the backend sent an event that is not JSON-RPC'), { status: 200 })
    }
  }

  /** Headers of a GET on the endpoint (standalone stream, or a resumption when lastEventId is given). */
  #streamHeaders (lastEventId: string | undefined): Record<string, string> {
    const headers = this.baseHeaders()
    headers.accept = 'text/event-stream' // H-GET-1
    if (this.#sessionId !== null) headers['mcp-session-id'] = this.#sessionId
    if (this.#protocolVersion !== undefined) headers['mcp-protocol-version'] = this.#protocolVersion
    if (lastEventId !== undefined) headers['last-event-id'] = lastEventId
    return headers
  }

  /** GET on the endpoint to resume a POST's response stream. */
  async #openStream (lastEventId: string | undefined, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
    return await this.request(this.streams, 'GET', this.url, this.#streamHeaders(lastEventId), signal)
  }

  /** POSTs a notification or response; 2xx expected; 404 on a session re-initialises once. */
  protected async postNotification (message: JsonRpcMessage, retried = false, bypassGate = false): Promise<void> {
    // Aborted with the connection; held only while the POST runs (an idle session holds none).
    const abort = this.startExchange()
    try {
      await this.#postNotification(message, abort.signal, retried, bypassGate)
    } finally {
      this.endExchange(abort)
    }
  }

  async #postNotification (message: JsonRpcMessage, signal: AbortSignal, retried: boolean, bypassGate: boolean): Promise<void> {
    let exchange: { res: Dispatcher.ResponseData, sid: string | null }
    try {
      // A notification has no deadline of its own: bound the whole exchange by the request timeout.
      exchange = await this.#post(message, signal, this.config.requestTimeoutMs, bypassGate)
    } catch (err) {
      throw this.unavailable(describe(err), err)
    }
    const { res, sid } = exchange
    const status = res.statusCode
    if (status >= 200 && status < 300) {
      // 202 is the rule (H-POST-3); a body, if any, carries nothing we need.
      await drain(res.body)
      return
    }
    if (status === 404 && sid !== null && !retried) {
      await drain(res.body)
      if (await this.#reinitialise(sid)) return await this.#postNotification(message, signal, true, bypassGate)
      this.#giveUpWithoutParams()
      throw this.unavailable('the backend session expired and could not be re-initialised')
    }
    await drain(res.body)
    throw this.unavailable(`the backend answered HTTP ${status}`)
  }

  // -- re-initialise (H-SES-3) ------------------------------------------------------------------

  /**
   * The backend answered 404 for session `expired`: initialise a new backend session with the
   * client's remembered initialize params, as the gateway (id 'gw-init-…', never delivered).
   * Concurrent callers share one attempt. Resolves true when a new session is ready.
   */
  async #reinitialise (expired: string): Promise<boolean> {
    if (this.#reinit !== null) return await this.#reinit
    if (this.#sessionId !== null && this.#sessionId !== expired) return true // someone already did
    if (this.initParams === undefined || this.closed) return false
    let open!: () => void
    this.#gate = new Promise<void>(resolve => { open = resolve })
    this.#reinit = this.#doReinitialise(expired)
    try {
      return await this.#reinit
    } finally {
      this.#reinit = null
      this.#gate = null
      open()
    }
  }

  /** Without the client's initialize params no new session can ever be made: the session is over. */
  #giveUpWithoutParams (): void {
    if (this.initParams === undefined) this.unrecoverable('the backend session expired and there are no initialize params to start a new one')
  }

  async #doReinitialise (expired: string): Promise<boolean> {
    this.log.info('backend session expired; re-initialising')
    this.#sessionId = null
    // Event ids of the old session mean nothing to the new one.
    this.#getCursor = {}
    const request: JsonRpcRequest = { jsonrpc: '2.0', id: `gw-init-${randomUUID()}`, method: 'initialize', params: this.initParams }
    try {
      const reply = await new Promise<JsonRpcResponse>((resolve, reject) => {
        const p = this.track(request, { resolve, reject })
        this.#runRequest(request, p, true, true).catch(reject).finally(() => { this.exchangeEnded(p) })
      })
      if ('error' in reply) throw this.unavailable(`re-initialise failed: ${reply.error.message}`)
      await this.postNotification({ jsonrpc: '2.0', method: 'notifications/initialized' }, true, true)
    } catch (err) {
      this.log.warn({ err }, 'backend re-initialise failed')
      // Keep answering with the dead id: its next 404 triggers the next attempt, where no id
      // at all would only earn 400s.
      if (this.#sessionId === null) this.#sessionId = expired
      return false
    }
    this.log.info('backend session re-initialised')
    if (this.#listen && this.isOpen) this.#openGet()
    return true
  }

  // -- the standalone GET stream (H-GET-*) -------------------------------------------------------
  // A state machine driven by callbacks (open -> read -> wait -> open ...), not an async loop, and
  // each GET an SseExchange (http-io.ts) with this backend as its SseHandler: an idle session's
  // stream then holds its run, the exchange and undici's connection state, no body stream, signal,
  // promise or parked frame (heap per idle session: docs/performance.md).

  #openGet (): void {
    if (this.closed) return
    const current = this.#get
    if (current !== null) {
      // A run on the current backend session, or one waiting for the re-initialise it asked for
      // (#getSessionGone), whose next GET goes to the new session, goes on. One that still reads,
      // or waits to reopen, the stream of a session since replaced (a POST's 404 re-initialised it)
      // would listen to a dead session for as long as the backend keeps that stream: start over.
      if (current.sid === this.#sessionId || current.awaitingReinit) return
      this.log.debug('backend session replaced; the GET stream moves to the new one')
      this.#endGet(current)
    }
    const loop = new GetLoop(this.#getCursor)
    this.#get = loop
    this.#connectGet(loop)
  }

  /** One GET; what follows depends on the answer and how it ends (onSseEnd). */
  #connectGet (loop: GetLoop): void {
    if (loop.stopped) {
      this.#endGet(loop)
      return
    }
    // A re-initialise meanwhile starts a new cursor for the next GET; this one reads into its own.
    loop.sid = this.#sessionId
    loop.cursor = this.#getCursor
    // Made current before it starts: what the exchange reports is matched to the run by it (#runOf).
    const exchange = new SseExchange(this)
    loop.exchange = exchange
    const headers = this.#streamHeaders(loop.cursor.lastId)
    const start = (): void => {
      exchange.start(this.streams, {
        method: 'GET',
        path: this.url.pathname + this.url.search,
        headers,
        headersTimeout: this.config.requestTimeoutMs,
        // An SSE body may stay idle for long.
        bodyTimeout: 0
      })
    }
    // With a caller's credential the GET waits for it; one that cannot be had (no client token
    // on this replica and none cached) fails this GET, which is retried with backoff like any.
    if (!this.hasCredential) { start(); return }
    this.setCredential(headers).then(used => {
      loop.credential = used
      if (loop.exchange === exchange) start()
    }, (err: unknown) => { this.onSseEnd(exchange, err instanceof Error ? err : new Error(String(err))) })
  }

  /** The run whose current GET this is; null for a GET nobody waits for any more. */
  #runOf (exchange: SseExchange): GetLoop | null {
    const loop = this.#get
    return loop !== null && loop.exchange === exchange ? loop : null
  }

  /** SseHandler of the GET stream: an event stream is read; any other answer is drained, then decided in onSseEnd. */
  onSseResponse (exchange: SseExchange, status: number, headers: IncomingHttpHeaders): boolean {
    const loop = this.#runOf(exchange)
    if (loop === null || status !== 200 || mediaType(headers) !== 'text/event-stream') return false
    loop.attempt = 0
    loop.justReinitialised = false
    return true
  }

  /** SseHandler of the GET stream. A throw ends the stream, which then reconnects. */
  onSseEvent (exchange: SseExchange, event: EventSourceMessage): void {
    const loop = this.#runOf(exchange)
    // Until #openGet moves the run to a re-initialised session, the old session's stream reads on:
    // its event ids mean nothing to the new session (a replica taking the lease over would resume
    // it with one), so they are not reported.
    if (loop !== null) this.#onEvent(loop.cursor, event, null, loop.sid === this.#sessionId)
  }

  /** SseHandler of the GET stream. */
  onSseRetry (exchange: SseExchange, ms: number): void {
    const loop = this.#runOf(exchange)
    if (loop !== null) loop.cursor.retryMs = ms
  }

  /** SseHandler of the GET stream: the GET is over; reconnect, stop, or re-initialise by its answer. */
  onSseEnd (exchange: SseExchange, err: Error | null): void {
    const loop = this.#runOf(exchange)
    if (loop === null) return
    loop.exchange = null
    try {
      if (exchange.status === 0) this.#getFailed(loop, err)
      else if (exchange.streaming) {
        if (err === null) this.#retryGet(loop, 'the GET stream ended')
        else this.#getFailed(loop, err)
      } else this.#onRefused(loop, exchange.status)
    } catch (err) {
      this.#getLoopFailed(loop, err)
    }
  }

  /** The GET was answered with something else than an event stream (its body drained, as ever). */
  #onRefused (loop: GetLoop, status: number): void {
    if (status === 405) {
      this.log.debug('backend offers no GET stream')
      this.#noGetStream = true
      this.#endGet(loop)
    } else if (status === 409) {
      // H-GET-3: the session already has a GET stream. After a failover that is usually the
      // dead holder's stream, which the backend drops once it notices the closed socket:
      // retry with backoff; if it never frees, stop listening without ending the session.
      this.#retryGet(loop, 'another GET stream is open for the backend session', true)
    } else if (status === 404 && loop.sid !== null) {
      this.#getSessionGone(loop, loop.sid)
    } else {
      // The next GET gets a fresh credential.
      if (status === 401) this.credentialRefused(loop.credential)
      this.#retryGet(loop, `the GET stream answered HTTP ${status}`)
    }
  }

  /** The backend forgot the session: re-initialise, then one immediate GET on the new session. */
  #getSessionGone (loop: GetLoop, sid: string): void {
    const reason = 'the backend session expired and could not be re-initialised'
    // A new session deserves one immediate GET; a 404 right after it counts as a failure.
    if (loop.justReinitialised) {
      this.#retryGet(loop, reason)
      return
    }
    this.#reinitialise(sid).then(ok => {
      if (!ok) {
        this.#retryGet(loop, reason)
        return
      }
      loop.justReinitialised = true
      this.#connectGet(loop)
    }, (err: unknown) => { this.#getFailed(loop, err) }).catch((err: unknown) => { this.#getLoopFailed(loop, err) })
  }

  #getFailed (loop: GetLoop, err: unknown): void {
    this.#retryGet(loop, `the GET stream failed: ${describe(err)}`)
  }

  /** The stream is lost (or was refused): wait and open again, or give up once attempts run out. */
  #retryGet (loop: GetLoop, reason: string, conflict = false): void {
    if (loop.stopped) {
      this.#endGet(loop)
      return
    }
    if (loop.attempt >= this.config.reconnect.maxAttempts) {
      if (conflict) this.log.warn('backend GET stream stays taken; not listening')
      else this.unrecoverable(`${reason}; reconnect attempts exhausted`)
      this.#endGet(loop)
      return
    }
    this.log.debug({ reason, attempt: loop.attempt }, 'backend GET stream reconnecting')
    // Unref'd: a reconnect wait alone does not keep the process up. stop() clears it.
    loop.timer = setTimeout(() => {
      loop.timer = undefined
      try {
        this.#connectGet(loop)
      } catch (err) {
        this.#getLoopFailed(loop, err)
      }
    }, this.retryDelay(loop.attempt++, loop.cursor.retryMs)).unref()
  }

  /** A bug in the loop itself, not a network failure: say so and stop listening. */
  #getLoopFailed (loop: GetLoop, err: unknown): void {
    this.log.error({ err }, 'backend GET stream loop failed')
    this.#endGet(loop)
  }

  #endGet (loop: GetLoop): void {
    loop.stop()
    if (this.#get === loop) this.#get = null
  }

  protected override stopStreams (): void {
    const loop = this.#get
    if (loop !== null) this.#endGet(loop)
  }

  // -- shutdown ----------------------------------------------------------------------------------

  protected async shutdown (deleteSession: boolean): Promise<void> {
    const sid = this.#sessionId
    if (!deleteSession || sid === null) return
    // H-SES-4: end the backend session; 405 means the server does not allow it, which is fine.
    const headers = this.baseHeaders()
    headers['mcp-session-id'] = sid
    if (this.#protocolVersion !== undefined) headers['mcp-protocol-version'] = this.#protocolVersion
    const timeout = Math.min(this.config.requestTimeoutMs, DELETE_TIMEOUT_MS)
    try {
      const res = await this.request(this.requests, 'DELETE', this.url, headers, AbortSignal.timeout(timeout), { headersTimeout: timeout, bodyTimeout: timeout })
      await drain(res.body)
      if (res.statusCode >= 400 && res.statusCode !== 405 && res.statusCode !== 404) {
        this.log.debug({ status: res.statusCode }, 'backend refused DELETE')
      }
    } catch (err) {
      this.log.debug({ err }, 'backend DELETE failed')
    }
  }
}

/**
 * One run of the standalone GET stream, from #openGet until it stops (stopListening, close, or a
 * decision of the loop): its reconnect count and the GET or the wait in progress, which stop() ends.
 * Plain state: the backend drives it, and a GET's callbacks name their exchange (#runOf).
 */
class GetLoop {
  /** Reconnect attempts since the stream was last open. */
  attempt = 0
  /** The last GET found the session gone and a new one was made: another 404 is a failure. */
  justReinitialised = false
  stopped = false
  /** The GET in progress, and the session id and cursor it was opened with. */
  exchange: SseExchange | null = null
  sid: string | null = null
  cursor: SseCursor
  /** The caller's credential the GET in progress carries (null: none). */
  credential: Credential | null = null
  /** The wait before the next GET. */
  timer: NodeJS.Timeout | undefined = undefined

  constructor (cursor: SseCursor) {
    this.cursor = cursor
  }

  /** Between GETs with no wait set: #getSessionGone waits for a re-initialise, then opens the next GET. */
  get awaitingReinit (): boolean {
    return !this.stopped && this.exchange === null && this.timer === undefined
  }

  /** Ends the run; idempotent. */
  stop (): void {
    this.stopped = true
    clearTimeout(this.timer)
    this.timer = undefined
    this.exchange?.abort()
    this.exchange = null
  }
}
