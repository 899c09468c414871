// What both HTTP backend transports share (streamable-http.ts, legacy-sse.ts): a remote MCP server
// made to look to the router exactly like a stdio child: send(message) in, handlers.onMessage(message)
// out. This base holds the table of requests in flight, their deadlines, delivery and shutdown.
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
// Upstream credentials are config.headers, and the session owner's own credential when the server
// has a credential source (options.credential, credentials/): set on every request, and on a 401
// renewed once and the request sent again; a second 401 is GW_ERR_CREDENTIAL_REJECTED. Client
// headers pass only when named in config.forwardHeaders (A-UP-1: never the client's token).
import { setTimeout as sleep } from 'node:timers/promises'
import type { Dispatcher, Pool } from 'undici'
import type { Logger } from 'pino'
import { childLogger } from '../telemetry/logger.js'
import type { BackendConnection, BackendHandlers, BackendOpenOptions, TenantUpstream } from './backend.js'
import type { HttpServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, toJsonRpcError, type GatewayError } from '../core/errors.js'
import type { CallerCredential, Credential } from '../credentials/types.js'
import { classify, type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse, type RequestId } from '../core/jsonrpc.js'
import { backoff, dispatcherFor } from './http-io.js'
import { withCallerCredential } from './caller-credential.js'

/** A connection to an HTTP backend: a BackendConnection plus control of its GET stream. */
export interface HttpBackendConnection extends BackendConnection {
  /**
   * Streamable HTTP: opens the backend's standalone GET stream (H-GET-1) once the
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

/** How long a POST stream may stay open after its response arrived (the spec says SHOULD close). */
export const LINGER_MS = 5000
/** Upper bound for the DELETE sent on close(), so close() resolves promptly. */
export const DELETE_TIMEOUT_MS = 5000

// Headers the gateway sets itself or that describe one hop; never taken from the client. The
// client's credentials are among them whatever forwardHeaders says (A-UP-1): a backend
// gets the server's or the tenant's configured credentials, never the caller's.
const RESERVED_HEADERS = new Set([
  'accept', 'content-type', 'content-length', 'transfer-encoding', 'connection', 'keep-alive',
  'host', 'upgrade', 'te', 'trailer', 'proxy-authorization', 'proxy-connection',
  'mcp-session-id', 'mcp-protocol-version', 'last-event-id',
  'authorization', 'x-api-key', 'cookie'
])


export interface Pending {
  id: RequestId
  method: string
  timer: NodeJS.Timeout
  /**
   * Aborts the HTTP exchange that carries this request's answer: when p fails or times out, when its
   * exchange lingers after the answer, and when the connection closes (every pending and lingering
   * exchange), so it is the exchange's whole signal (no AbortSignal.any with the connection's: that
   * costs about 8 µs and weak references per request).
   */
  abort: AbortController
  /** Answered while its exchange still ran: aborts the exchange if it lingers (LINGER_MS). */
  linger?: NodeJS.Timeout
  /** The exchange is over (exchangeEnded): nothing is left to abort. */
  exchangeDone?: boolean
  /** Gateway-minted requests (re-initialise) resolve here and never reach onMessage. */
  internal?: { resolve: (m: JsonRpcResponse) => void, reject: (err: Error) => void }
}

/** SSE read state of one stream: the last event id (resume cursor) and the server's retry. */
export interface SseCursor {
  lastId?: string
  retryMs?: number
}

export const keyOf = (id: RequestId): string => typeof id === 'number' ? `n${id}` : `s${id}`

// One URL per server config rather than one per session; weak, so a reload's old configs go.
const serverUrls = new WeakMap<HttpServerConfig, URL>()

function serverUrl (config: HttpServerConfig): URL {
  let url = serverUrls.get(config)
  if (url === undefined) {
    url = new URL(config.url)
    serverUrls.set(config, url)
  }
  return url
}

// ---------------------------------------------------------------------------------------------
// What both transports share: the table of requests in flight, deadlines, delivery, headers,
// shutdown.

export abstract class HttpBackend implements HttpBackendConnection {
  protected readonly server: string
  protected readonly config: HttpServerConfig
  protected readonly handlers: BackendHandlers
  protected readonly log: Logger
  /** The server's URL, shared by all its sessions: never modified. */
  protected readonly url: Readonly<URL>
  protected readonly requests: Pool
  protected readonly streams: Pool
  /**
   * Requests in flight by keyOf(id). Made on first use and dropped when empty, as #lingering: an
   * idle session would otherwise keep the empty Map its initialize left (~180 B).
   */
  #pending: Map<string, Pending> | undefined
  /** See lifetime: made on first use. */
  #lifetime: AbortController | undefined
  /**
   * Exchanges that belong to no request (notification POSTs) while they run: aborted with the
   * connection. Made on first use and dropped when empty.
   */
  #exchanges: Set<AbortController> | undefined
  /**
   * Answered requests whose exchange still runs (LINGER_MS), aborted with the connection. Made on
   * first use and dropped when empty: an idle session would otherwise keep the Set its initialize left.
   */
  #lingering: Set<Pending> | undefined
  protected closed = false
  protected initParams: Record<string, unknown> | undefined
  /** The client (or a resumed session) completed the handshake: re-initialising makes sense. */
  protected initialized = false
  /** What goes upstream besides the protocol headers; fixed for the connection's life, maybe shared (sessionBaseHeaders). */
  readonly #base: Readonly<Record<string, string>>
  readonly #credential: CallerCredential | undefined
  #closing: Promise<void> | null = null
  #exited = false

  constructor (options: BackendOpenOptions, config: HttpServerConfig) {
    this.server = options.server
    this.config = config
    this.handlers = options.handlers
    this.log = childLogger(options.log, { backend: options.server, transport: config.transport })
    this.url = serverUrl(config)
    this.requests = dispatcherFor(this.url.origin, config.connections, config.connectTimeoutMs)
    this.streams = dispatcherFor(this.url.origin, null, config.connectTimeoutMs)
    this.initParams = options.initializeParams
    this.#base = sessionBaseHeaders(config, options.upstream, options.forwardedHeaders)
    this.#credential = options.credential
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
    this.#endLifetime()
    // The router asked for this: nobody waits for the requests still in flight.
    for (const p of this.#pending?.values() ?? []) {
      clearTimeout(p.timer)
      p.abort.abort()
      p.internal?.reject(new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'the connection was closed'))
    }
    this.#pending = undefined
    this.#abortLingering()
    try {
      await this.shutdown(deleteSession && !wasExited)
    } catch (err) {
      this.log.warn({ err }, 'backend connection shutdown failed')
    }
  }

  protected get isOpen (): boolean {
    return !this.closed
  }

  /**
   * Aborted on close(), detach() or an unrecoverable failure, for what lasts as long as the
   * connection (legacy SSE's stream and its reconnect waits). Made on first use: a Streamable HTTP
   * session needs none (its GET run is stopped by stopStreams, its notification POSTs are exchanges),
   * and an AbortController with its listeners held ~1 KB per idle session.
   */
  protected get lifetime (): AbortSignal {
    if (this.#lifetime === undefined) {
      this.#lifetime = new AbortController()
      if (this.closed) this.#lifetime.abort()
    }
    return this.#lifetime.signal
  }

  /** An exchange that belongs to no request: aborted with the connection; endExchange when it is over. */
  protected startExchange (): AbortController {
    const abort = new AbortController()
    if (this.closed) abort.abort()
    else (this.#exchanges ??= new Set()).add(abort)
    return abort
  }

  protected endExchange (abort: AbortController): void {
    const exchanges = this.#exchanges
    if (exchanges?.delete(abort) === true && exchanges.size === 0) this.#exchanges = undefined
  }

  /** Stops what the transport runs for the connection's whole life (Streamable HTTP: the GET stream). */
  protected stopStreams (): void {}

  /** The connection is over (closed, detached or lost): everything that runs for it stops. */
  #endLifetime (): void {
    this.#lifetime?.abort()
    for (const abort of this.#exchanges ?? []) abort.abort()
    this.#exchanges = undefined
    this.stopStreams()
  }

  protected assertOpen (): void {
    if (this.closed) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'the connection is closed')
  }

  /**
   * The tenant's upstream headers over config.headers (both already ${ENV}-expanded) over the
   * forwarded client headers; no protocol headers.
   */
  protected baseHeaders (): Record<string, string> {
    return { ...this.#base }
  }

  /**
   * The session owner's credential set in `headers` for a request that cannot go through request()
   * (the GET stream's callback-driven exchange); resolves to the one set, null when none. A backend
   * 401 to it is reported with credentialRefused(), and the next one is a fresh credential.
   */
  protected get hasCredential (): boolean { return this.#credential !== undefined }

  protected async setCredential (headers: Record<string, string>): Promise<Credential | null> {
    const used = await this.#credential?.current() ?? null
    if (used !== null) headers[used.header] = used.value
    return used
  }

  protected credentialRefused (used: Credential | null): void {
    if (used === null || this.#credential === undefined) return
    this.#credential.rejected(used).catch((err: unknown) => { this.log.warn({ code: (err as { code?: unknown }).code }, 'a refused backend credential could not be dropped') })
  }

  protected async request (pool: Pool, method: 'GET' | 'POST' | 'DELETE', url: Readonly<URL>, headers: Record<string, string>,
    signal: AbortSignal, options: { body?: string, bodyTimeout?: number, headersTimeout?: number } = {}): Promise<Dispatcher.ResponseData> {
    const credential = this.#credential
    if (credential === undefined) return await this.#dispatch(pool, method, url, headers, signal, options)
    return await withCallerCredential(this.server, credential, headers, signal, async () => await this.#dispatch(pool, method, url, headers, signal, options))
  }

  async #dispatch (pool: Pool, method: 'GET' | 'POST' | 'DELETE', url: Readonly<URL>, headers: Record<string, string>,
    signal: AbortSignal, options: { body?: string, bodyTimeout?: number, headersTimeout?: number }): Promise<Dispatcher.ResponseData> {
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

  /** The request in flight with this id, if any. */
  protected pendingOf (id: RequestId): Pending | undefined {
    return this.#pending?.get(keyOf(id))
  }

  /** Registers a request with its deadline. Its exchange aborts when it is settled by timeout. */
  protected track (request: JsonRpcRequest, internal?: Pending['internal']): Pending {
    const key = keyOf(request.id)
    const previous = this.#pending?.get(key)
    if (previous !== undefined) {
      // A duplicate id from the router: the older one can no longer be told apart.
      this.log.warn({ id: request.id }, 'request id reused while in flight')
      clearTimeout(previous.timer)
      previous.abort.abort()
    }
    const p: Pending = {
      id: request.id,
      method: request.method,
      abort: new AbortController(),
      timer: setTimeout(() => this.#onTimeout(p), this.config.requestTimeoutMs).unref()
    }
    if (internal !== undefined) p.internal = internal
    const pending = this.#pending ??= new Map()
    pending.set(key, p)
    return p
  }

  /** The HTTP exchange of p is over: a lingering-abort timer is no longer needed. */
  protected exchangeEnded (p: Pending): void {
    p.exchangeDone = true
    clearTimeout(p.linger)
    this.#unlinger(p)
  }

  #unlinger (p: Pending): void {
    const lingering = this.#lingering
    if (lingering?.delete(p) === true && lingering.size === 0) this.#lingering = undefined
  }

  #abortLingering (): void {
    for (const p of this.#lingering ?? []) {
      clearTimeout(p.linger)
      p.abort.abort()
    }
    this.#lingering = undefined
  }

  protected isPending (p: Pending): boolean {
    return this.#pending?.get(keyOf(p.id)) === p
  }

  /** Removes p from the table; false when it was already settled. */
  protected settle (p: Pending): boolean {
    const pending = this.#pending
    if (pending === undefined || pending.get(keyOf(p.id)) !== p) return false
    pending.delete(keyOf(p.id))
    if (pending.size === 0) this.#pending = undefined
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
    for (const p of [...this.#pending?.values() ?? []]) {
      if (filter === undefined || filter(p)) this.fail(p, err, extra)
    }
  }

  protected unavailable (reason: string, cause?: unknown): GatewayError {
    // The caller's credential could not be had: that error says more than "unavailable".
    if (isGatewayError(cause) && cause.code.startsWith('GW_ERR_CREDENTIAL_')) return cause
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
    const p = this.pendingOf(id)
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
      const p = this.pendingOf(c.message.id)
      if (p === undefined) {
        this.log.debug({ id: c.message.id }, 'dropped a backend response nobody waits for')
        return true
      }
      this.settle(p)
      // Let the exchange end by itself, but not hold a pooled connection forever. The timer goes
      // when the exchange ends (exchangeEnded): it would keep the request's state for LINGER_MS.
      if (p.exchangeDone !== true) {
        (this.#lingering ??= new Set()).add(p)
        p.linger = setTimeout(() => { this.#unlinger(p); p.abort.abort() }, LINGER_MS).unref()
      }
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
    this.#abortLingering()
    this.rejectQueued(err)
    this.closed = true
    this.#endLifetime()
    try {
      this.handlers.onExit({ reason })
    } catch (err) {
      this.log.error({ err }, 'onExit handler threw')
    }
  }

  /** The wait before reconnect attempt n; the server's `retry` wins over the backoff (H-BC-3). */
  protected retryDelay (attempt: number, retryMs: number | undefined): number {
    const { baseDelayMs, maxDelayMs } = this.config.reconnect
    return retryMs ?? backoff(attempt, baseDelayMs, maxDelayMs)
  }

  /** Waits before reconnect attempt n (retryDelay); false when the signal ended the wait. */
  protected async waitBeforeRetry (attempt: number, retryMs: number | undefined, signal: AbortSignal): Promise<boolean> {
    try {
      await sleep(this.retryDelay(attempt, retryMs), undefined, { signal, ref: false })
      return true
    } catch {
      return false
    }
  }
}

/**
 * What goes upstream besides the protocol headers: the forwarded client headers, then the
 * server's configured headers, then the tenant's upstream headers (later ones win; names lower-cased).
 */
export function upstreamBaseHeaders (config: HttpServerConfig, upstream: TenantUpstream | undefined, clientHeaders: Record<string, string>): Record<string, string> {
  return withConfigured(pickForwarded(config.forwardHeaders, clientHeaders), config, upstream)
}

function withConfigured (headers: Record<string, string>, config: HttpServerConfig, upstream: TenantUpstream | undefined): Record<string, string> {
  for (const [name, value] of Object.entries(config.headers)) headers[name.toLowerCase()] = value
  for (const [name, value] of Object.entries(upstream?.headers ?? {})) headers[name.toLowerCase()] = value
  return headers
}

// Base headers of the sessions that forward no client header, which depend only on the server's
// config and the tenant's upstream (both long-lived objects): one frozen object per pair rather than
// one per session. Weak, so a reload's old configs take theirs with them.
const sharedBases = new WeakMap<HttpServerConfig, WeakMap<TenantUpstream | typeof NO_UPSTREAM, Readonly<Record<string, string>>>>()
const NO_UPSTREAM = Object.freeze({})

/** upstreamBaseHeaders for one session, shared with the server's other sessions when nothing is forwarded. */
function sessionBaseHeaders (config: HttpServerConfig, upstream: TenantUpstream | undefined, clientHeaders: Record<string, string> | undefined): Readonly<Record<string, string>> {
  const forwarded = pickForwarded(config.forwardHeaders, clientHeaders)
  if (Object.keys(forwarded).length > 0) return withConfigured(forwarded, config, upstream)
  let byUpstream = sharedBases.get(config)
  if (byUpstream === undefined) {
    byUpstream = new WeakMap()
    sharedBases.set(config, byUpstream)
  }
  const key = upstream ?? NO_UPSTREAM
  let headers = byUpstream.get(key)
  if (headers === undefined) {
    headers = Object.freeze(withConfigured(forwarded, config, upstream))
    byUpstream.set(key, headers)
  }
  return headers
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
