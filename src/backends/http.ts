// HTTP backends: a remote MCP server reached over Streamable HTTP (SPEC.md 5) or the legacy
// HTTP+SSE transport (SPEC.md 6), made to look to the router exactly like a stdio child:
// send(message) in, handlers.onMessage(message) out.
//
// Errors this module delivers, through handlers.onMessage, as the JSON-RPC error response of
// every affected request in flight (at once, with the request's id; `data.source = 'gateway'`):
//   -32007 GW_ERR_BACKEND_UNAVAILABLE
//          the backend is unreachable (connection refused or reset, DNS, connect timeout);
//          it answered an HTTP error (data.status), including a 404 that re-initialising
//          could not recover; its body is not JSON or not JSON-RPC (data.status); a response
//          stream ended before the response and could not be resumed (H-BC-3); a legacy
//          HTTP+SSE connection dropped (a new SSE connection is a new legacy session, so the
//          requests sent on the old one are lost); reconnect attempts are exhausted.
//   -32006 GW_ERR_BACKEND_TIMEOUT
//          no response within config.requestTimeoutMs; `notifications/cancelled` is sent
//          upstream for the request (U-CAN-1).
// Notifications and responses the router sends have no id to answer: send() rejects with the
// GatewayError instead. handlers.onExit is called only when the connection cannot recover
// (reconnect attempts exhausted), after every request in flight was answered.
//
// Upstream credentials are config.headers only; client headers pass only when named in
// config.forwardHeaders (A-UP-1: never the client's token by default).
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { IncomingHttpHeaders } from 'node:http'
import { Pool, type Dispatcher } from 'undici'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import type { Logger } from 'pino'
import type { BackendConnection, BackendFactory, BackendHandlers, BackendOpenOptions } from './backend.js'
import type { HttpServerConfig } from '../config/schema.js'
import {
  GW_ERR_BACKEND_TIMEOUT,
  GW_ERR_BACKEND_UNAVAILABLE,
  GW_ERR_CONFIG_INVALID,
  toJsonRpcError,
  type GatewayError
} from '../core/errors.js'
import {
  classify,
  isNotification,
  isRequest,
  type JsonRpcMessage,
  type JsonRpcNotification,
  type JsonRpcRequest,
  type JsonRpcResponse,
  type RequestId
} from '../core/jsonrpc.js'

/** A connection to an HTTP backend: a BackendConnection plus control of its GET stream. */
export interface HttpBackendConnection extends BackendConnection {
  /**
   * Streamable HTTP: opens the backend's standalone GET stream (SPEC.md H-GET-1) once the
   * backend session is initialised, and keeps it open (reconnecting with Last-Event-ID).
   * On by default. With several replicas only the replica holding the session's GET lease
   * should listen: open with `listen: false` (openHttpBackend) or call stopListening(), and
   * startListening() when the lease is won. Idempotent. No-op for legacy 'sse' backends,
   * whose one SSE stream is the transport itself and cannot be paused.
   */
  startListening (fromEventId?: string | null): void
  /** Streamable HTTP: closes the standalone GET stream and stops reconnecting it. Idempotent. */
  stopListening (): void
  /** Whether the GET stream is wanted (not whether it is connected right now). */
  readonly listening: boolean
  /** The backend's own session id (Streamable HTTP), null before initialize or for 'sse'. */
  readonly backendSessionId: string | null
  /**
   * Like close() but leaves the backend session alive (no DELETE), for a hand-over to
   * another replica that resumes it with `backendSessionId`. Idempotent; shares close()'s promise.
   */
  detach (): Promise<void>
}

export interface HttpBackendOpenOptions extends BackendOpenOptions {
  /** Open the standalone GET stream when the session is ready. Default true. */
  listen?: boolean
}

/** Largest message or body read from a backend; beyond it the reply counts as garbage. */
const MAX_BODY_BYTES = 16 * 1024 * 1024
/** How long a POST stream may stay open after its response arrived (the spec says SHOULD close). */
const LINGER_MS = 5000
/** Upper bound for the DELETE sent on close(), so close() resolves promptly. */
const DELETE_TIMEOUT_MS = 5000

// Headers the gateway sets itself or that describe one hop; never taken from the client.
const RESERVED_HEADERS = new Set([
  'accept', 'content-type', 'content-length', 'transfer-encoding', 'connection', 'keep-alive',
  'host', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'proxy-connection',
  'mcp-session-id', 'mcp-protocol-version', 'last-event-id'
])

// ---------------------------------------------------------------------------------------------
// Dispatchers: one Pool per origin, shared by every session of every backend on that origin.
// Request/response POSTs use a pool bounded by config.connections; long-lived SSE streams (the
// standalone GET, legacy SSE, resumptions) use an unbounded pool of the same origin, so a
// thousand idle GET streams can never starve the POSTs of their connections.

const dispatchers = new Map<string, Pool>()

function dispatcherFor (origin: string, connections: number | null, connectTimeoutMs: number): Pool {
  const key = `${origin} ${connections ?? 'streams'} ${connectTimeoutMs}`
  let pool = dispatchers.get(key)
  if (pool === undefined || pool.closed || pool.destroyed) {
    pool = new Pool(origin, {
      connections,
      connect: { timeout: connectTimeoutMs },
      // Deadlines are per request (see #request); these are the fallbacks.
      headersTimeout: 300_000,
      bodyTimeout: 0
    })
    dispatchers.set(key, pool)
  }
  return pool
}

/** Closes every shared upstream pool (shutdown, tests). Later connections create new pools. */
export async function closeHttpDispatchers (): Promise<void> {
  const pools = [...dispatchers.values()]
  dispatchers.clear()
  await Promise.all(pools.map(async pool => await pool.destroy().catch(() => {})))
}

// ---------------------------------------------------------------------------------------------
// Small helpers

type Body = Dispatcher.ResponseData['body']

interface Pending {
  id: RequestId
  method: string
  timer: NodeJS.Timeout
  /** Aborts the HTTP exchange that carries this request's answer. */
  abort: AbortController
  /** Gateway-minted requests (re-initialise) resolve here and never reach onMessage. */
  internal?: { resolve: (m: JsonRpcResponse) => void, reject: (err: Error) => void }
}

/** SSE read state of one stream: the last event id (resume cursor) and the server's retry. */
interface SseCursor {
  lastId?: string
  retryMs?: number
  /** Told every event id, so another replica can resume this stream after a failover. */
  onId?: (id: string) => void
}

const keyOf = (id: RequestId): string => typeof id === 'number' ? `n${id}` : `s${id}`

function headerValue (headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name]
  return Array.isArray(v) ? v[0] : v
}

function mediaType (headers: IncomingHttpHeaders): string {
  return (headerValue(headers, 'content-type') ?? '').split(';')[0]?.trim().toLowerCase() ?? ''
}

async function drain (body: Body): Promise<void> {
  await body.dump({ limit: 65_536 }).catch(() => {})
}

async function readText (body: Body, max: number): Promise<string> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of body) {
    const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk as Buffer
    size += buf.length
    if (size > max) {
      body.destroy()
      throw new Error(`the body exceeds ${max} bytes`)
    }
    chunks.push(buf)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/** Reads a small error body and keeps the backend's JSON-RPC error, if it sent one. */
async function errorDetail (body: Body): Promise<Record<string, unknown>> {
  try {
    const value: unknown = JSON.parse(await readText(body, 65_536))
    const c = classify(value)
    if (c.kind === 'response' && 'error' in c.message) {
      return { backendError: { code: c.message.error.code, message: c.message.error.message } }
    }
  } catch {}
  return {}
}

/** A short, log- and client-safe description of a network error (undici codes). */
function describe (err: unknown): string {
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code
    const inner = err instanceof AggregateError ? err.errors.find((e: unknown) => e instanceof Error) as Error | undefined : undefined
    const message = inner?.message ?? err.message
    return code !== undefined && !message.includes(code) ? `${code}: ${message}` : message
  }
  return String(err)
}

/** Backoff for reconnect attempt n (0-based): exponential, capped, half jitter (STYLE.md 8). */
function backoff (attempt: number, baseMs: number, maxMs: number): number {
  const exp = Math.min(maxMs, baseMs * 2 ** attempt)
  return exp / 2 + Math.random() * exp / 2
}

/** Feeds an SSE body through eventsource-parser; resolves when the body ends, rejects on error. */
async function pumpSse (body: Body, onEvent: (event: EventSourceMessage) => void, onRetry: (ms: number) => void): Promise<void> {
  const decoder = new TextDecoder()
  const parser = createParser({ onEvent, onRetry, maxBufferSize: MAX_BODY_BYTES })
  for await (const chunk of body) {
    parser.feed(typeof chunk === 'string' ? chunk : decoder.decode(chunk as Buffer, { stream: true }))
  }
  parser.feed(decoder.decode())
}

// ---------------------------------------------------------------------------------------------
// What both transports share: the table of requests in flight, deadlines, delivery, headers,
// shutdown.

abstract class HttpBackend implements HttpBackendConnection {
  protected readonly server: string
  protected readonly config: HttpServerConfig
  protected readonly handlers: BackendHandlers
  protected readonly log: Logger
  protected readonly url: URL
  protected readonly requests: Pool
  protected readonly streams: Pool
  protected readonly pending = new Map<string, Pending>()
  /** Aborted on close(), detach() or an unrecoverable failure; every exchange listens to it. */
  protected readonly lifetime = new AbortController()
  protected closed = false
  protected initParams: Record<string, unknown> | undefined
  /** The client (or a resumed session) completed the handshake: re-initialising makes sense. */
  protected initialized = false
  readonly #forwarded: Record<string, string>
  #closing: Promise<void> | null = null
  #exited = false

  constructor (options: BackendOpenOptions, config: HttpServerConfig) {
    this.server = options.server
    this.config = config
    this.handlers = options.handlers
    this.log = options.log.child({ backend: options.server, transport: config.transport })
    this.url = new URL(config.url)
    this.requests = dispatcherFor(this.url.origin, config.connections, config.connectTimeoutMs)
    this.streams = dispatcherFor(this.url.origin, null, config.connectTimeoutMs)
    this.initParams = options.initializeParams
    this.#forwarded = pickForwarded(config.forwardHeaders, options.forwardedHeaders)
  }

  abstract send (message: JsonRpcMessage): Promise<void>
  abstract startListening (fromEventId?: string | null): void
  abstract stopListening (): void
  abstract get listening (): boolean
  abstract get backendSessionId (): string | null
  /** Transport-specific shutdown after every exchange was aborted. */
  protected abstract shutdown (deleteSession: boolean): Promise<void>

  close (): Promise<void> {
    this.#closing ??= this.#stop(true)
    return this.#closing
  }

  detach (): Promise<void> {
    this.#closing ??= this.#stop(false)
    return this.#closing
  }

  async #stop (deleteSession: boolean): Promise<void> {
    const wasExited = this.#exited
    this.closed = true
    this.lifetime.abort()
    // The router asked for this: nobody waits for the requests still in flight.
    for (const p of this.pending.values()) {
      clearTimeout(p.timer)
      p.abort.abort()
      p.internal?.reject(new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'the connection was closed'))
    }
    this.pending.clear()
    try {
      await this.shutdown(deleteSession && !wasExited)
    } catch (err) {
      this.log.warn({ err }, 'backend connection shutdown failed')
    }
  }

  protected get isOpen (): boolean {
    return !this.closed
  }

  protected assertOpen (): void {
    if (this.closed) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'the connection is closed')
  }

  /** config.headers (already ${ENV}-expanded) over the forwarded client headers; no protocol headers. */
  protected baseHeaders (): Record<string, string> {
    const headers: Record<string, string> = { ...this.#forwarded }
    for (const [name, value] of Object.entries(this.config.headers)) headers[name.toLowerCase()] = value
    return headers
  }

  protected async request (pool: Pool, method: 'GET' | 'POST' | 'DELETE', url: URL, headers: Record<string, string>,
    signal: AbortSignal, options: { body?: string, bodyTimeout?: number, headersTimeout?: number } = {}): Promise<Dispatcher.ResponseData> {
    return await pool.request({
      method,
      path: url.pathname + url.search,
      headers,
      body: options.body,
      signal,
      headersTimeout: options.headersTimeout ?? this.config.requestTimeoutMs,
      // 0 for streams: an SSE body may be idle for long; the request deadline is ours (#onTimeout).
      bodyTimeout: options.bodyTimeout ?? 0
    })
  }

  // -- requests in flight -----------------------------------------------------------------------

  /** Registers a request with its deadline. Its exchange aborts when it is settled by timeout. */
  protected track (request: JsonRpcRequest, internal?: Pending['internal']): Pending {
    const key = keyOf(request.id)
    const previous = this.pending.get(key)
    if (previous !== undefined) {
      // A duplicate id from the router: the older one can no longer be told apart.
      this.log.warn({ id: request.id }, 'request id reused while in flight')
      clearTimeout(previous.timer)
    }
    const p: Pending = {
      id: request.id,
      method: request.method,
      abort: new AbortController(),
      timer: setTimeout(() => this.#onTimeout(p), this.config.requestTimeoutMs).unref()
    }
    if (internal !== undefined) p.internal = internal
    this.pending.set(key, p)
    return p
  }

  protected isPending (p: Pending): boolean {
    return this.pending.get(keyOf(p.id)) === p
  }

  /** Removes p from the table; false when it was already settled. */
  protected settle (p: Pending): boolean {
    if (!this.isPending(p)) return false
    this.pending.delete(keyOf(p.id))
    clearTimeout(p.timer)
    return true
  }

  /** Answers p with a gateway error (and stops its exchange); no-op when already settled. */
  protected fail (p: Pending, err: GatewayError, extra?: Record<string, unknown>): void {
    if (!this.settle(p)) return
    p.abort.abort()
    if (p.internal !== undefined) {
      p.internal.reject(err)
      return
    }
    const reply = toJsonRpcError(err, p.id)
    if (extra !== undefined) reply.error.data = { ...(reply.error.data as Record<string, unknown>), ...extra }
    this.log.debug({ id: p.id, method: p.method, code: err.code, ...extra }, err.message)
    this.emit(reply)
  }

  protected failAll (err: GatewayError, extra?: Record<string, unknown>, filter?: (p: Pending) => boolean): void {
    for (const p of [...this.pending.values()]) {
      if (filter === undefined || filter(p)) this.fail(p, err, extra)
    }
  }

  protected unavailable (reason: string, cause?: unknown): GatewayError {
    return cause === undefined
      ? new GW_ERR_BACKEND_UNAVAILABLE(this.server, reason)
      : new GW_ERR_BACKEND_UNAVAILABLE(this.server, reason, { cause })
  }

  #onTimeout (p: Pending): void {
    if (!this.isPending(p)) return
    this.log.warn({ id: p.id, method: p.method, timeoutMs: this.config.requestTimeoutMs }, 'backend request timed out')
    this.fail(p, new GW_ERR_BACKEND_TIMEOUT(this.server, this.config.requestTimeoutMs))
    // initialize is never cancelled (SPEC L-5), and the gateway's own requests need no cancel.
    if (p.method === 'initialize' || p.internal !== undefined) return
    // Tell the backend to stop working on it (U-CAN-1); the reply, if any, is dropped.
    const cancel: JsonRpcNotification = {
      jsonrpc: '2.0',
      method: 'notifications/cancelled',
      params: { requestId: p.id, reason: `The gateway timed out after ${this.config.requestTimeoutMs} ms` }
    }
    this.sendQuietly(cancel)
  }

  /** Sends a gateway-made notification; failures are only logged. */
  protected sendQuietly (message: JsonRpcNotification): void {
    if (this.closed) return
    // retried: a notification the gateway makes never starts a re-initialise of its own.
    this.postNotification(message, true).catch((err: unknown) => {
      this.log.debug({ err, method: message.method }, 'backend notification not delivered')
    })
  }

  /** Transport-specific POST of a notification or response; rejects with a GatewayError. */
  protected abstract postNotification (message: JsonRpcMessage, retried?: boolean): Promise<void>

  /** The client cancelled a request: stop waiting for it, so no timeout error follows. */
  protected forgetCancelled (message: JsonRpcNotification): void {
    const params = message.params
    if (params === undefined || Array.isArray(params)) return
    const id = params.requestId
    if (typeof id !== 'string' && typeof id !== 'number') return
    const p = this.pending.get(keyOf(id))
    if (p !== undefined && p.internal === undefined && this.settle(p)) p.abort.abort()
  }

  protected rememberInitialize (request: JsonRpcRequest): void {
    if (request.method !== 'initialize') return
    const params = request.params
    if (params !== undefined && !Array.isArray(params)) this.initParams = params
  }

  // -- delivery ---------------------------------------------------------------------------------

  /**
   * Delivers one decoded value from the backend. Returns false for a value that is not a
   * JSON-RPC message (the caller decides what that breaks). Responses settle their request;
   * responses to gateway-minted requests never reach onMessage; late responses are dropped.
   */
  protected deliver (value: unknown): boolean {
    const c = classify(value)
    if (c.kind === 'invalid') {
      this.log.warn({ reason: c.reason }, 'backend sent an invalid JSON-RPC message')
      return false
    }
    if (c.kind === 'response' && c.message.id !== undefined && c.message.id !== null) {
      const p = this.pending.get(keyOf(c.message.id))
      if (p === undefined) {
        this.log.debug({ id: c.message.id }, 'dropped a backend response nobody waits for')
        return true
      }
      this.settle(p)
      // Let the exchange end by itself, but not hold a pooled connection forever.
      setTimeout(() => p.abort.abort(), LINGER_MS).unref()
      if (p.method === 'initialize' && 'result' in c.message) this.onInitializeResult(c.message.result)
      if (p.internal !== undefined) {
        p.internal.resolve(c.message)
        return true
      }
    }
    this.emit(c.message)
    return true
  }

  /** Parses one SSE `data` field; false when it is not JSON or not JSON-RPC. Priming events pass. */
  protected deliverData (data: string): boolean {
    if (data.trim() === '') return true // priming event (H-POST-7): only an id
    let value: unknown
    try {
      value = JSON.parse(data)
    } catch {
      this.log.warn('backend sent an SSE event whose data is not JSON')
      return false
    }
    return this.deliver(value)
  }

  protected onInitializeResult (_result: unknown): void {}

  protected emit (message: JsonRpcMessage): void {
    try {
      this.handlers.onMessage(message)
    } catch (err) {
      this.log.error({ err }, 'onMessage handler threw')
    }
  }

  /** Messages waiting for a connection (legacy SSE): reject them all. */
  protected rejectQueued (_err: GatewayError): void {}

  /** The connection cannot recover: answer everything in flight, then report the exit once. */
  protected unrecoverable (reason: string): void {
    if (this.closed || this.#exited) return
    this.#exited = true
    this.log.error({ reason }, 'backend connection lost for good')
    const err = this.unavailable(reason)
    this.failAll(err)
    this.rejectQueued(err)
    this.closed = true
    this.lifetime.abort()
    try {
      this.handlers.onExit({ reason })
    } catch (err) {
      this.log.error({ err }, 'onExit handler threw')
    }
  }

  /** Waits before reconnect attempt n; the server's `retry` wins over the backoff (H-BC-3). */
  protected async waitBeforeRetry (attempt: number, retryMs: number | undefined, signal: AbortSignal): Promise<boolean> {
    const { baseDelayMs, maxDelayMs } = this.config.reconnect
    const ms = retryMs ?? backoff(attempt, baseDelayMs, maxDelayMs)
    try {
      await sleep(ms, undefined, { signal, ref: false })
      return true
    } catch {
      return false
    }
  }
}

function pickForwarded (names: readonly string[], clientHeaders: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {}
  if (clientHeaders === undefined || names.length === 0) return out
  const wanted = new Set(names.map(n => n.toLowerCase()).filter(n => !RESERVED_HEADERS.has(n)))
  for (const [name, value] of Object.entries(clientHeaders)) {
    const lower = name.toLowerCase()
    if (wanted.has(lower) && typeof value === 'string') out[lower] = value
  }
  return out
}

// ---------------------------------------------------------------------------------------------
// Streamable HTTP (SPEC.md 5; the gateway is the client here)

class StreamableHttpBackend extends HttpBackend {
  #sessionId: string | null
  #protocolVersion: string | undefined
  /** While set, other POSTs wait: an initialize is getting the session id, or a re-init runs. */
  #gate: Promise<void> | null = null
  #reinit: Promise<boolean> | null = null
  #listen: boolean
  #get: AbortController | null = null
  #getCursor: SseCursor = {}
  /** The backend answered 405 to GET: it offers no stream, so listening again is pointless. */
  #noGetStream = false

  constructor (options: HttpBackendOpenOptions, config: HttpServerConfig) {
    super(options, config)
    this.#sessionId = options.backendSessionId ?? null
    this.#protocolVersion = options.protocolVersion
    this.#listen = options.listen ?? true
    const onId = options.handlers.onGetStreamEventId
    this.#getCursor = {
      ...(options.getStreamLastEventId != null ? { lastId: options.getStreamLastEventId } : {}),
      ...(onId !== undefined ? { onId: (id: string) => { onId(id) } } : {})
    }
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
    this.#get?.abort()
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
      })
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
    const signal = AbortSignal.any([p.abort.signal, this.lifetime.signal])
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
        const res = await this.#openStream(cursor.lastId, AbortSignal.any([p.abort.signal, this.lifetime.signal]))
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

  /** Feeds one SSE body; garbage data fails the request the stream carries (if any). */
  async #pump (body: Body, cursor: SseCursor, p: Pending | null): Promise<void> {
    await pumpSse(body, event => {
      if (event.id !== undefined) {
        cursor.lastId = event.id
        cursor.onId?.(event.id)
      }
      if (event.event !== undefined && event.event !== 'message') return
      if (!this.deliverData(event.data) && p !== null) {
        this.fail(p, this.unavailable('the backend sent an event that is not JSON-RPC'), { status: 200 })
      }
    }, ms => { cursor.retryMs = ms })
  }

  /** GET on the endpoint (standalone stream, or a resumption when lastEventId is given). */
  async #openStream (lastEventId: string | undefined, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
    const headers = this.baseHeaders()
    headers.accept = 'text/event-stream' // H-GET-1
    if (this.#sessionId !== null) headers['mcp-session-id'] = this.#sessionId
    if (this.#protocolVersion !== undefined) headers['mcp-protocol-version'] = this.#protocolVersion
    if (lastEventId !== undefined) headers['last-event-id'] = lastEventId
    return await this.request(this.streams, 'GET', this.url, headers, signal)
  }

  /** POSTs a notification or response; 2xx expected; 404 on a session re-initialises once. */
  protected async postNotification (message: JsonRpcMessage, retried = false, bypassGate = false): Promise<void> {
    const signal = this.lifetime.signal
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
      if (await this.#reinitialise(sid)) return await this.postNotification(message, true, bypassGate)
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
    // Event ids of the old session mean nothing to the new one; the id reporting stays.
    this.#getCursor = this.#getCursor.onId !== undefined ? { onId: this.#getCursor.onId } : {}
    const request: JsonRpcRequest = { jsonrpc: '2.0', id: `gw-init-${randomUUID()}`, method: 'initialize', params: this.initParams }
    try {
      const reply = await new Promise<JsonRpcResponse>((resolve, reject) => {
        const p = this.track(request, { resolve, reject })
        this.#runRequest(request, p, true, true).catch(reject)
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

  #openGet (): void {
    if (this.#get !== null || this.closed) return
    const controller = new AbortController()
    this.#get = controller
    this.#runGet(controller).catch((err: unknown) => {
      this.log.error({ err }, 'backend GET stream loop failed')
    }).finally(() => {
      if (this.#get === controller) this.#get = null
    })
  }

  async #runGet (controller: AbortController): Promise<void> {
    const signal = AbortSignal.any([controller.signal, this.lifetime.signal])
    let attempt = 0
    let justReinitialised = false
    let conflict = false
    while (!signal.aborted) {
      let reason: string
      const sid = this.#sessionId
      conflict = false
      try {
        const res = await this.#openStream(this.#getCursor.lastId, signal)
        if (res.statusCode === 405) {
          await drain(res.body)
          this.log.debug('backend offers no GET stream')
          this.#noGetStream = true
          return
        }
        if (res.statusCode === 409) {
          // H-GET-3: the session already has a GET stream. After a failover that is usually the
          // dead holder's stream, which the backend drops once it notices the closed socket:
          // retry with backoff; if it never frees, stop listening without ending the session.
          await drain(res.body)
          conflict = true
          reason = 'another GET stream is open for the backend session'
        } else if (res.statusCode === 404 && sid !== null) {
          await drain(res.body)
          // A new session deserves one immediate GET; a 404 right after it counts as a failure.
          if (!justReinitialised && await this.#reinitialise(sid)) {
            justReinitialised = true
            continue
          }
          reason = 'the backend session expired and could not be re-initialised'
        } else if (res.statusCode === 200 && mediaType(res.headers) === 'text/event-stream') {
          attempt = 0
          justReinitialised = false
          await this.#pump(res.body, this.#getCursor, null)
          reason = 'the GET stream ended'
        } else {
          await drain(res.body)
          reason = `the GET stream answered HTTP ${res.statusCode}`
        }
      } catch (err) {
        if (signal.aborted) return
        reason = `the GET stream failed: ${describe(err)}`
      }
      if (signal.aborted) return
      if (attempt >= this.config.reconnect.maxAttempts) {
        if (conflict) {
          this.log.warn('backend GET stream stays taken; not listening')
          return
        }
        this.unrecoverable(`${reason}; reconnect attempts exhausted`)
        return
      }
      this.log.debug({ reason, attempt }, 'backend GET stream reconnecting')
      if (!await this.waitBeforeRetry(attempt++, this.#getCursor.retryMs, signal)) return
    }
  }

  // -- shutdown ----------------------------------------------------------------------------------

  protected async shutdown (deleteSession: boolean): Promise<void> {
    this.#get = null
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

// ---------------------------------------------------------------------------------------------
// Legacy HTTP+SSE (SPEC.md 6): GET the SSE url, wait for `endpoint`, POST every message there;
// messages come back as `message` events. A new SSE connection is a new legacy session.

interface Queued {
  message: JsonRpcMessage
  resolve: () => void
  reject: (err: Error) => void
}

class LegacySseBackend extends HttpBackend {
  #endpoint: URL | null = null
  /** Set while a re-initialise on a fresh connection runs; only its own POSTs may pass. */
  #reiniting = false
  #queue: Queued[] = []
  #stream: AbortController | null = null
  /** The last connection attempt failed or dropped and no `endpoint` arrived since. */
  #down = false

  constructor (options: HttpBackendOpenOptions, config: HttpServerConfig) {
    super(options, config)
    this.#run().catch((err: unknown) => {
      this.log.error({ err }, 'backend SSE loop failed')
      this.unrecoverable(`the SSE connection loop failed: ${describe(err)}`)
    })
  }

  get listening (): boolean {
    return true
  }

  get backendSessionId (): string | null {
    return null
  }

  startListening (): void {}
  stopListening (): void {}

  async send (message: JsonRpcMessage): Promise<void> {
    this.assertOpen()
    if (isRequest(message)) {
      this.rememberInitialize(message)
      const p = this.track(message)
      this.#enqueue(message).catch((err: unknown) => {
        this.fail(p, err as GatewayError)
      })
      return
    }
    if (isNotification(message) && message.method === 'notifications/cancelled') this.forgetCancelled(message)
    await this.#enqueue(message)
    if (isNotification(message) && message.method === 'notifications/initialized') this.initialized = true
  }

  protected async postNotification (message: JsonRpcMessage): Promise<void> {
    await this.#enqueue(message)
  }

  get #ready (): boolean {
    return this.#endpoint !== null && !this.#reiniting
  }

  /** POSTs now when the connection is ready, else after the next (re)connect. */
  async #enqueue (message: JsonRpcMessage): Promise<void> {
    if (this.#down) throw this.unavailable('the SSE connection is down (reconnecting)')
    if (this.#ready) {
      await this.#postNow(message)
      return
    }
    await new Promise<void>((resolve, reject) => {
      this.#queue.push({ message, resolve, reject })
    })
  }

  #flush (): void {
    const queue = this.#queue
    this.#queue = []
    for (const item of queue) {
      if (isRequest(item.message) && this.pending.get(keyOf(item.message.id)) === undefined) {
        item.resolve() // answered meanwhile (timeout or cancel): do not send it late
        continue
      }
      this.#postNow(item.message).then(item.resolve, item.reject)
    }
  }

  async #postNow (message: JsonRpcMessage): Promise<void> {
    const endpoint = this.#endpoint
    if (endpoint === null) throw this.unavailable('the SSE connection is not established')
    const headers = this.baseHeaders()
    headers['content-type'] = 'application/json'
    const p = isRequest(message) ? this.pending.get(keyOf(message.id)) : undefined
    const signal = p === undefined ? this.lifetime.signal : AbortSignal.any([p.abort.signal, this.lifetime.signal])
    let res: Dispatcher.ResponseData
    try {
      res = await this.request(this.requests, 'POST', endpoint, headers, signal, { body: JSON.stringify(message), bodyTimeout: this.config.requestTimeoutMs })
    } catch (err) {
      throw this.unavailable(describe(err), err)
    }
    await drain(res.body)
    if (res.statusCode >= 200 && res.statusCode < 300) return
    if (res.statusCode === 404 && this.#endpoint === endpoint) {
      // The legacy session is gone on the server: reconnect, which starts a new one.
      this.#stream?.abort()
    }
    const err = this.unavailable(`the backend answered HTTP ${res.statusCode}`)
    if (p !== undefined) {
      this.fail(p, err, { status: res.statusCode })
      return
    }
    throw err
  }

  async #run (): Promise<void> {
    let attempt = 0
    let retryMs: number | undefined
    while (!this.closed) {
      const controller = new AbortController()
      this.#stream = controller
      const signal = AbortSignal.any([controller.signal, this.lifetime.signal])
      let reason: string
      // A server that never names its endpoint would hold the requests until their deadlines.
      const endpointDeadline = setTimeout(() => controller.abort(), this.config.requestTimeoutMs).unref()
      try {
        const headers = this.baseHeaders()
        headers.accept = 'text/event-stream'
        const res = await this.request(this.streams, 'GET', this.url, headers, signal)
        if (res.statusCode === 200 && mediaType(res.headers) === 'text/event-stream') {
          await pumpSse(res.body, event => {
            if (event.event === 'endpoint') {
              clearTimeout(endpointDeadline)
              if (this.#onEndpoint(event.data, controller)) attempt = 0
            } else if (event.event === undefined || event.event === 'message') {
              this.deliverData(event.data)
            }
          }, ms => { retryMs = ms })
          reason = 'the SSE connection ended'
        } else {
          await drain(res.body)
          reason = `the SSE connection answered HTTP ${res.statusCode}`
        }
      } catch (err) {
        reason = controller.signal.aborted && !this.lifetime.signal.aborted
          ? 'the SSE connection was abandoned'
          : `the SSE connection failed: ${describe(err)}`
      }
      clearTimeout(endpointDeadline)
      this.#endpoint = null
      this.#reiniting = false
      if (this.closed) return
      this.#lost(reason)
      if (attempt >= this.config.reconnect.maxAttempts) {
        this.unrecoverable(`${reason}; reconnect attempts exhausted`)
        return
      }
      this.log.warn({ reason, attempt }, 'backend SSE connection lost; reconnecting')
      if (!await this.waitBeforeRetry(attempt++, retryMs, this.lifetime.signal)) return
    }
  }

  /**
   * The legacy session is gone with its connection: nothing sent on it can be answered, and
   * what waits in the queue belonged to it too. Until the next `endpoint`, new messages fail
   * at once rather than wait through the backoff (unreachable => error now, not at the deadline).
   */
  #lost (reason: string): void {
    this.#down = true
    const err = this.unavailable(reason)
    this.failAll(err)
    this.rejectQueued(err)
  }

  protected override rejectQueued (err: GatewayError): void {
    const queue = this.#queue
    this.#queue = []
    for (const q of queue) q.reject(err)
  }

  #onEndpoint (data: string, controller: AbortController): boolean {
    let endpoint: URL
    try {
      endpoint = new URL(data.trim(), this.url)
    } catch {
      this.log.error('backend sent an endpoint that is not a URL')
      controller.abort()
      return false
    }
    if (endpoint.origin !== this.url.origin) {
      // S-2: like the SDK client, never POST to another origin than the SSE url's.
      this.log.error({ origin: endpoint.origin }, 'backend endpoint is on another origin; refused')
      controller.abort()
      return false
    }
    this.#endpoint = endpoint
    this.#down = false
    if (this.initialized && this.initParams !== undefined) {
      this.#reiniting = true
      this.#reinitialise(controller).catch((err: unknown) => {
        this.log.warn({ err }, 'backend re-initialise failed')
        controller.abort()
      })
    } else {
      this.#flush()
    }
    return true
  }

  /** A new legacy session after a reconnect: initialize + initialized as the gateway, then flush. */
  async #reinitialise (controller: AbortController): Promise<void> {
    const request: JsonRpcRequest = { jsonrpc: '2.0', id: `gw-init-${randomUUID()}`, method: 'initialize', params: this.initParams }
    const reply = await new Promise<JsonRpcResponse>((resolve, reject) => {
      this.track(request, { resolve, reject })
      this.#postNow(request).catch(reject)
    })
    if ('error' in reply) throw this.unavailable(`re-initialise failed: ${reply.error.message}`)
    await this.#postNow({ jsonrpc: '2.0', method: 'notifications/initialized' })
    if (controller.signal.aborted) return
    this.#reiniting = false
    this.log.info('backend legacy session re-initialised')
    this.#flush()
  }

  protected async shutdown (): Promise<void> {
    // Closing the SSE GET (lifetime abort) ends the legacy session; there is nothing to DELETE.
    this.#stream = null
    this.rejectQueued(this.unavailable('the connection was closed'))
  }
}

// ---------------------------------------------------------------------------------------------

/**
 * Opens a connection to an HTTP backend ('streamable-http' or 'sse'). Performs no network I/O
 * before it resolves for Streamable HTTP; a legacy 'sse' backend starts its SSE GET at once and
 * queues messages until the `endpoint` event arrives. With `backendSessionId` the connection
 * resumes that backend session (failover) without initialize.
 */
export async function openHttpBackend (options: HttpBackendOpenOptions): Promise<HttpBackendConnection> {
  const config = options.config
  if (config.transport !== 'streamable-http' && config.transport !== 'sse') {
    throw new GW_ERR_CONFIG_INVALID(`server '${options.server}' is not an HTTP backend`)
  }
  return config.transport === 'sse'
    ? new LegacySseBackend(options, config)
    : new StreamableHttpBackend(options, config)
}

/** The BackendFactory for transports 'streamable-http' and 'sse'. */
export const httpBackendFactory: BackendFactory = async options => await openHttpBackend(options)
