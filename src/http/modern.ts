// The 2026-07-28 (modern, stateless) face on /mcp/<server> (SPEC.md sections 4 and 5.7): a POST
// that http/streamable.ts classifies as modern (modern-rules.ts) is served here, with no session.
//
// In front of a legacy backend (every backend today) a request runs on a pooled, initialised
// backend connection (routing/pool.ts) and its answer is made a modern result (resultType,
// caching hints, serverInfo). `server/discover` is answered from what the pool learned when it
// initialised the backend. Progress reaches the request that carries the token; backend log lines
// only a request that asked for them (`logLevel`), at or above that level. A backend's mid-call
// sampling, elicitation or roots request becomes an `input_required` result (for capabilities the
// request declared; else -32021), the call is parked (routing/mrtr.ts) and the retry's
// `inputResponses` answer the backend, round after round. Closing the response cancels the call
// upstream (M-11).
//
// The response is lazy: JSON when the answer is the first thing to send (one write, and an HTTP
// status for the spec's 400/404 errors), SSE as soon as a notification comes first.
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Logger } from 'pino'
import type { ServerResponse } from 'node:http'
import type { ToolPolicyLookup } from '../auth/tool-policy.js'
import { filterToolsList, toolNameOf } from '../auth/tool-policy.js'
import {
  GW_ERR_BACKEND_LOST, GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_INVALID_PARAMS, GW_ERR_RATE_LIMITED, GW_ERR_MISSING_CAPABILITY, GW_ERR_INTERNAL, GW_ERR_UNKNOWN_TOOL,
  isGatewayError, toJsonRpcError, withData, type GatewayError
} from '../core/errors.js'
import {
  isNotification, isRequest, isResponse, type JsonRpcErrorObject, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../core/jsonrpc.js'
import type { ConnectionPool, PoolSink, PooledCall } from '../routing/pool.js'
import type { InputRequest, ParkedCall, ParkedCalls } from '../routing/mrtr.js'
import { audit } from '../telemetry/audit.js'
import type { GatewayMetrics } from '../telemetry/metrics.js'
import type { Envelope } from '../state/bus.js'
import {
  checkModernNotification, checkModernRequest, completeResult, envelopeOf, legacyParams, logPasses, META_SUBSCRIPTION_ID, MODERN_VERSIONS,
  trimOws, type RequestEnvelope, type ModernHeaders
} from './modern-rules.js'
import { clientHeaders, header, replyHeaders } from './request.js'
import type { ServerSource } from '../config/live.js'
import type { HttpServerConfig } from '../config/schema.js'
import type { UpstreamLookup } from '../routing/ownership.js'
import { eraOf, modernBaseHeaders, modernRequestHeaders, relayModern, type BackendEra } from '../backends/modern-http.js'
import { MAX_BODY_BYTES, readText } from '../backends/http-io.js'

/** Methods that may answer with `input_required` (M-8); elsewhere a backend's request is refused. */
const MRTR_METHODS = new Set(['tools/call', 'prompts/get', 'resources/read'])
/** Server-to-client requests and the client capability each needs. */
const NEEDS_CAPABILITY: Record<string, string> = { 'sampling/createMessage': 'sampling', 'elicitation/create': 'elicitation', 'roots/list': 'roots' }
/** Server requests that arrive this close together are handed to the client in one round. */
const ROUND_GATHER_MS = 15
/** Where a legacy backend may name the key of its ask (see inputRequestOf). */
const INPUT_KEY_META = 'mcp-gateway/inputKey'
const KEEPALIVE_MS = 15_000
/** How often a forwarded retry checks that the replica holding its call is alive. */
const FORWARD_WATCH_MS = 1000
/** Calls one principal may have parked at once (each holds a backend connection). */
export const MAX_PARKED_PER_PRINCIPAL = 32
const PARKED_RETRY_AFTER_S = 10
/** Most resources one listen stream may subscribe to. */
const MAX_LISTEN_URIS = 100

/** What the face needs of the other replicas: an MRTR retry goes to the replica holding its call. */
export interface Peers {
  replicaId: string
  send (replica: string, envelope: Envelope): Promise<void>
  isAlive (replica: string): Promise<boolean>
}

export interface ModernFaceOptions {
  /** The servers as configured now (live reload). */
  live: ServerSource
  /** A tenant's upstream headers for a server (modern backends get them with each request). */
  upstream?: UpstreamLookup
  pool: ConnectionPool
  parked: ParkedCalls
  metrics: GatewayMetrics
  peers: Peers
  toolPolicy?: ToolPolicyLookup
  /** How long a forwarded retry waits for the replica holding its call to answer. */
  forwardTimeoutMs: number
  log: Logger
}

/** Where an exchange writes: the client's HTTP response here, or another replica's (RemoteResponse). */
interface ResponseSink {
  readonly done: boolean
  onClientGone: (() => void) | undefined
  notify (message: JsonRpcMessage): void
  finish (message: JsonRpcMessage, status?: number): void
  fail (err: GatewayError, id: RequestId | null): void
}

export function modernHeaders (req: FastifyRequest): ModernHeaders {
  return {
    protocolVersion: trimOws(header(req, 'mcp-protocol-version')),
    method: trimOws(header(req, 'mcp-method')),
    name: trimOws(header(req, 'mcp-name'))
  }
}

/**
 * One modern response: JSON until something other than the answer must be sent, then SSE. Ends
 * exactly once; after the client went away nothing is written.
 */
class ModernResponse implements ResponseSink {
  readonly #res: ServerResponse
  readonly #headers: Record<string, string>
  #sse = false
  #done = false
  #keepAlive: NodeJS.Timeout | undefined
  onClientGone: (() => void) | undefined

  constructor (res: ServerResponse, headers: Record<string, string>) {
    this.#res = res
    this.#headers = headers
    const socket = res.socket
    // The client may have gone while the request waited for a backend connection.
    if (socket === null || socket.destroyed) this.#done = true
    res.on('close', () => {
      // A client that went away mid-response can leave its socket open and the request unfinished
      // in the server's eyes, which would hold a shutdown for a whole keep-alive timeout.
      if (!res.writableFinished) socket?.destroy()
      if (this.#done) return
      this.#done = true
      clearInterval(this.#keepAlive)
      this.onClientGone?.()
    })
  }

  get done (): boolean { return this.#done }
  get streaming (): boolean { return this.#sse }

  notify (message: JsonRpcMessage): void {
    if (this.#done) return
    if (!this.#sse) {
      this.#sse = true
      this.#res.writeHead(200, { ...this.#headers, 'content-type': 'text/event-stream', 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' })
      this.#keepAlive = setInterval(() => { if (!this.#done) this.#res.write(': keepalive\n\n') }, KEEPALIVE_MS)
      this.#keepAlive.unref()
    }
    this.#res.write(`event: message\ndata: ${JSON.stringify(message)}\n\n`)
  }

  /** The final message; `status` (and `extra` headers) apply only while nothing was streamed yet. */
  finish (message: JsonRpcMessage, status = 200, extra: Record<string, string> = {}): void {
    if (this.#done) return
    this.#done = true
    clearInterval(this.#keepAlive)
    const text = JSON.stringify(message)
    if (this.#sse) {
      this.#res.end(`event: message\ndata: ${text}\n\n`)
      return
    }
    this.#res.writeHead(status, { ...this.#headers, ...extra, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) })
    this.#res.end(text)
  }

  fail (err: GatewayError, id: RequestId | null): void {
    this.finish(toJsonRpcError(err, id), err.statusCode ?? 500, err.retryAfter !== undefined ? { 'retry-after': String(err.retryAfter) } : {})
  }
}

/** A response on another replica: what the exchange writes goes there over the bus (mrtr-out). */
class RemoteResponse implements ResponseSink {
  readonly #peers: Peers
  readonly #to: string
  readonly #ticket: string
  #done = false
  onClientGone: (() => void) | undefined

  constructor (peers: Peers, to: string, ticket: string) {
    this.#peers = peers
    this.#to = to
    this.#ticket = ticket
  }

  get done (): boolean { return this.#done }

  /** The client at the other replica went away (mrtr-cancel). */
  clientGone (): void {
    if (this.#done) return
    this.#done = true
    this.onClientGone?.()
  }

  notify (message: JsonRpcMessage): void {
    if (!this.#done) this.#send('notify', message)
  }

  finish (message: JsonRpcMessage, status = 200): void {
    if (this.#done) return
    this.#done = true
    this.#send('finish', message, status)
  }

  fail (err: GatewayError, id: RequestId | null): void {
    this.finish(toJsonRpcError(err, id), err.statusCode ?? 500)
  }

  #send (op: 'notify' | 'finish', message: JsonRpcMessage, status?: number): void {
    this.#peers.send(this.#to, { kind: 'mrtr-out', ticket: this.#ticket, op, message, ...(status !== undefined ? { status } : {}) }).catch(() => {})
  }
}

/** A retry forwarded to the replica holding its call, waiting here for what comes back. */
interface Forward {
  out: ModernResponse
  replica: string
  timer: NodeJS.Timeout
}

function isRecord (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** The notification kinds a listen filter can ask for, and the backend capability each needs. */
const LIST_CHANGED: Record<string, { method: string, capability: string }> = {
  toolsListChanged: { method: 'notifications/tools/list_changed', capability: 'tools' },
  promptsListChanged: { method: 'notifications/prompts/list_changed', capability: 'prompts' },
  resourcesListChanged: { method: 'notifications/resources/list_changed', capability: 'resources' }
}

/** One open `subscriptions/listen` stream (M-9). */
interface Listener {
  /** Who opened it, and the id of its listen request: a client's notifications/cancelled names it. */
  principal: string
  id: RequestId
  /** The notification methods it asked for and the backend can send. */
  methods: Set<string>
  /** The resources whose notifications/resources/updated it asked for. */
  uris: Set<string>
  send: (message: JsonRpcMessage) => void
  /** Graceful end (shutdown): a complete result tagged with the subscription id, then the end. */
  end: () => void
  /** The client cancelled it: the stream just ends. */
  cancel: () => void
}

export class ModernFace {
  readonly #o: ModernFaceOptions
  /** Listen streams by (server, tenant). */
  readonly #listeners = new Map<string, Set<Listener>>()
  /** Retries forwarded from here, by ticket. */
  readonly #forwards = new Map<string, Forward>()
  /** Calls resumed here for a retry that landed on another replica, by ticket. */
  readonly #remote = new Map<string, RemoteResponse>()
  #seq = 0

  constructor (options: ModernFaceOptions) {
    this.#o = options
  }

  async #eraOf (server: string, config: HttpServerConfig, req: FastifyRequest): Promise<BackendEra> {
    return await eraOf(server, config, modernBaseHeaders(config, this.#o.upstream?.(req.principal.tenant, server), clientHeaders(req)))
  }

  /**
   * A modern backend: the request goes upstream as it is and its response streams back (JSON or
   * SSE, input_required and listen streams included). The client closing the response aborts the
   * upstream request, which is the cancellation (M-11). Under a tool policy a tools/list answer is
   * read whole and filtered.
   */
  async #relay (req: FastifyRequest, reply: FastifyReply, server: string, config: HttpServerConfig, message: JsonRpcRequest): Promise<void> {
    const fromClient = clientHeaders(req)
    const headers = { ...modernBaseHeaders(config, this.#o.upstream?.(req.principal.tenant, server), fromClient), ...modernRequestHeaders(fromClient) }
    const abort = new AbortController()
    const res = reply.raw
    res.on('close', () => { if (!res.writableFinished) abort.abort() })
    const upstream = await relayModern(server, config, headers, JSON.stringify(message), abort.signal)
    const contentType = String(upstream.headers['content-type'] ?? 'application/json')
    const policy = message.method === 'tools/list' ? this.#o.toolPolicy?.(req.principal.tenant, server) ?? null : null
    if (policy !== null) {
      const text = await readText(upstream.body, MAX_BODY_BYTES)
      const answer = contentType.includes('text/event-stream')
        ? text.split('\n').filter(l => l.startsWith('data:')).map(l => l.slice(5).trim()).reverse().find(l => l.includes('"result"') || l.includes('"error"'))
        : text
      const parsed = answer === undefined ? null : JSON.parse(answer) as Record<string, unknown>
      if (parsed === null) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'no answer to tools/list')
      if (isRecord(parsed.result)) parsed.result = filterToolsList(parsed.result, policy)
      reply.code(upstream.statusCode).type('application/json').send(parsed)
      return
    }
    reply.hijack()
    const sse = contentType.includes('text/event-stream')
    res.writeHead(upstream.statusCode, { ...replyHeaders(reply), 'content-type': contentType, ...(sse ? { 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' } : {}) })
    upstream.body.on('error', () => { res.destroy() })
    upstream.body.pipe(res)
  }

  /** The face's bus envelopes (router.onModernEnvelope). */
  onEnvelope (envelope: Envelope): void {
    switch (envelope.kind) {
      case 'mrtr-resume':
        this.#resumeForwarded(envelope.from, envelope.ticket, envelope.principal, envelope.request)
        return
      case 'mrtr-out': {
        const forward = this.#forwards.get(envelope.ticket)
        if (forward === undefined) return
        if (envelope.op === 'notify') {
          forward.out.notify(envelope.message)
          return
        }
        this.#forwards.delete(envelope.ticket)
        clearInterval(forward.timer)
        forward.out.finish(envelope.message, envelope.status)
        return
      }
      case 'mrtr-cancel': {
        const remote = this.#remote.get(envelope.ticket)
        this.#remote.delete(envelope.ticket)
        remote?.clientGone()
      }
    }
  }

  /** Here: the retry of a call parked on this replica, which landed on `from`. */
  #resumeForwarded (from: string, ticket: string, principal: string, request: JsonRpcRequest): void {
    const out = new RemoteResponse(this.#o.peers, from, ticket)
    let parked: ParkedCall
    try {
      parked = this.#takeParked(request, isRecord(request.params) ? request.params : {}, principal)
    } catch (err) {
      out.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('retry not resumed', { cause: err }), request.id)
      return
    }
    this.#remote.set(ticket, out)
    this.#o.log.info({ server: parked.server, from }, 'input_required retry resumed for a client of another replica')
    const exchange = new Exchange(this.#o, out, request, envelopeOf(request), parked.server, principal, parked.serverInfo, {})
    const params = isRecord(request.params) ? request.params : {}
    exchange.resume(parked, params.inputResponses)
    // The ticket is forgotten once the exchange ends here (its last message went out).
    const forget = setInterval(() => { if (out.done) { clearInterval(forget); this.#remote.delete(ticket) } }, 1000)
    forget.unref()
  }

  /** There: a retry whose call is parked on `replica` is sent to it; its messages come back here. */
  async #forward (reply: FastifyReply, replica: string, request: JsonRpcRequest, principal: string): Promise<void> {
    const peers = this.#o.peers
    // A replica that is gone took the call with it: the client starts over.
    if (!await peers.isAlive(replica)) throw new GW_ERR_BACKEND_LOST('the backend call', `replica ${replica} holding it is gone`)
    reply.hijack()
    const out = new ModernResponse(reply.raw, replyHeaders(reply))
    const ticket = `${peers.replicaId}.${++this.#seq}`
    const timeoutMs = this.#o.forwardTimeoutMs
    const started = Date.now()
    // The holder may die while the call runs there: its heartbeat is watched, so the client hears
    // -32007 within seconds rather than after the whole deadline.
    const timer = setInterval(() => {
      const forward = this.#forwards.get(ticket)
      if (forward === undefined) { clearInterval(timer); return }
      if (Date.now() - started > timeoutMs) {
        this.#forwards.delete(ticket)
        clearInterval(timer)
        out.fail(new GW_ERR_BACKEND_LOST('the backend call', `replica ${replica} did not answer within ${timeoutMs} ms`), request.id)
        return
      }
      peers.isAlive(replica).then(alive => {
        if (alive || !this.#forwards.delete(ticket)) return
        clearInterval(timer)
        out.fail(new GW_ERR_BACKEND_LOST('the backend call', `replica ${replica} holding it is gone`), request.id)
      }, () => {})
    }, FORWARD_WATCH_MS)
    timer.unref()
    this.#forwards.set(ticket, { out, replica, timer })
    out.onClientGone = () => {
      if (!this.#forwards.delete(ticket)) return
      clearInterval(timer)
      peers.send(replica, { kind: 'mrtr-cancel', ticket }).catch(() => {})
    }
    try {
      await peers.send(replica, { kind: 'mrtr-resume', from: peers.replicaId, ticket, principal, request })
    } catch (err) {
      this.#forwards.delete(ticket)
      clearInterval(timer)
      out.fail(isGatewayError(err) ? err : new GW_ERR_BACKEND_LOST('the backend call', 'the replica holding it cannot be reached'), request.id)
    }
  }

  /** A backend's session-level notification (list_changed): to the listen streams that asked for it. */
  onServerEvent (server: string, tenant: string | null, message: JsonRpcMessage): void {
    if (!isNotification(message)) return
    const uri = message.method === 'notifications/resources/updated' && isRecord(message.params) ? message.params.uri : undefined
    for (const listener of this.#listeners.get(`${server}\0${tenant ?? ''}`) ?? []) {
      if (!listener.methods.has(message.method)) continue
      if (uri !== undefined && !(typeof uri === 'string' && listener.uris.has(uri))) continue
      listener.send(message)
    }
  }

  #cancelListen (server: string, principal: string, requestId: unknown): void {
    for (const [key, set] of this.#listeners) {
      if (!key.startsWith(`${server}\0`)) continue
      for (const listener of set) if (listener.principal === principal && listener.id === requestId) listener.cancel()
    }
  }

  /** Shutdown: every listen stream ends gracefully. */
  endListeners (): void {
    for (const set of this.#listeners.values()) for (const listener of [...set]) listener.end()
    this.#listeners.clear()
  }

  /** `subscriptions/listen`: the acknowledgement first, then the notifications the filter names. */
  async #listen (req: FastifyRequest, reply: FastifyReply, server: string, request: JsonRpcRequest): Promise<void> {
    const tenant = req.principal.tenant
    const info = await this.#o.pool.info(server, tenant)
    const params = isRecord(request.params) ? request.params : {}
    const filter = isRecord(params.notifications) ? params.notifications : {}
    const honoured: Record<string, unknown> = {}
    const methods = new Set<string>()
    for (const [field, kind] of Object.entries(LIST_CHANGED)) {
      const capability = info.capabilities[kind.capability]
      if (filter[field] === true && isRecord(capability) && capability.listChanged === true) {
        honoured[field] = true
        methods.add(kind.method)
      }
    }
    // Resource subscriptions, when the backend supports them: subscribed upstream while the stream lasts.
    const resources = info.capabilities.resources
    const wanted = Array.isArray(filter.resourceSubscriptions) ? filter.resourceSubscriptions.filter((u): u is string => typeof u === 'string' && u.length > 0 && u.length <= 2048).slice(0, MAX_LISTEN_URIS) : []
    const uris = isRecord(resources) && resources.subscribe === true ? [...new Set(wanted)] : []
    if (uris.length > 0) {
      honoured.resourceSubscriptions = uris
      methods.add('notifications/resources/updated')
    }
    const release = await this.#o.pool.hold(server, tenant, uris)
    const subscriptionId = request.id
    const tag = (message: JsonRpcMessage): JsonRpcMessage => {
      const p = 'params' in message && isRecord(message.params) ? message.params : {}
      return { ...message, params: { ...p, _meta: { ...(isRecord(p._meta) ? p._meta : {}), [META_SUBSCRIPTION_ID]: subscriptionId } } } as JsonRpcMessage
    }
    reply.hijack()
    const res = reply.raw
    res.writeHead(200, { ...replyHeaders(reply), 'content-type': 'text/event-stream', 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' })
    const write = (message: JsonRpcMessage): void => { if (!res.writableEnded) res.write(`event: message\ndata: ${JSON.stringify(message)}\n\n`) }
    write(tag({ jsonrpc: '2.0', method: 'notifications/subscriptions/acknowledged', params: { notifications: honoured } }))
    const key = `${server}\0${tenant ?? ''}`
    let set = this.#listeners.get(key)
    if (set === undefined) this.#listeners.set(key, set = new Set())
    const keepAlive = setInterval(() => { if (!res.writableEnded) res.write(': keepalive\n\n') }, KEEPALIVE_MS)
    keepAlive.unref()
    const listener: Listener = {
      principal: req.principal.key,
      id: subscriptionId,
      methods,
      uris: new Set(uris),
      send: message => { write(tag(message)) },
      end: () => {
        if (res.writableEnded) return
        // The connection closes with the stream: a shutdown must not wait out its keep-alive.
        res.once('finish', () => { res.socket?.end() })
        res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: subscriptionId, result: { resultType: 'complete', _meta: { [META_SUBSCRIPTION_ID]: subscriptionId } } })}\n\n`)
      },
      cancel: () => {
        if (res.writableEnded) return
        res.once('finish', () => { res.socket?.end() })
        res.end()
      }
    }
    set.add(listener)
    const socket = res.socket
    res.on('close', () => {
      req.log.debug({ server }, 'listen stream closed')
      if (!res.writableFinished) socket?.destroy()
      clearInterval(keepAlive)
      set.delete(listener)
      if (set.size === 0 && this.#listeners.get(key) === set) this.#listeners.delete(key)
      release()
    })
  }

  /** Serves one classified modern POST. Throws (before anything is written) for HTTP-level refusals. */
  async serve (req: FastifyRequest, reply: FastifyReply, server: string, message: JsonRpcMessage): Promise<void> {
    const headers = modernHeaders(req)
    if (isNotification(message)) {
      // Accepted (H-26-6). The one a client sends is notifications/cancelled for a listen stream
      // (the v2 SDK sends it besides closing the stream): that stream ends. Others are ignored.
      checkModernNotification(message, headers)
      if (message.method === 'notifications/cancelled' && isRecord(message.params)) this.#cancelListen(server, req.principal.key, message.params.requestId)
      reply.code(202).send()
      return
    }
    if (!isRequest(message)) return
    const envelope = checkModernRequest(message, headers)
    const tenant = req.principal.tenant
    if (message.method === 'tools/call') {
      const policy = this.#o.toolPolicy?.(tenant, server) ?? null
      const tool = toolNameOf(message.params) ?? ''
      if (policy !== null && !policy.allows(tool)) {
        audit(req.log, 'tools.call', { tenant, subject: req.principal.subjectDigest, server, tool: tool.slice(0, 128), outcome: 'denied', ms: 0 })
        reply.type('application/json').send(toJsonRpcError(new GW_ERR_UNKNOWN_TOOL(tool), message.id))
        return
      }
    }
    const config = this.#o.live.servers[server]
    if (config?.transport === 'streamable-http' && await this.#eraOf(server, config, req) === 'modern') {
      await this.#relay(req, reply, server, config, message)
      return
    }
    if (message.method === 'subscriptions/listen') {
      await this.#listen(req, reply, server, message)
      return
    }
    if (message.method === 'server/discover') {
      reply.type('application/json').send({ jsonrpc: '2.0', id: message.id, result: await this.#discover(server, tenant) })
      return
    }
    const params = isRecord(message.params) ? message.params : {}
    const holder = params.requestState !== undefined ? this.#o.parked.replicaOf(params.requestState) : undefined
    if (holder !== undefined && holder !== this.#o.peers.replicaId) {
      // The call is parked on another replica (flow 8): the retry goes there, the answer comes back.
      await this.#forward(reply, holder, message, req.principal.key)
      return
    }
    // A retry's state is checked before the response starts, so a refusal is an HTTP 400.
    const parked = params.requestState !== undefined ? this.#takeParked(message, params, req.principal.key) : null
    const info = await this.#o.pool.info(server, tenant)
    reply.hijack()
    const out = new ModernResponse(reply.raw, replyHeaders(reply))
    // inputResponses on a first call (no requestState) answer the backend's asks by key as they come.
    const preAnswers = parked === null && isRecord(params.inputResponses) ? params.inputResponses : {}
    const exchange = new Exchange(this.#o, out, message, envelope, server, req.principal.key, info.serverInfo, preAnswers)
    if (parked !== null) {
      exchange.resume(parked, params.inputResponses)
      return
    }
    const base = legacyParams(isRecord(message.params) ? message.params : undefined)
    try {
      const call = await this.#o.pool.call(server, tenant, key => {
        const outgoing: Record<string, unknown> = { ...base }
        delete outgoing.inputResponses
        delete outgoing.requestState
        const meta = isRecord(outgoing._meta) ? { ...outgoing._meta } : undefined
        if (meta?.progressToken !== undefined) outgoing._meta = { ...meta, progressToken: key }
        return { jsonrpc: '2.0', id: key, method: message.method, params: outgoing }
      }, exchange)
      exchange.start(call)
    } catch (err) {
      out.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('request not delivered', { cause: err }), message.id)
    }
  }

  #takeParked (request: JsonRpcRequest, params: Record<string, unknown>, principal: string): ParkedCall {
    const parked = this.#o.parked.take(params.requestState, principal)
    if (parked.method !== request.method) {
      parked.onExpire()
      throw new GW_ERR_INVALID_PARAMS(`requestState was issued for ${parked.method}, not ${request.method}`)
    }
    if (params.inputResponses !== undefined && !isRecord(params.inputResponses)) {
      parked.onExpire()
      throw new GW_ERR_INVALID_PARAMS('inputResponses must be an object')
    }
    return parked
  }

  async #discover (server: string, tenant: string | null): Promise<Record<string, unknown>> {
    const info = await this.#o.pool.info(server, tenant)
    const result: Record<string, unknown> = {
      supportedVersions: [...MODERN_VERSIONS],
      capabilities: modernCapabilities(info.capabilities),
      ...(info.instructions !== undefined ? { instructions: info.instructions } : {})
    }
    return completeResult('server/discover', result, info.serverInfo)
  }
}

/**
 * A legacy server's capabilities as a modern server states them: the same (its `resources.subscribe`
 * means listen streams can name resources; the gateway subscribes upstream for them).
 */
function modernCapabilities (legacy: Record<string, unknown>): Record<string, unknown> {
  return { ...legacy }
}

/**
 * One client request and its answer: relays what the pooled call sends, turns the backend's
 * server-to-client requests into `input_required` rounds, and parks the call between rounds.
 */
class Exchange implements PoolSink {
  readonly #o: ModernFaceOptions
  readonly #out: ResponseSink
  readonly #request: JsonRpcRequest
  readonly #envelope: RequestEnvelope
  readonly #server: string
  readonly #principal: string
  readonly #serverInfo: Record<string, unknown>
  readonly #progressToken: RequestId | undefined
  #call: PooledCall | null = null
  /** Server requests gathered for the next input_required round, by the key the client sees. */
  readonly #pending = new Map<string, InputRequest>()
  #gather: NodeJS.Timeout | undefined
  #parked = false
  /** Answers the client sent before being asked (inputResponses without requestState), by key. */
  readonly #preAnswers: Record<string, unknown>

  constructor (options: ModernFaceOptions, out: ResponseSink, request: JsonRpcRequest, envelope: RequestEnvelope, server: string, principal: string,
    serverInfo: Record<string, unknown>, preAnswers: Record<string, unknown>) {
    this.#o = options
    this.#preAnswers = preAnswers
    this.#out = out
    this.#request = request
    this.#envelope = envelope
    this.#server = server
    this.#principal = principal
    this.#serverInfo = serverInfo
    const meta = isRecord(request.params) && isRecord(request.params._meta) ? request.params._meta : undefined
    const token = meta?.progressToken
    this.#progressToken = typeof token === 'string' || typeof token === 'number' ? token : undefined
    out.onClientGone = () => {
      clearTimeout(this.#gather)
      // Closing the response stream cancels the request (M-11), unless it waits parked for a retry.
      if (!this.#parked) this.#call?.cancel('the client closed the response stream')
    }
  }

  start (call: PooledCall): void {
    this.#call = call
    if (this.#out.done) call.cancel('the client closed the response stream')
  }

  /** A retry: takes over the parked call and answers the backend's requests it carries. */
  resume (parked: ParkedCall, inputResponses: unknown): void {
    this.#call = parked.call
    if (parked.final !== undefined) {
      // The backend answered while the call was parked (it gave up waiting, or failed).
      this.#finish(parked.final)
      return
    }
    parked.call.rebind(this)
    const responses = isRecord(inputResponses) ? inputResponses : {}
    for (const [key, input] of parked.pending) {
      const answer = responses[key]
      // Unknown keys are ignored; a missing or malformed answer is asked again (M-8 SHOULD).
      if (!validInputResponse(input.method, answer)) { this.#pending.set(key, input); continue }
      parked.call.answer({ jsonrpc: '2.0', id: input.opaqueId, result: answer })
    }
    // Inputs the retry did not answer are asked again (SHOULD), with any the backend added meanwhile.
    if (this.#pending.size > 0) this.#scheduleRound(0)
    if (this.#out.done) this.#call.cancel('the client closed the response stream')
  }

  onMessage (message: JsonRpcMessage): void {
    if (isResponse(message)) {
      clearTimeout(this.#gather)
      this.#finish(message)
      return
    }
    if (isRequest(message)) {
      this.#onServerRequest(message)
      return
    }
    if (this.#parked || this.#out.done) return
    const params = isRecord(message.params) ? message.params : {}
    if (message.method === 'notifications/progress') {
      if (this.#progressToken === undefined) return
      this.#out.notify({ ...message, params: { ...params, progressToken: this.#progressToken } })
    } else if (message.method === 'notifications/message') {
      if (logPasses(params.level, this.#envelope.logLevel)) this.#out.notify(message)
    }
  }

  #finish (response: JsonRpcResponse): void {
    const id = this.#request.id
    if ('error' in response) {
      // An unknown method is 404 in this era (H-26-1), the backend's answer says so.
      const status = response.error.code === -32601 ? 404 : 200
      this.#out.finish({ ...response, id, error: modernError(this.#request, response.error) }, status)
      return
    }
    this.#out.finish({ jsonrpc: '2.0', id, result: completeResult(this.#request.method, response.result, this.#serverInfo) })
  }

  #onServerRequest (request: JsonRpcRequest): void {
    const call = this.#call
    if (call === null) return
    const capability = NEEDS_CAPABILITY[request.method]
    if (capability === undefined || !MRTR_METHODS.has(this.#request.method)) {
      call.answer({ jsonrpc: '2.0', id: request.id, error: { code: -32601, message: `${request.method} is not available to a ${this.#request.method} request of protocol 2026-07-28` } })
      return
    }
    if (this.#envelope.clientCapabilities[capability] === undefined) {
      // The request did not declare what the backend needs (M-5): -32021, and the call is withdrawn.
      call.answer({ jsonrpc: '2.0', id: request.id, error: { code: -32601, message: `the client did not declare the '${capability}' capability` } })
      this.#parked = false
      call.cancel(`missing client capability ${capability}`)
      this.#out.fail(withData(new GW_ERR_MISSING_CAPABILITY(capability), { requiredCapabilities: { [capability]: {} } }), this.#request.id)
      return
    }
    const input = inputRequestOf(request, this.#pending)
    const early = this.#preAnswers[input.key]
    if (validInputResponse(input.method, early)) {
      delete this.#preAnswers[input.key]
      call.answer({ jsonrpc: '2.0', id: input.opaqueId, result: early })
      return
    }
    this.#pending.set(input.key, input)
    this.#scheduleRound(ROUND_GATHER_MS)
  }

  /** After a short gathering window, hands the pending server requests to the client as one round. */
  #scheduleRound (delayMs: number): void {
    if (this.#gather !== undefined) return
    this.#gather = setTimeout(() => {
      this.#gather = undefined
      this.#round()
    }, delayMs)
    this.#gather.unref()
  }

  #round (): void {
    const call = this.#call
    if (call === null || this.#out.done || this.#pending.size === 0) return
    const pending = new Map(this.#pending)
    this.#pending.clear()
    const inputRequests: Record<string, unknown> = {}
    for (const [key, input] of pending) inputRequests[key] = { method: input.method, params: input.params }
    if (this.#o.parked.countOf(this.#principal) >= MAX_PARKED_PER_PRINCIPAL) {
      // Each parked call holds a backend connection: one caller may not hold them all.
      call.cancel('too many calls waiting for input')
      const err: GatewayError = new GW_ERR_RATE_LIMITED(PARKED_RETRY_AFTER_S)
      err.retryAfter = PARKED_RETRY_AFTER_S
      this.#out.fail(err, this.#request.id)
      return
    }
    const parkedSink = new ParkedSink()
    const parked: ParkedCall = {
      call,
      server: this.#server,
      serverInfo: this.#serverInfo,
      method: this.#request.method,
      pending,
      onExpire: () => { call.cancel('the client did not come back for an input_required result') }
    }
    parkedSink.parked = parked
    call.rebind(parkedSink)
    this.#parked = true
    const requestState = this.#o.parked.park(parked, this.#principal)
    this.#out.finish({ jsonrpc: '2.0', id: this.#request.id, result: { resultType: 'input_required', inputRequests, requestState } })
  }
}

/** The key a backend's ask gets in `inputRequests`, and what the client is asked (see inputRequestOf). */
interface KeyedInput extends InputRequest { key: string }

/**
 * A backend's server-to-client request as an input request. Its key is the one the backend named in
 * `_meta["mcp-gateway/inputKey"]` (a gateway extension: a 2025-era request has no such key, and a
 * backend that wants stable keys across retries can name them), else the request's opaque id.
 */
function inputRequestOf (request: JsonRpcRequest, taken: ReadonlyMap<string, InputRequest>): KeyedInput {
  const params = isRecord(request.params) ? { ...request.params } : {}
  let key = String(request.id)
  if (isRecord(params._meta)) {
    const { [INPUT_KEY_META]: named, ...meta } = params._meta
    if (typeof named === 'string' && /^[A-Za-z0-9_.-]{1,64}$/.test(named) && !taken.has(named)) key = named
    if (Object.keys(meta).length > 0) params._meta = meta
    else delete params._meta
  }
  return { key, opaqueId: String(request.id), method: request.method, params }
}

/** Whether a client's input response has the shape its method's result needs (else it is asked again). */
function validInputResponse (method: string, value: unknown): value is Record<string, unknown> {
  if (!isRecord(value)) return false
  switch (method) {
    case 'sampling/createMessage':
      return typeof value.role === 'string' && typeof value.model === 'string' && (isRecord(value.content) || Array.isArray(value.content))
    case 'elicitation/create':
      return value.action === 'accept' || value.action === 'decline' || value.action === 'cancel'
    case 'roots/list':
      return Array.isArray(value.roots)
    default:
      return false
  }
}

/**
 * A backend's error in this era: a resource that does not exist is -32602 (2025's -32002) and
 * names its uri in `data` (SEP-2164).
 */
function modernError (request: JsonRpcRequest, error: JsonRpcErrorObject): JsonRpcErrorObject {
  if (request.method !== 'resources/read' || (error.code !== -32002 && error.code !== -32602)) return error
  const uri = isRecord(request.params) ? request.params.uri : undefined
  const data = isRecord(error.data) ? error.data : {}
  return { ...error, code: -32602, data: { ...data, uri: data.uri ?? uri } }
}

/**
 * Holds a parked call between rounds: backend requests that arrive meanwhile join its pending
 * inputs (asked in the next round); an answer or error that arrives meanwhile is kept for the retry.
 */
class ParkedSink implements PoolSink {
  parked: ParkedCall | undefined

  onMessage (message: JsonRpcMessage): void {
    const parked = this.parked
    if (parked === undefined) return
    if (isRequest(message) && NEEDS_CAPABILITY[message.method] !== undefined) {
      const input = inputRequestOf(message, parked.pending)
      parked.pending.set(input.key, input)
    } else if (isRequest(message)) {
      parked.call.answer({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `${message.method} is not available to a modern request` } })
    } else if (isResponse(message)) {
      parked.final = message
    }
    // Notifications of a parked call have no stream to go to: dropped.
  }
}

