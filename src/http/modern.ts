// The 2026-07-28 (modern, stateless) face on /mcp/<server> (docs/spec-rules.md §4 and 5.7): a POST
// that http/streamable.ts classifies as modern (modern-rules.ts) is served here, with no session.
//
// What a server is to such a request (pooled, relayed to a modern backend, an aggregate) is
// routing/kinds/stateless.ts's to say; this face asks it the same questions for every server.
//
// In front of a legacy backend a request runs on a pooled, initialised
// backend connection (routing/upstream/pool.ts) and its answer is made a modern result (resultType,
// caching hints, serverInfo). `server/discover` is answered from what the pool learned when it
// initialised the backend. Progress reaches the request that carries the token; backend log lines
// only a request that asked for them (`logLevel`), at or above that level. A backend's mid-call
// sampling, elicitation or roots request becomes an `input_required` result (for capabilities the
// request declared; else -32021), the call is parked (routing/upstream/mrtr.ts) and the retry's
// `inputResponses` answer the backend, round after round. Closing the response cancels the call
// upstream (M-11).
//
// In front of a modern backend (`protocol`, probed once on `auto`) a request is relayed as it is.
// MRTR retries that land on another replica than the one holding the call are forwarded over the
// bus. `subscriptions/listen` streams are held here. The pieces: modern-rules.ts (pure rules),
// modern-response.ts (where answers are written), modern-exchange.ts (one pooled call and its rounds).
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Logger } from 'pino'
import { refusedCall, type ToolPolicyLookup } from '../auth/tool-policy.js'
import { GW_ERR_BACKEND_LOST, GW_ERR_INVALID_PARAMS, GW_ERR_INTERNAL, isGatewayError } from '../core/errors.js'
import { isNotification, isRecord, isRequest, type JsonRpcMessage, type JsonRpcRequest, type RequestId } from '../core/jsonrpc.js'
import { LISTEN_REGISTRATION_MS, listenTopic, type ConnectionPool } from '../routing/upstream/pool.js'
import { serverTenantKey } from '../routing/upstream/ports.js'
import type { StatelessKinds, StatelessServer } from '../routing/kinds/stateless.js'
import type { ParkedCall, ParkedCalls } from '../routing/upstream/mrtr.js'
import type { Envelope } from '../state/bus.js'
import type { SessionStore } from '../state/session-store.js'
import {
  checkModernNotification, checkModernRequest, completeResult, envelopeOf, legacyParams, META_SUBSCRIPTION_ID, MODERN_VERSIONS,
  trimOws, type ModernHeaders, type RequestEnvelope
} from './modern-rules.js'
import { clientHeaders, header, replyHeaders } from './request.js'
import { ModernResponse, RemoteResponse, type Peers } from './modern-response.js'
import { Exchange, modernError } from './modern-exchange.js'
import type { CredentialLookup, UpstreamLookup } from '../routing/upstream/ports.js'
import { upstreamBaseHeaders } from '../backends/http-base.js'
import { withTasksExtension, type ModernTasks } from './modern-tasks.js'
import { relayToModern } from './modern-relay.js'
import { bridgeable, modernCapabilities, type TaskBridge } from './modern-task-bridge.js'

export type { Peers } from './modern-response.js'
export { MAX_PARKED_PER_PRINCIPAL } from './modern-exchange.js'

/** How often a forwarded retry checks that the replica holding its call is alive. */
const FORWARD_WATCH_MS = 1000

/** Most resources one listen stream may subscribe to. */
const MAX_LISTEN_URIS = 100

export interface ModernFaceOptions {
  /** A tenant's upstream headers for a server (modern backends get them with each request). */
  upstream?: UpstreamLookup
  /** The caller's own credential toward a server (credentials/), set on each relayed request. */
  credentials?: CredentialLookup
  pool: ConnectionPool
  parked: ParkedCalls
  peers: Peers
  toolPolicy?: ToolPolicyLookup
  /** How long a forwarded retry waits for the replica holding its call to answer. */
  forwardTimeoutMs: number
  /** SSE comment keep-alive interval of streamed responses and listen streams (http.keepAliveMs). */
  keepAliveMs: number
  /** Which replicas hold listen streams of a server and tenant (the session store). */
  listenRegistry: Pick<SessionStore, 'addListener' | 'listeners'>
  /** What each server is to a request without a session (pooled, relayed, aggregate). */
  kinds: StatelessKinds
  /** The Tasks extension's tasks the gateway hosts (modern-tasks.ts) and bridges (modern-task-bridge.ts). */
  tasks: ModernTasks
  bridge: TaskBridge
  log: Logger
}

export function modernHeaders (req: FastifyRequest): ModernHeaders {
  return {
    protocolVersion: trimOws(header(req, 'mcp-protocol-version')),
    method: trimOws(header(req, 'mcp-method')),
    name: trimOws(header(req, 'mcp-name'))
  }
}

/** A retry forwarded to the replica holding its call, waiting here for what comes back. */
interface Forward {
  out: ModernResponse
  timer: NodeJS.Timeout
}


/** The notification kinds a listen filter can ask for, and the backend capability each needs. */
const LIST_CHANGED: Record<string, { method: string, capability: string }> = {
  toolsListChanged: { method: 'notifications/tools/list_changed', capability: 'tools' },
  promptsListChanged: { method: 'notifications/prompts/list_changed', capability: 'prompts' },
  resourcesListChanged: { method: 'notifications/resources/list_changed', capability: 'resources' }
}

/** Every method a listen stream can ask for: nothing else is worth a store read or a bus send. */
const LISTENABLE = new Set([...Object.values(LIST_CHANGED).map(kind => kind.method), 'notifications/resources/updated', 'notifications/tasks'])

/** One open `subscriptions/listen` stream (M-9). */
interface Listener {
  /** Who opened it, and the id of its listen request: a client's notifications/cancelled names it. */
  principal: string
  id: RequestId
  /** Its caller's subject digest: the events of a per-user pool reach that subject's streams only. */
  subject: string
  /** The notification methods it asked for and the backend can send. */
  methods: Set<string>
  /** The resources whose notifications/resources/updated it asked for. */
  uris: Set<string>
  /** The hosted tasks whose notifications/tasks it asked for (its caller's own). */
  taskIds: Set<string>
  send: (message: JsonRpcMessage) => void
  /** Graceful end (shutdown): a complete result tagged with the subscription id, then the end. */
  end: () => void
  /** The client cancelled it: the stream just ends. */
  cancel: () => void
}

export class ModernFace {
  readonly #options: ModernFaceOptions
  /** Listen streams by (server, tenant). */
  readonly #listeners = new Map<string, Set<Listener>>()
  /** Retries forwarded from here, by ticket. */
  readonly #forwards = new Map<string, Forward>()
  /** Calls resumed here for a retry that landed on another replica, by ticket. */
  readonly #remote = new Map<string, RemoteResponse>()
  #seq = 0

  readonly #tick: NodeJS.Timeout

  constructor (options: ModernFaceOptions) {
    this.#options = options
    this.#tick = setInterval(() => { this.#renewRegistrations() }, LISTEN_REGISTRATION_MS / 3)
    this.#tick.unref()
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
        return
      }
      case 'listen-event':
        this.#deliverEvent(envelope.server, envelope.tenant, envelope.subject ?? null, envelope.message)
        return
      case 'task-cancel':
      case 'task-update':
        this.#options.tasks.onEnvelope(envelope)
    }
  }

  /** Here: the retry of a call parked on this replica, which landed on `from`. */
  #resumeForwarded (from: string, ticket: string, principal: string, request: JsonRpcRequest): void {
    // The ticket is forgotten once the exchange ends here (its last message went out).
    const out = new RemoteResponse(this.#options.peers, from, ticket, () => { this.#remote.delete(ticket) })
    let parked: ParkedCall
    try {
      parked = this.#takeParked(request, isRecord(request.params) ? request.params : {}, principal)
    } catch (err) {
      out.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('retry not resumed', { cause: err }), request.id)
      return
    }
    this.#remote.set(ticket, out)
    this.#options.log.info({ server: parked.server, from }, 'input_required retry resumed for a client of another replica')
    const exchange = new Exchange(this.#options.parked, out, request, envelopeOf(request), parked.server, principal, parked.serverInfo, {})
    const params = isRecord(request.params) ? request.params : {}
    exchange.resume(parked, params.inputResponses)
  }

  /** There: a retry whose call is parked on `replica` is sent to it; its messages come back here. */
  async #forward (reply: FastifyReply, replica: string, request: JsonRpcRequest, principal: string): Promise<void> {
    const peers = this.#options.peers
    // A replica that is gone took the call with it: the client starts over.
    if (!await peers.isAlive(replica)) throw new GW_ERR_BACKEND_LOST('the backend call', `replica ${replica} holding it is gone`)
    reply.hijack()
    const out = new ModernResponse(reply.raw, replyHeaders(reply), this.#options.keepAliveMs)
    const ticket = `${peers.replicaId}.${++this.#seq}`
    const timeoutMs = this.#options.forwardTimeoutMs
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
    this.#forwards.set(ticket, { out, timer })
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

  /**
   * A backend's session-level notification (list_changed, resources/updated) seen by this replica's
   * pool: to the listen streams here that asked for it, and to every other replica that holds
   * listen streams of the same server and tenant (a change made through one replica reaches a
   * listener on another). `subject`: the one subject whose own pool saw it (a per-user
   * credential): only that subject's streams hear it, here and on the replicas registered for its
   * topic; null for a tenant's pool.
   */
  onServerEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage): void {
    // A pool hands over every notification no request waits for (idle logs, late progress).
    if (!isNotification(message) || !LISTENABLE.has(message.method)) return
    this.#deliverEvent(server, tenant, subject, message)
    const peers = this.#options.peers
    this.#options.listenRegistry.listeners(listenTopic(server, tenant, subject)).then(async replicas => {
      await Promise.all(replicas.filter(r => r !== peers.replicaId).map(async r => { await peers.send(r, { kind: 'listen-event', server, tenant, subject, message }) }))
    }).catch(err => { this.#options.log.warn({ err, server }, 'listen event not sent to other replicas') })
  }

  /**
   * Registers this replica for the topics a listen stream of `subject` on (server, tenant) hears:
   * each pool's, that of `subject`'s own where the pool is per user (renewed by the face's tick).
   */
  #register (server: string, tenant: string | null, subject: string): void {
    for (const topic of this.#options.kinds.of(server).listenTopics()) {
      const scope = this.#options.pool.eventSubject(topic, tenant, subject)
      this.#options.listenRegistry.addListener(listenTopic(topic, tenant, scope), this.#options.peers.replicaId, LISTEN_REGISTRATION_MS)
        .catch(err => { this.#options.log.warn({ err, server }, 'listen registration failed') })
    }
  }

  /** Keeps this replica registered for every topic it holds listen streams of. */
  #renewRegistrations (): void {
    for (const [key, set] of this.#listeners) {
      const [server = '', tenant = ''] = key.split('\0')
      for (const subject of new Set([...set].map(l => l.subject))) this.#register(server, tenant === '' ? null : tenant, subject)
    }
  }

  #deliverEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage): void {
    if (!isNotification(message)) return
    for (const hearer of this.#options.kinds.hearersOf(server, message)) this.#deliverTo(hearer, tenant, subject, message)
  }

  #deliverTo (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage): void {
    if (!isNotification(message)) return
    const uri = message.method === 'notifications/resources/updated' && isRecord(message.params) ? message.params.uri : undefined
    for (const listener of this.#listeners.get(serverTenantKey(server, tenant)) ?? []) {
      if (subject !== null && listener.subject !== subject) continue
      if (!listener.methods.has(message.method)) continue
      if (uri !== undefined && !(typeof uri === 'string' && listener.uris.has(uri))) continue
      if (message.method === 'notifications/tasks' && !listener.taskIds.has(String(isRecord(message.params) ? message.params.taskId : ''))) continue
      listener.send(message)
    }
  }

  #cancelListen (server: string, principal: string, requestId: unknown): void {
    for (const [key, set] of this.#listeners) {
      if (!key.startsWith(serverTenantKey(server, ''))) continue
      for (const listener of set) if (listener.principal === principal && listener.id === requestId) listener.cancel()
    }
  }

  /** Shutdown: every listen stream ends gracefully. */
  endListeners (): void {
    clearInterval(this.#tick)
    for (const set of this.#listeners.values()) for (const listener of [...set]) listener.end()
    this.#listeners.clear()
  }

  /** `subscriptions/listen`: the acknowledgement first, then the notifications the filter names. */
  async #listen (req: FastifyRequest, reply: FastifyReply, server: string, target: StatelessServer, request: JsonRpcRequest, envelope: RequestEnvelope): Promise<void> {
    const tenant = req.principal.tenant
    const info = await target.info(tenant, req.principal.subjectDigest)
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
    const uris = target.subscribesResources && isRecord(resources) && resources.subscribe === true ? [...new Set(wanted)] : []
    if (uris.length > 0) {
      honoured.resourceSubscriptions = uris
      methods.add('notifications/resources/updated')
    }
    // The caller's hosted tasks it names (SEP-2663): their status changes come as notifications/tasks.
    const taskIds = await this.#options.tasks.listenable(server, filter.taskIds, envelope, req.principal)
    if (taskIds.length > 0) {
      honoured.taskIds = taskIds
      methods.add('notifications/tasks')
    }
    const release = await target.holdForListen(tenant, uris, req.principal.subjectDigest)
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
    const key = serverTenantKey(server, tenant)
    let set = this.#listeners.get(key)
    if (set === undefined) this.#listeners.set(key, set = new Set())
    this.#register(server, tenant, req.principal.subjectDigest)
    const keepAlive = setInterval(() => { if (!res.writableEnded) res.write(': keepalive\n\n') }, this.#options.keepAliveMs)
    keepAlive.unref()
    const listener: Listener = {
      principal: req.principal.key,
      id: subscriptionId,
      subject: req.principal.subjectDigest,
      methods,
      uris: new Set(uris),
      taskIds: new Set(taskIds),
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
  async serve (req: FastifyRequest, reply: FastifyReply, server: string, message: JsonRpcMessage, headers: ModernHeaders): Promise<void> {
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
    const refusal = refusedCall(this.#options.toolPolicy, { tenant, subject: req.principal.subjectDigest, server }, message, req.log)
    if (refusal !== null) {
      reply.type('application/json').send(refusal)
      return
    }
    // A task the gateway holds is answered from the task store, whatever the server's backend is.
    const task = await this.#options.tasks.answer(message, server, envelope, req.principal)
    if (task !== null) {
      reply.code(task.status).type('application/json').send(task.body)
      return
    }
    const target = this.#options.kinds.of(server)
    const relayTo = await target.relayTo(config => upstreamBaseHeaders(config, this.#options.upstream?.(tenant, server), clientHeaders(req)))
    if (relayTo !== null) {
      await relayToModern(req, reply, server, relayTo, message, envelope, this.#options)
      return
    }
    if (message.method === 'subscriptions/listen') {
      await this.#listen(req, reply, server, target, message, envelope)
      return
    }
    if (message.method === 'server/discover') {
      reply.type('application/json').send({ jsonrpc: '2.0', id: message.id, result: await this.#discover(target, tenant, this.#options.tasks.hosts(server), req.principal.subjectDigest) })
      return
    }
    // Answered here (an aggregate's merged lists), or run on a pool: the server's own, or that of
    // the aggregate member that serves it, under the member's own name.
    const plan = await target.plan(tenant, message, req.principal.subjectDigest)
    if (plan.kind === 'answer') {
      const answer = plan.response
      if ('result' in answer) {
        reply.type('application/json').send({ ...answer, result: completeResult(message.method, answer.result, plan.serverInfo) })
      } else {
        // As a backend's own would be (modern-exchange.ts): an unknown method is 404 in this era.
        reply.code(answer.error.code === -32601 ? 404 : 200).type('application/json').send({ ...answer, error: modernError(message, answer.error) })
      }
      return
    }
    const caller = { server, tenant, subjectDigest: req.principal.subjectDigest, principal: req.principal.key, resumable: true }
    const addressed = server
    server = plan.server
    const outgoingParams = plan.params
    const shownServerInfo = plan.serverInfo
    const params = isRecord(message.params) ? message.params : {}
    const holder = params.requestState !== undefined ? this.#options.parked.replicaOf(params.requestState) : undefined
    if (holder !== undefined && holder !== this.#options.peers.replicaId) {
      // The call is parked on another replica (flow 8): the retry goes there, the answer comes back.
      await this.#forward(reply, holder, message, req.principal.key)
      return
    }
    // A retry's state is checked before the response starts, so a refusal is an HTTP 400.
    const parked = params.requestState !== undefined ? this.#takeParked(message, params, req.principal.key) : null
    const info = await this.#options.pool.info(server, tenant, req.principal.subjectDigest)
    reply.hijack()
    const response = new ModernResponse(reply.raw, replyHeaders(reply), this.#options.keepAliveMs)
    // A tool the backend runs as a task of its own (2025-11-25 Tasks) is bridged (not through an aggregate).
    if (parked === null && server === addressed && bridgeable(info.capabilities)) {
      const bridged = await this.#options.bridge.serve({ out: response, request: message, envelope, caller, serverInfo: shownServerInfo ?? info.serverInfo })
        .catch(err => { response.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('task not bridged', { cause: err }), message.id); return true })
      if (bridged) return
    }
    const out = this.#options.tasks.host(response, message, envelope, caller)
    // inputResponses on a first call (no requestState) answer the backend's asks by key as they come.
    const preAnswers = parked === null && isRecord(params.inputResponses) ? params.inputResponses : {}
    const exchange = new Exchange(this.#options.parked, out, message, envelope, server, req.principal.key, shownServerInfo ?? info.serverInfo, preAnswers)
    if (parked !== null) {
      exchange.resume(parked, params.inputResponses)
      return
    }
    const base = legacyParams(isRecord(outgoingParams) ? outgoingParams : undefined)
    try {
      const call = await this.#options.pool.call(server, tenant, key => {
        const outgoing: Record<string, unknown> = { ...base }
        delete outgoing.inputResponses
        delete outgoing.requestState
        // The 2025 era's task augmentation is no field of this era: ignored (SEP-2663), never sent on.
        delete outgoing.task
        const meta = isRecord(outgoing._meta) ? { ...outgoing._meta } : undefined
        if (meta?.progressToken !== undefined) outgoing._meta = { ...meta, progressToken: key }
        return { jsonrpc: '2.0', id: key, method: message.method, params: outgoing }
      }, exchange, undefined, req.principal.subjectDigest)
      exchange.start(call)
    } catch (err) {
      out.fail(isGatewayError(err) ? err : new GW_ERR_INTERNAL('request not delivered', { cause: err }), message.id)
    }
  }

  #takeParked (request: JsonRpcRequest, params: Record<string, unknown>, principal: string): ParkedCall {
    const parked = this.#options.parked.take(params.requestState, principal)
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

  async #discover (target: StatelessServer, tenant: string | null, hostsTasks: boolean, subject: string): Promise<Record<string, unknown>> {
    const info = await target.info(tenant, subject)
    const capabilities = modernCapabilities(info.capabilities)
    const result: Record<string, unknown> = {
      supportedVersions: [...MODERN_VERSIONS],
      capabilities: hostsTasks ? withTasksExtension(capabilities) : capabilities,
      ...(info.instructions !== undefined ? { instructions: info.instructions } : {})
    }
    return completeResult('server/discover', result, info.serverInfo)
  }
}
