// A 2025-era client session in front of a modern (2026-07-28) HTTP backend (docs/behaviour.md,
// "2025 clients in front of a modern-only server"; docs/architecture.md). The client's session is
// the gateway's: the backend keeps none. This connection speaks sessions toward the relay and
// stateless requests upstream:
//
// - initialize is answered from the backend's `server/discover` (its capabilities, serverInfo and
//   instructions); notifications/initialized, logging/setLevel and resources/(un)subscribe are
//   kept here and shape the envelope and the listen filter; ping never gets here (the relay).
// - Every other request goes upstream with a `_meta` envelope built from the client's initialize
//   (capabilities, client info) and its log level, and the standard headers. Its notifications
//   (progress, logs) come back on the same response and reach the relay as the backend's.
// - An `input_required` result is answered inside the open request: each input request becomes a
//   server-to-client request (ids `gw-mrtr-<n>`, which the relay hands to the client like any
//   backend request, capability checks included); with every answer in, the request is sent again
//   with `inputResponses` and the echoed `requestState`, round after round (at most MAX_ROUNDS).
// - The client's GET stream and resource subscriptions map onto one upstream `subscriptions/listen`
//   (only on the replica holding the session's lease, like a backend GET stream), re-opened with a
//   new filter when the subscriptions change.
// - Each client request has the deadline every backend gives one (requestTimeoutMs), its rounds
//   included: when it passes, the upstream request is closed and the round's questions are
//   withdrawn from the client (notifications/cancelled). In a session the relay's own deadline
//   (same length, started first) answers the client with -32006 and this one's answer is dropped
//   as late; the -32006 here is for a connection used without a relay. Exactly one answer each.
// - notifications/cancelled from the client ends its request the same way, without an answer
//   (closing the upstream request is the modern cancellation).
// - A tools/call carries its `x-mcp-header` arguments as Mcp-Param-* headers (mcp-param-headers.ts),
//   from the marks tools/list showed (read once if the client never listed); a tool with invalid
//   marks is dropped from tools/list.
import { randomUUID } from 'node:crypto'
import type { Logger } from 'pino'
import { childLogger } from '../telemetry/logger.js'
import type { Dispatcher } from 'undici'
import type { HttpServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, toJsonRpcError } from '../core/errors.js'
import {
  classify, errorResponse, idKey, isNotification, isRecord, isRequest, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../core/jsonrpc.js'
import type { BackendHandlers, BackendOpenOptions } from './backend.js'
import { upstreamBaseHeaders, type HttpBackendConnection } from './http-base.js'
import { describe, MAX_BODY_BYTES, mediaType, pumpSse, readText } from './http-io.js'
import { relayModern } from './modern-http.js'
import { withCallerCredential } from './caller-credential.js'
import type { CallerCredential } from '../credentials/types.js'
import {
  LATEST_VERSION, MODERN_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION, META_SERVER_INFO, META_SUBSCRIPTION_ID
} from '../core/protocol-version.js'
import { encodeHeaderValue, paramHeaders, scanHeaderDeclarations, type HeaderDeclaration } from './mcp-param-headers.js'

/** input_required rounds one request may take before the gateway gives up on it. */
const MAX_ROUNDS = 10

/** One client request in flight: its deadline, and the abort that releases what it holds. */
interface Call {
  abort: AbortController
  timer: NodeJS.Timeout
}

export class ModernSessionBackend implements HttpBackendConnection {
  readonly #server: string
  readonly #config: HttpServerConfig
  readonly #handlers: BackendHandlers
  readonly #log: Logger
  readonly #headers: Record<string, string>
  readonly #credential: CallerCredential | undefined
  #initParams: Record<string, unknown> | undefined
  #logLevel: string | undefined
  readonly #subscriptions = new Set<string>()
  #capabilities: Record<string, unknown> = {}
  #closed = false
  #listening: boolean
  #listen: AbortController | null = null
  /** Client requests in flight, by the relay's request id (as a string key). */
  readonly #inFlight = new Map<string, Call>()
  /** Server-to-client requests of the rounds in progress, by their id. */
  readonly #waiting = new Map<string, (answer: JsonRpcResponse) => void>()
  #seq = 0
  /** The `x-mcp-header` marks of each listed tool (M-17). */
  readonly #toolHeaders = new Map<string, HeaderDeclaration[]>()
  #toolsKnown = false

  constructor (options: BackendOpenOptions, config: HttpServerConfig) {
    this.#server = options.server
    this.#config = config
    this.#handlers = options.handlers
    this.#log = childLogger(options.log, { backend: options.server, transport: 'modern' })
    this.#headers = upstreamBaseHeaders(config, options.upstream, options.forwardedHeaders ?? {})
    this.#credential = options.credential
    // Another replica's session (failover or a direct session): the client's initialize is known.
    this.#initParams = options.initializeParams
    this.#listening = options.listen ?? true
  }

  /** One request upstream, with the session owner's credential when the server has a source. */
  async #relay (headers: Record<string, string>, body: string, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
    const send = async (): Promise<Dispatcher.ResponseData> => await relayModern(this.#server, this.#config, headers, body, signal)
    return this.#credential === undefined ? await send() : await withCallerCredential(this.#server, this.#credential, headers, signal, send)
  }

  get listening (): boolean { return this.#listening }
  get backendSessionId (): string | null { return null }

  startListening (): void {
    this.#listening = true
    if (this.#initParams !== undefined) this.#openListen()
  }

  stopListening (): void {
    this.#listening = false
    this.#listen?.abort()
    this.#listen = null
  }

  async send (message: JsonRpcMessage): Promise<void> {
    if (this.#closed) throw new GW_ERR_BACKEND_UNAVAILABLE(this.#server, 'the connection is closed')
    if (isRequest(message)) { this.#request(message); return }
    if (isNotification(message)) {
      if (message.method === 'notifications/initialized' && this.#listening) this.#openListen()
      if (message.method === 'notifications/cancelled' && isRecord(message.params)) {
        const id = message.params.requestId
        if (typeof id === 'string' || typeof id === 'number') this.#settle(String(id))
      }
      return
    }
    // The client's answer to one of a round's server-to-client requests.
    const id = message.id
    const resolve = typeof id === 'string' ? this.#waiting.get(id) : undefined
    if (typeof id === 'string' && resolve !== undefined) {
      this.#waiting.delete(id)
      resolve(message)
    }
  }

  /** Nothing upstream outlives this connection: the backend keeps no session. */
  async detach (): Promise<void> {
    await this.close()
  }

  async close (): Promise<void> {
    this.#closed = true
    this.#listen?.abort()
    for (const key of [...this.#inFlight.keys()]) this.#settle(key)
  }

  #answer (message: JsonRpcMessage): void {
    if (!this.#closed) this.#handlers.onMessage(message)
  }

  #request (request: JsonRpcRequest): void {
    const params = isRecord(request.params) ? request.params : {}
    switch (request.method) {
      case 'initialize':
        this.#initParams = params
        this.#run(request.id, async signal => await this.#initialize(request.id, signal))
        return
      case 'logging/setLevel':
        if (typeof params.level === 'string') this.#logLevel = params.level
        this.#answer({ jsonrpc: '2.0', id: request.id, result: {} })
        return
      case 'resources/subscribe':
      case 'resources/unsubscribe':
        if (typeof params.uri === 'string') {
          if (request.method === 'resources/subscribe') this.#subscriptions.add(params.uri)
          else this.#subscriptions.delete(params.uri)
          if (this.#listening) this.#openListen()
        }
        this.#answer({ jsonrpc: '2.0', id: request.id, result: {} })
        return
    }
    this.#run(request.id, async signal => await this.#call(request, signal))
  }

  /**
   * Runs one client request under its deadline (requestTimeoutMs, as on every backend): when it
   * passes first, the answer is -32006 and the request is settled, which releases what it holds.
   * Exactly one answer, the work's or the deadline's; a request the client cancelled gets none.
   */
  #run (id: RequestId, work: (signal: AbortSignal) => Promise<JsonRpcResponse>): void {
    const key = idKey(id)
    const timeoutMs = this.#config.requestTimeoutMs
    if (this.#settle(key)) this.#log.warn({ id }, 'request id reused while in flight')
    const call: Call = {
      abort: new AbortController(),
      timer: setTimeout(() => {
        if (!this.#settle(key, call)) return
        this.#log.warn({ id, timeoutMs }, 'backend request timed out')
        this.#answer(toJsonRpcError(new GW_ERR_BACKEND_TIMEOUT(this.#server, timeoutMs), id))
      }, timeoutMs).unref()
    }
    this.#inFlight.set(key, call)
    work(call.abort.signal).catch(err => this.#failure(id, err)).then(answer => {
      if (this.#settle(key, call)) this.#answer(answer)
    }, () => {})
  }

  /**
   * Ends a request in flight (the one given, else whichever has the key): its deadline cleared, its
   * signal aborted, which closes its upstream exchange (the undici body) and withdraws its round.
   * False when it had already ended.
   */
  #settle (key: string, call = this.#inFlight.get(key)): boolean {
    if (call === undefined || this.#inFlight.get(key) !== call) return false
    this.#inFlight.delete(key)
    clearTimeout(call.timer)
    call.abort.abort()
    return true
  }

  /** The client's initialize, answered from the backend's server/discover. */
  async #initialize (id: RequestId, signal: AbortSignal): Promise<JsonRpcResponse> {
    const result = await this.#exchange(id, 'server/discover', {}, () => {}, signal)
    if ('error' in result) return result
    const discovered = isRecord(result.result) ? result.result : {}
    this.#capabilities = isRecord(discovered.capabilities) ? discovered.capabilities : {}
    const meta = isRecord(discovered._meta) ? discovered._meta : {}
    const serverInfo = isRecord(meta[META_SERVER_INFO]) ? meta[META_SERVER_INFO] : { name: this.#server, version: '0' }
    const capabilities: Record<string, unknown> = { ...this.#capabilities }
    // Session features the gateway provides on top of the backend: log level and subscriptions.
    capabilities.logging = {}
    if (isRecord(capabilities.resources)) capabilities.resources = { ...capabilities.resources, subscribe: true }
    const version = typeof this.#initParams?.protocolVersion === 'string' ? this.#initParams.protocolVersion : LATEST_VERSION
    return {
      jsonrpc: '2.0',
      id,
      result: { protocolVersion: version, capabilities, serverInfo, ...(typeof discovered.instructions === 'string' ? { instructions: discovered.instructions } : {}) }
    }
  }

  /** One client request: upstream with the envelope, input_required rounds answered by the client. */
  async #call (request: JsonRpcRequest, signal: AbortSignal): Promise<JsonRpcResponse> {
    const base = isRecord(request.params) ? { ...request.params } : {}
    let extra: Record<string, unknown> = {}
    // A tools/call mirrors marked arguments as Mcp-Param-* headers: the marks come from tools/list.
    if (request.method === 'tools/call' && !this.#toolsKnown) await this.#learnTools(signal)
    for (let round = 0; round <= MAX_ROUNDS; round++) {
      const answer = await this.#exchange(request.id, request.method, { ...base, ...extra }, m => { this.#answer(m) }, signal)
      if ('error' in answer || !isRecord(answer.result) || answer.result.resultType !== 'input_required') {
        return request.method === 'tools/list' ? this.#keepToolHeaders(answer) : answer
      }
      const inputRequests = isRecord(answer.result.inputRequests) ? answer.result.inputRequests : {}
      const responses = await Promise.all(Object.entries(inputRequests).map(async ([key, ask]) => [key, await this.#ask(key, ask, signal)] as const))
      const refused = responses.find(([, r]) => 'error' in r)?.[1]
      if (refused !== undefined && 'error' in refused) {
        // The client could not answer (an undeclared capability, or its own error): the call ends.
        return errorResponse(request.id, refused.error.code, `The backend needed input the client did not give: ${refused.error.message}`, { source: 'gateway' })
      }
      extra = {
        inputResponses: Object.fromEntries(responses.map(([key, r]) => [key, 'result' in r ? r.result : undefined])),
        ...(typeof answer.result.requestState === 'string' ? { requestState: answer.result.requestState } : {})
      }
    }
    return toJsonRpcError(new GW_ERR_BACKEND_UNAVAILABLE(this.#server, `more than ${MAX_ROUNDS} input_required rounds`), request.id)
  }

  /**
   * A tools/list answer: each tool's `x-mcp-header` marks are kept for its calls, and a tool whose
   * marks are invalid is dropped (M-17; its calls could never carry valid headers).
   */
  #keepToolHeaders (answer: JsonRpcResponse): JsonRpcResponse {
    if (!('result' in answer) || !isRecord(answer.result) || !Array.isArray(answer.result.tools)) return answer
    this.#toolsKnown = true
    const tools = answer.result.tools.filter(tool => {
      if (!isRecord(tool) || typeof tool.name !== 'string') return false
      const scan = scanHeaderDeclarations(tool.inputSchema)
      if (scan.valid) {
        this.#toolHeaders.set(tool.name, scan.declarations)
        return true
      }
      this.#log.warn({ tool: tool.name.slice(0, 128), reason: scan.reason }, 'tool dropped from tools/list: invalid x-mcp-header')
      return false
    })
    return { ...answer, result: { ...answer.result, tools } }
  }

  /** Reads tools/list once (every page), so a tools/call knows its tool's header marks. */
  async #learnTools (signal: AbortSignal): Promise<void> {
    let cursor: unknown
    for (let page = 0; page < 20; page++) {
      const answer = await this.#exchange(`gw-tools-${++this.#seq}`, 'tools/list', cursor === undefined ? {} : { cursor }, () => {}, signal)
      this.#keepToolHeaders(answer)
      cursor = 'result' in answer && isRecord(answer.result) ? answer.result.nextCursor : undefined
      if (typeof cursor !== 'string') break
    }
    this.#toolsKnown = true
  }

  /**
   * One input request of a round, as a server-to-client request; the client's answer. When the
   * request it belongs to ends first (`signal`), the question is withdrawn: forgotten here, and the
   * client told with notifications/cancelled (the relay forgets it too), so a late answer goes nowhere.
   */
  async #ask (key: string, ask: unknown, signal: AbortSignal): Promise<JsonRpcResponse> {
    const id = `gw-mrtr-${++this.#seq}`
    if (!isRecord(ask) || typeof ask.method !== 'string') return errorResponse(id, -32602, `input request '${key.slice(0, 64)}' is malformed`)
    signal.throwIfAborted()
    const answered = new Promise<JsonRpcResponse>((resolve, reject) => {
      const withdraw = (): void => {
        this.#waiting.delete(id)
        this.#answer({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: id, reason: 'the request it was asked for has ended' } })
        reject(signal.reason)
      }
      signal.addEventListener('abort', withdraw, { once: true })
      this.#waiting.set(id, answer => {
        signal.removeEventListener('abort', withdraw)
        resolve(answer)
      })
    })
    this.#answer({ jsonrpc: '2.0', id, method: ask.method, ...(isRecord(ask.params) ? { params: ask.params } : {}) })
    return await answered
  }

  /**
   * One stateless exchange upstream: the request with this session's envelope; notifications on
   * the way go to `onNotification`; resolves with the final response (id = the relay's). Aborting
   * `signal` closes the upstream request, whose body is then released.
   */
  async #exchange (id: RequestId, method: string, params: Record<string, unknown>, onNotification: (m: JsonRpcMessage) => void, signal: AbortSignal): Promise<JsonRpcResponse> {
    const meta = isRecord(params._meta) ? params._meta : {}
    const body = { jsonrpc: '2.0', id, method, params: { ...params, _meta: { ...meta, ...this.#envelope() } } }
    const name = method === 'resources/read' ? params.uri : (method === 'tools/call' || method === 'prompts/get') ? params.name : undefined
    const headers = {
      ...this.#headers,
      'mcp-protocol-version': MODERN_VERSION,
      'mcp-method': method,
      ...(typeof name === 'string' ? { 'mcp-name': encodeHeaderValue(name) } : {}),
      ...(method === 'tools/call' && typeof name === 'string' ? paramHeaders(this.#toolHeaders.get(name) ?? [], params.arguments) : {})
    }
    const res = await this.#relay(headers, JSON.stringify(body), signal)
    return await this.#readAnswer(res, id, onNotification)
  }

  async #readAnswer (res: Dispatcher.ResponseData, id: RequestId, onNotification: (m: JsonRpcMessage) => void): Promise<JsonRpcResponse> {
    let final: JsonRpcResponse | undefined
    const take = (value: unknown): void => {
      const c = classify(value)
      if (c.kind === 'response') final = c.message.id === id ? c.message : { ...c.message, id } as JsonRpcResponse
      else if (c.kind === 'notification') onNotification(c.message)
    }
    if (mediaType(res.headers) === 'text/event-stream') {
      // The final response ends the exchange (H-26-5): a backend that keeps its stream
      // open after it is not waited for, its body is released.
      try {
        await pumpSse(res.body, event => {
          if (final !== undefined) return
          try { take(JSON.parse(event.data)) } catch {}
          if (final !== undefined) res.body.destroy()
        }, () => {})
      } catch (err) {
        if (final === undefined) throw err
      }
    } else {
      take(JSON.parse(await readText(res.body, MAX_BODY_BYTES)))
    }
    if (final === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(this.#server, 'the backend ended its response without an answer')
    return final
  }

  #envelope (): Record<string, unknown> {
    const params = this.#initParams ?? {}
    return {
      [META_PROTOCOL_VERSION]: MODERN_VERSION,
      [META_CLIENT_CAPABILITIES]: isRecord(params.capabilities) ? params.capabilities : {},
      ...(isRecord(params.clientInfo) ? { [META_CLIENT_INFO]: params.clientInfo } : {}),
      ...(this.#logLevel !== undefined ? { [META_LOG_LEVEL]: this.#logLevel } : {})
    }
  }

  /** The client's GET stream and subscriptions as one upstream listen stream (re-opened on change). */
  #openListen (): void {
    this.#listen?.abort()
    if (this.#closed) return
    const notifications: Record<string, unknown> = {}
    for (const [field, capability] of [['toolsListChanged', 'tools'], ['promptsListChanged', 'prompts'], ['resourcesListChanged', 'resources']] as const) {
      const c = this.#capabilities[capability]
      if (isRecord(c) && c.listChanged === true) notifications[field] = true
    }
    if (this.#subscriptions.size > 0) notifications.resourceSubscriptions = [...this.#subscriptions]
    if (Object.keys(notifications).length === 0) return
    const abort = new AbortController()
    this.#listen = abort
    const id = `gw-listen-${randomUUID()}`
    const body = JSON.stringify({ jsonrpc: '2.0', id, method: 'subscriptions/listen', params: { notifications, _meta: this.#envelope() } })
    void (async () => {
      const res = await this.#relay({ ...this.#headers, 'mcp-protocol-version': MODERN_VERSION, 'mcp-method': 'subscriptions/listen' }, body, abort.signal)
      await pumpSse(res.body, event => {
        try {
          const c = classify(JSON.parse(event.data))
          if (c.kind === 'notification' && c.message.method !== 'notifications/subscriptions/acknowledged') {
            const params = isRecord(c.message.params) ? { ...c.message.params } : {}
            if (isRecord(params._meta)) {
              const { [META_SUBSCRIPTION_ID]: _, ...meta } = params._meta
              params._meta = meta
            }
            this.#answer({ ...c.message, params })
          }
        } catch {}
      }, () => {})
    })().catch(err => {
      if (!abort.signal.aborted) this.#log.warn({ err: describe(err) }, 'upstream listen stream failed')
    })
  }

  #failure (id: RequestId, err: unknown): JsonRpcResponse {
    return toJsonRpcError(isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(this.#server, describe(err)), id)
  }
}
