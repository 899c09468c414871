// The relay of one backend session on this replica (docs/architecture.md, "A backend message"): it
// translates between the client's hop and the backend's (each is its own MCP connection, with its
// own negotiated version) and knows nothing of HTTP, Redis or other replicas. What it sends toward
// the client goes through RelayHost.append (the stream's log).
//
// - Request ids: gateway-minted integers toward the backend (an id is unique per sender, and the
//   gateway is the backend's one client), mapped back to the client's ids; "direct" sessions
//   (Streamable HTTP backends shared by several replicas) pass the client's ids through, unique in
//   the session, so replicas never collide.
// - In flight: every request has a deadline; on expiry the client gets -32006 and a stdio backend
//   gets `notifications/cancelled` (MCP spec, "Lifecycle": timeouts), except for initialize, which
//   is never cancelled (MCP spec, "Cancellation").
// - Progress goes to the stream of the request that carried the token (MCP spec, "Progress");
//   other messages go to the one request in flight, else to the GET stream.
// - Server-to-client requests get opaque ids `s.<replica>.<seq>` so the client's answer can reach
//   this replica from any other; a capability the client did not declare is refused to the backend
//   with -32601 and never reaches the client (MCP spec, "Lifecycle": capability negotiation).
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import { consentAnswerFor, consentErrorFor } from '../../core/consent-error.js'
import {
  CANCELLED_MEMBER, GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, cancelledAnswer, isCancelledAnswer, isGatewayError, toJsonRpcError, type GatewayError
} from '../../core/errors.js'
import {
  errorResponse, idKey, isRecord, isNotification, isRequest, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../../core/jsonrpc.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import { tracing, type ClientSpan, type TraceCarrier } from '../../telemetry/tracing.js'
import { auditChild, auditSoon, type AuditLog } from '../../telemetry/audit.js'
import { toolNameOf } from '../../auth/tool-policy.js'
import { errorTypeOf, type BackendErrorKind, type SessionMetrics } from '../../telemetry/metrics.js'
import { capabilityNeededBy } from '../../core/mcp.js'

/** What a relay needs of its backend connection (the supervisor's BackendSession). */
export interface BackendSessionHandle {
  send (message: JsonRpcMessage): Promise<void>
  /** Streamable HTTP: start or stop the backend's GET stream (only the lease holder listens). */
  setListening (listening: boolean, fromEventId?: string | null): void
}

/** What a relay needs of the replica around it. */
export interface RelayHost {
  /**
   * Appends a message to one of the session's client streams and wakes its holder. An answer on a
   * POST stream is written only if its request is still pending (exactly one answer per request).
   * `holder`: the replica expected to hold the stream (ClientStreams.append `expectedHolder`).
   */
  append (sid: string, streamId: string, message: JsonRpcMessage, holder?: string): Promise<unknown>
  /** Ends the session everywhere (its initialize failed). */
  endSession (sid: string, reason: string): Promise<void>
  /** A fresh opaque id for a server-to-client request: `s.<replica>.<seq>`. */
  nextServerRequestId (): string
}

export interface RelayOptions {
  sid: string
  server: string
  /** A legacy HTTP+SSE session: everything goes to its one stream. */
  legacy: boolean
  /** Streamable HTTP backend shared by replicas: ids pass through (see the header). */
  direct: boolean
  /** Whether this replica holds the owner lease (always, for routed sessions). */
  isOwner: boolean
  protocolVersion: string
  clientCapabilities: Record<string, unknown>
  /**
   * False for a connection the gateway initialises itself (a pool's, an aggregate member's): its
   * "client" is the gateway, so a consent the user must give stays the typed error, for the session
   * or request that holds the real client to render as that client takes it (core/consent-error.ts).
   */
  rendersConsent?: boolean
  requestTimeoutMs: number
  clientRequestTimeoutMs: number
  /** Tell the backend when a request times out (stdio; an HTTP connection cancels on its own). */
  cancelOnTimeout: boolean
  /** The backend's transport (span attributes, tracing on). */
  backendTransport: 'stdio' | 'streamable-http' | 'sse'
  host: RelayHost
  log: Logger
  /** Rewrites the result of a request before the client sees it (the tenant's tool policy). */
  filterResult?: (method: string, result: unknown) => unknown
  /** Requests (by stream id) that are the gateway's own bookkeeping, not counted as operations. */
  uncounted?: (streamId: string) => boolean
  /** Who the session belongs to, for the audit line of each tools/call (digests only). */
  principal?: { tenant: string | null, subject: string }
  /** Bound to the session's server and tenant. */
  metrics: SessionMetrics
  /** The session record's creation time (ms since the epoch), for the session duration. */
  createdAt: number
}

/** How a request ended, in the audit line of a tools/call. */
type Outcome = 'ok' | 'tool-error' | 'error' | 'timeout' | 'cancelled' | 'failed'

/** The audit outcome of a settled request: its answer, or the reason it has none. */
function outcomeOf (outcome: JsonRpcResponse | string): Outcome {
  if (typeof outcome !== 'string') {
    if ('error' in outcome) return 'error'
    return isRecord(outcome.result) && outcome.result.isError === true ? 'tool-error' : 'ok'
  }
  return outcome === 'timeout' || outcome === 'cancelled' ? outcome : 'failed'
}

interface InFlight {
  backendId: RequestId
  clientId: RequestId
  streamId: string
  method: string
  /** tools/call: the tool's name as the client sent it (a metrics label once the backend listed it; audited). */
  tool: string | undefined
  progressToken: RequestId | undefined
  timer: NodeJS.Timeout
  /** Tracing on: the CLIENT span toward the backend. */
  span?: ClientSpan
  /** performance.now() when the request reached this relay. */
  startedAt: number
  /** The replica that sent the request and holds its stream, when another one (Envelope 'deliver'). */
  holder: string | undefined
}

interface PendingClientRequest {
  backendId: RequestId
  streamId: string
  timer: NodeJS.Timeout
}

/** Session-level notifications always go to the GET stream, never a request's stream. */
const SESSION_LEVEL = /\/list_changed$|^notifications\/resources\/updated$/

/** JSON-mode request streams (`j…`) carry only responses: notifications go to the GET stream. */
export const isJsonStream = (streamId: string): boolean => streamId.startsWith('j')

export class Relay {
  readonly sid: string
  readonly server: string
  readonly legacy: boolean
  readonly direct: boolean
  readonly log: Logger
  readonly metrics: SessionMetrics
  readonly createdAt: number
  isOwner: boolean
  backend: BackendSessionHandle | null = null
  #protocolVersion: string
  #clientCapabilities: Record<string, unknown>
  readonly #rendersConsent: boolean
  readonly #options: RelayOptions
  #nextId = 1
  // The four maps below are made on first use: an idle session (most of them, most of the time)
  // holds none, a few hundred bytes each (docs/performance.md: heap per idle session).
  /** Keyed by idKey(backend id). */
  #inFlight: Map<string, InFlight> | undefined
  /** idKey(client id) -> idKey(backend id). */
  #byClientId: Map<string, string> | undefined
  /** idKey(progress token) -> stream id. */
  #byToken: Map<string, string> | undefined
  /** Server-to-client requests waiting for the client, by opaque id. */
  #pending: Map<string, PendingClientRequest> | undefined
  /** The session's tools/call audit lines, with who and where bound once; made on the first call. */
  #auditLog: AuditLog | undefined

  constructor (options: RelayOptions) {
    this.#options = options
    this.sid = options.sid
    this.server = options.server
    this.legacy = options.legacy
    this.direct = options.direct
    this.isOwner = options.isOwner
    this.log = options.log
    this.metrics = options.metrics
    this.createdAt = options.createdAt
    this.#protocolVersion = options.protocolVersion
    this.#clientCapabilities = options.clientCapabilities
    this.#rendersConsent = options.rendersConsent ?? true
  }

  /** Who the session belongs to (tenant and subject digest), for audit lines. */
  get principal (): { tenant: string | null, subject: string } {
    return this.#options.principal ?? { tenant: null, subject: 'anonymous' }
  }

  /** Requests of the client in flight to the backend. */
  get inFlightCount (): number { return this.#inFlight?.size ?? 0 }

  /** What the client negotiated, once known (a legacy session learns it after the stream opened). */
  setClient (protocolVersion: string | undefined, clientCapabilities: Record<string, unknown> | undefined): void {
    if (protocolVersion !== undefined) this.#protocolVersion = protocolVersion
    if (clientCapabilities !== undefined) this.#clientCapabilities = clientCapabilities
  }

  // ---- client -> backend -------------------------------------------------------------------

  /**
   * One message from the client; `streamId` is where a request's answer goes, `trace` the
   * request's SERVER span (tracing on), `holder` the replica holding that stream when it sent
   * the request here (its answer's wake then goes with the append).
   */
  deliver (message: JsonRpcMessage, streamId: string | null, trace?: TraceCarrier, holder?: string): void {
    if (isRequest(message)) {
      this.#forwardRequest(message, streamId ?? (this.legacy ? LEGACY_STREAM : GET_STREAM), trace, holder)
    } else if (isNotification(message)) {
      this.#forwardNotification(message)
    } else {
      this.#forwardClientResponse(message)
    }
  }

  /** Answers a request on its stream with a gateway error, without involving the backend. */
  refuse (request: JsonRpcRequest, streamId: string, err: unknown): void {
    const response = toJsonRpcError(this.#forClient(asGatewayError(err, this.server)), request.id)
    this.metrics.operation(request.method, toolOf(request), errorTypeOf(response), performance.now())
    this.#reply(streamId, response)
  }

  #forwardRequest (request: JsonRpcRequest, streamId: string, trace: TraceCarrier | undefined, holder: string | undefined): void {
    const startedAt = performance.now()
    if (request.method === 'ping') {
      // Answered here: a client's liveness check is about the gateway, not the backend behind it.
      this.metrics.operation('ping', undefined, '', startedAt)
      this.#reply(streamId, { jsonrpc: '2.0', id: request.id, result: {} })
      return
    }
    const backend = this.backend
    if (backend === null) {
      this.refuse(request, streamId, new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not connected'))
      return
    }
    const backendId: RequestId = this.direct ? request.id : this.#nextId++
    const key = idKey(backendId)
    const timeoutMs = this.#options.requestTimeoutMs
    const entry: InFlight = {
      backendId,
      clientId: request.id,
      streamId,
      method: request.method,
      tool: toolOf(request),
      progressToken: progressTokenOf(request),
      timer: setTimeout(() => { this.#onRequestTimeout(key, timeoutMs) }, timeoutMs),
      startedAt,
      holder
    }
    entry.timer.unref()
    ;(this.#inFlight ??= new Map()).set(key, entry)
    ;(this.#byClientId ??= new Map()).set(idKey(request.id), key)
    if (entry.progressToken !== undefined) (this.#byToken ??= new Map()).set(idKey(entry.progressToken), streamId)
    let outgoing: JsonRpcRequest = { ...request, id: backendId }
    if (tracing !== null) {
      ({ request: outgoing, span: entry.span } = tracing.backendRequest(outgoing, trace, { sid: this.sid, server: this.server, backendTransport: this.#options.backendTransport }))
    }
    backend.send(outgoing).catch(err => {
      const settled = this.#settle(key, 'send_failed')
      if (settled === undefined) return
      this.#fail(settled, asGatewayError(err, this.server), 'unavailable')
    })
  }

  /** Whether the client's request `id` is in flight on this relay (a direct session's cancellation goes where its request runs). */
  inFlight (id: RequestId): boolean {
    const key = this.#byClientId?.get(idKey(id))
    return key !== undefined && this.#inFlight?.has(key) === true
  }

  #forwardNotification (notification: JsonRpcNotification): void {
    let outgoing: JsonRpcNotification = notification
    if (notification.method === 'notifications/cancelled') {
      const params = asRecord(notification.params)
      const requestId = params.requestId
      if (typeof requestId !== 'string' && typeof requestId !== 'number') return
      const key = this.#byClientId?.get(idKey(requestId))
      const entry = key === undefined ? undefined : this.#inFlight?.get(key)
      if (key === undefined || entry === undefined) {
        // Direct sessions: the request may be in flight from another replica; the id is the
        // backend's id too, so the backend can still be told. Routed: unknown, which the MCP spec's "Cancellation" lets a receiver ignore.
        if (!this.direct) return
      } else {
        if (entry.method === 'initialize') return // initialize is never cancelled (MCP spec, "Cancellation")
        this.#settle(key, 'cancelled')
        // The request's stream is told it ends without an answer (cancelledAnswer): never sent,
        // but it settles the request, so its stream need not wait for one (MCP spec, "Cancellation": no answer follows).
        this.#reply(entry.streamId, cancelledAnswer(entry.clientId))
        outgoing = { ...notification, params: { ...params, requestId: entry.backendId } }
      }
    }
    this.backend?.send(outgoing).catch(err => this.log.warn({ err, method: notification.method }, 'notification not delivered to backend'))
  }

  #forwardClientResponse (response: JsonRpcResponse): void {
    const id = response.id
    if (typeof id !== 'string') return
    const pending = this.#pending?.get(id)
    if (pending === undefined) return // late or unknown answer: ignored
    this.#pending?.delete(id)
    clearTimeout(pending.timer)
    this.backend?.send({ ...response, id: pending.backendId } as JsonRpcResponse)
      .catch(err => this.log.warn({ err }, 'client answer not delivered to backend'))
  }

  // ---- backend -> client -------------------------------------------------------------------

  /** One message from the backend. */
  async fromBackend (message: JsonRpcMessage): Promise<void> {
    if (isRequest(message)) { await this.#fromBackendRequest(message); return }
    if (isNotification(message)) { await this.#fromBackendNotification(message); return }
    const id = message.id
    if (id === undefined || id === null) return
    const entry = this.#settle(idKey(id), message, false)
    if (entry === undefined) return // cancelled or timed out: a late answer is dropped
    let response: JsonRpcResponse = { ...message, id: entry.clientId }
    // Only the gateway marks a request cancelled: a backend's answer carrying the mark loses it.
    if (isCancelledAnswer(response)) delete (response as unknown as Record<string, unknown>)[CANCELLED_MEMBER]
    if ('error' in response && this.#rendersConsent) response = consentAnswerFor(response, { protocolVersion: this.#protocolVersion, capabilities: this.#clientCapabilities })
    const backendResult = 'result' in response ? response.result : undefined
    if (entry.method === 'initialize' && 'result' in response && isRecord(response.result)) {
      // The client's hop negotiated its own version: the gateway is a separate MCP peer on each side.
      response = { ...response, result: { ...response.result, protocolVersion: this.#protocolVersion } }
    }
    if (this.#options.filterResult !== undefined && 'result' in response) {
      // Most answers pass the filter unchanged: no copy for them.
      const result = this.#options.filterResult(entry.method, response.result)
      if (result !== response.result) response = { ...response, result }
    }
    try {
      await this.#options.host.append(this.sid, entry.streamId, response, entry.holder)
    } finally {
      // Recorded once the answer is on its way: none of this delays it.
      if (this.#options.uncounted?.(entry.streamId) !== true) this.metrics.operation(entry.method, entry.tool, errorTypeOf(message), entry.startedAt)
      if ('error' in message) this.metrics.backendError('error_response')
      else if (entry.method === 'tools/list') this.metrics.toolsListed(backendResult)
      if (entry.method === 'tools/call') this.#auditCall(entry, outcomeOf(message))
    }
    if (entry.method === 'initialize' && 'error' in response) {
      // A session whose initialize failed is of no use, and its child counts against maxSessions:
      // end it once the client has had a moment to read the error.
      setTimeout(() => { this.#options.host.endSession(this.sid, 'initialize failed').catch(() => {}) }, 1000).unref()
    }
  }

  async #fromBackendNotification (notification: JsonRpcNotification): Promise<void> {
    const params = asRecord(notification.params)
    if (notification.method === 'notifications/progress') {
      const token = params.progressToken
      const streamId = (typeof token === 'string' || typeof token === 'number') ? this.#byToken?.get(idKey(token)) : undefined
      if (streamId === undefined) return // progress for no active request: dropped (MCP spec, "Progress")
      await this.#options.host.append(this.sid, isJsonStream(streamId) ? GET_STREAM : streamId, notification)
      return
    }
    if (notification.method === 'notifications/cancelled') {
      // The backend withdrew one of its own requests to the client: use the client-facing id.
      const requestId = params.requestId
      for (const [opaque, pending] of this.#pending ?? []) {
        if (pending.backendId === requestId) {
          this.#pending?.delete(opaque)
          clearTimeout(pending.timer)
          await this.#options.host.append(this.sid, pending.streamId, { ...notification, params: { ...params, requestId: opaque } })
          return
        }
      }
      return
    }
    await this.#options.host.append(this.sid, this.#pickStream(notification.method), notification)
  }

  async #fromBackendRequest (request: JsonRpcRequest): Promise<void> {
    const backend = this.backend
    if (request.method === 'ping') {
      await backend?.send({ jsonrpc: '2.0', id: request.id, result: {} }).catch(() => {})
      return
    }
    const capability = capabilityNeededBy(request.method)
    if (capability !== undefined && this.#clientCapabilities[capability] === undefined) {
      // Never forward what the client did not declare (MCP spec, "Lifecycle": capability negotiation).
      await backend?.send(errorResponse(request.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${request.method} (no '${capability}' capability)`)).catch(() => {})
      return
    }
    const opaque = this.#options.host.nextServerRequestId()
    const streamId = this.#pickStream(request.method)
    const timeoutMs = this.#options.clientRequestTimeoutMs
    const timer = setTimeout(() => {
      if (this.#pending?.delete(opaque) !== true) return
      backend?.send(errorResponse(request.id, -32006, `Client did not answer ${request.method} within ${timeoutMs} ms`)).catch(() => {})
    }, timeoutMs)
    timer.unref()
    ;(this.#pending ??= new Map()).set(opaque, { backendId: request.id, streamId, timer })
    await this.#options.host.append(this.sid, streamId, { ...request, id: opaque })
  }

  /** Where a backend message of no request goes: the one in-flight request's stream, else the GET stream. */
  #pickStream (method: string): string {
    if (this.legacy) return LEGACY_STREAM
    if (!SESSION_LEVEL.test(method) && this.#inFlight?.size === 1) {
      const [only] = this.#inFlight?.values() ?? []
      if (only !== undefined && !isJsonStream(only.streamId) && only.method !== 'initialize') return only.streamId
    }
    return GET_STREAM
  }

  // ---- deadlines and failure ---------------------------------------------------------------

  #onRequestTimeout (key: string, timeoutMs: number): void {
    const entry = this.#settle(key, 'timeout')
    if (entry === undefined) return
    // Stop waiting and tell the backend (MCP spec, "Lifecycle": timeouts), except for initialize,
    // which is never cancelled, and HTTP backends, whose connection sends its own cancel on its deadline.
    if (entry.method !== 'initialize' && this.#options.cancelOnTimeout) {
      this.backend?.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: entry.backendId, reason: 'gateway timeout' } }).catch(() => {})
    }
    this.#fail(entry, new GW_ERR_BACKEND_TIMEOUT(this.server, timeoutMs), 'timeout')
  }

  /** A consent the user must give, as this client can take it (a URL elicitation where it declared one). */
  #forClient (err: GatewayError): GatewayError {
    if (!this.#rendersConsent) return err
    return consentErrorFor(err, { protocolVersion: this.#protocolVersion, capabilities: this.#clientCapabilities })
  }

  /** Answers a settled request with a gateway error, and records it. */
  #fail (entry: InFlight, err: GatewayError, kind: BackendErrorKind): void {
    const response = toJsonRpcError(this.#forClient(err), entry.clientId)
    this.metrics.operation(entry.method, entry.tool, errorTypeOf(response), entry.startedAt)
    this.metrics.backendError(kind)
    this.#reply(entry.streamId, response)
  }

  /**
   * Removes an in-flight request; returns it if it was still in flight. `outcome`: its answer, or
   * why none. `audit`: write a tools/call's audit line now (false: the caller writes it later).
   */
  #settle (key: string, outcome: JsonRpcResponse | string, audit = true): InFlight | undefined {
    const entry = this.#inFlight?.get(key)
    if (entry === undefined) return undefined
    entry.span?.end(outcome)
    this.#inFlight?.delete(key)
    this.#byClientId?.delete(idKey(entry.clientId))
    if (entry.progressToken !== undefined) this.#byToken?.delete(idKey(entry.progressToken))
    if (this.#inFlight?.size === 0) {
      // Nothing in flight: an idle session holds no maps (they are made again by the next request).
      this.#inFlight = undefined
      this.#byClientId = undefined
      this.#byToken = undefined
    }
    clearTimeout(entry.timer)
    if (audit && entry.method === 'tools/call') this.#auditCall(entry, outcomeOf(outcome))
    return entry
  }

  /** The audit line of a tools/call (docs/authentication.md, "Audit"): who, which tool, how it ended, how long it took. */
  #auditCall (entry: InFlight, outcome: Outcome): void {
    this.#auditLog ??= auditChild(this.log, 'tools.call', { ...this.principal, server: this.server })
    auditSoon(this.#auditLog, 'tools.call', {
      tool: (entry.tool ?? '').slice(0, 128),
      outcome,
      ms: Math.round(performance.now() - entry.startedAt)
    }, true)
  }

  /** Every request in flight gets a JSON-RPC error at once (backend died, shutdown, session end). */
  failAll (err: GatewayError): void {
    const kind: BackendErrorKind = err.code === 'GW_ERR_SHUTTING_DOWN' ? 'shutdown' : 'unavailable'
    for (const key of [...this.#inFlight?.keys() ?? []]) {
      const entry = this.#settle(key, err.code)
      if (entry !== undefined) this.#fail(entry, err, kind)
    }
    for (const pending of this.#pending?.values() ?? []) clearTimeout(pending.timer)
    this.#pending?.clear()
  }

  #reply (streamId: string, message: JsonRpcMessage): void {
    this.#options.host.append(this.sid, streamId, message).catch(err => this.log.error({ err }, 'reply not appended'))
  }
}

/** The tool a tools/call names (a metrics label once the backend listed it). */
function toolOf (request: JsonRpcRequest): string | undefined {
  return request.method === 'tools/call' ? toolNameOf(request.params) ?? '' : undefined
}

function asRecord (value: unknown): Record<string, unknown> {
  return isRecord(value) ? value : {}
}


/** A client's declared capabilities, from its initialize params. */
export function capabilitiesOf (initializeParams: Record<string, unknown> | null | undefined): Record<string, unknown> {
  return asRecord(initializeParams?.capabilities)
}

export function asGatewayError (err: unknown, server: string): GatewayError {
  return isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(server, err instanceof Error ? err.message : String(err), { cause: err })
}
