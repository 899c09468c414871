// An aggregate session's relay: one client session in front of several configured servers, its
// members (docs/behaviour.md, "Aggregating servers"). The session is a routed one (an owner
// replica, takeover when it dies); what the owner holds for it is this relay, which dispatches the
// client's messages to its members' links (member-link.ts; whether each member is up:
// session-members.ts). The gateway answers `initialize` (the union of the members' capabilities,
// the aggregate's own serverInfo, the members' instructions under their names), `ping` and
// `logging/setLevel` (sent to every member); lists are merged under exposed names (names.ts) and
// paged with a cursor of the gateway's; a call goes where route.ts says: by its exposed name, a
// resource by its URI, a completion by its ref. Ids, progress tokens and server-request ids are
// rewritten per member, and so are task ids (tasks.ts): a task's requests go to the member that
// made it.
import { performance } from 'node:perf_hooks'
import type { ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerSource } from '../../config/live.js'
import type { AggregateServerConfig, Config } from '../../config/schema.js'
import { kindNameOf } from '../../config/server-kind.js'
import {
  GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, cancelledAnswer, isGatewayError, toJsonRpcError, type GatewayError
} from '../../core/errors.js'
import {
  errorResponse, idKey, isNotification, isRecord, isRequest, isResponse, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../../core/jsonrpc.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import { errorTypeOf, type GatewayMetrics } from '../../telemetry/metrics.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import { AggregateCatalogue, unitedInfo, type ListKind } from './catalogue.js'
import { DedicatedLink, PooledLink, type MemberCall } from './member-link.js'
import { routeRequest } from './route.js'
import { downError } from './member-state.js'
import { SessionMembers, type SessionMember } from './session-members.js'
import { mergedTasks, TASK_ID_METHODS, tagTaskParams, withoutTaskSupport, tagTaskResult, unitedTasks, unknownTaskMessage, untagTaskId } from './tasks.js'
import type { BackendSupervisor, CredentialLookup, UpstreamLookup } from '../upstream/ports.js'
import type { ConnectionPool } from '../upstream/pool.js'
import { isJsonStream, Relay, type RelayHost, type RelayOptions } from '../upstream/relay.js'
import { progressForClient, underGatewayKey } from '../upstream/progress-tokens.js'
import { capabilityNeededBy } from '../../core/mcp.js'
import { consentErrorFor } from '../../core/consent-error.js'

/** list_changed of several members within this are one for the client. */
const LIST_CHANGED_COALESCE_MS = 50
const INVALID_PARAMS = -32602

const LIST_CHANGED_KINDS: Record<string, ListKind[]> = {
  'notifications/tools/list_changed': ['tools'],
  'notifications/prompts/list_changed': ['prompts'],
  'notifications/resources/list_changed': ['resources', 'resourceTemplates']
}

/** A request of the client running on a member. */
interface Running {
  clientId: RequestId
  streamId: string
  member: SessionMember
  call: MemberCall | null
  progressToken: RequestId | undefined
  holder: string | undefined
  timer: NodeJS.Timeout
  method: string
  /** tools/call: the exposed name (the aggregate's metrics label). */
  tool: string | undefined
  /** performance.now() at arrival. */
  startedAt: number
  /** The member's result as the aggregate shows it, where that differs (resources/read of ui:// URIs). */
  shown: ((result: Record<string, unknown>) => Record<string, unknown>) | undefined
}

export interface AggregateOptions extends Omit<RelayOptions, 'legacy' | 'direct' | 'isOwner' | 'cancelOnTimeout' | 'backendTransport' | 'clientRequestTimeoutMs'> {
  legacy: boolean
  config: Readonly<Config>
  aggregate: AggregateServerConfig
  live: ServerSource
  backends: BackendSupervisor
  pool: ConnectionPool
  tenant: string | null
  /** The session owner's subject digest (the record's): whose credential each member link carries. */
  subjectDigest: string | undefined
  upstream: UpstreamLookup | undefined
  /** Each member's credential for the session owner; none when static. */
  credentials: CredentialLookup | undefined
  toolPolicy: ToolPolicyLookup | undefined
  gatewayMetrics: GatewayMetrics
}

export class AggregateRelay extends Relay {
  readonly #options: AggregateOptions
  readonly #host: RelayHost
  readonly #members: SessionMembers
  #protocolVersionOfClient: string
  #capabilitiesOfClient: Record<string, unknown>
  #logLevel: string | null = null
  readonly #running = new Map<string, Running>()
  /** Server-to-client requests of members sent to the client, by opaque id: how to answer each. */
  readonly #asks = new Map<string, (response: JsonRpcResponse) => void>()
  /** The merged lists, for routing names and URIs. */
  readonly #catalogue: AggregateCatalogue<SessionMember>
  readonly #pendingListChanged = new Set<string>()
  #listChangedTimer: NodeJS.Timeout | undefined
  #closed = false

  constructor (options: AggregateOptions) {
    super({
      ...options,
      direct: false,
      isOwner: true,
      cancelOnTimeout: false,
      backendTransport: 'stdio',
      clientRequestTimeoutMs: options.config.sessions.clientRequestTimeoutMs
    })
    this.#options = options
    this.#host = options.host
    this.#protocolVersionOfClient = options.protocolVersion
    this.#capabilitiesOfClient = options.clientCapabilities
    this.#members = new SessionMembers({
      aggregate: this.server,
      config: options.aggregate,
      link: m => kindNameOf(options.live.servers[m.server]) === 'pooled'
        ? new PooledLink(options.pool, m.server, options.tenant, options.subjectDigest)
        : new DedicatedLink({
          server: m.server,
          sid: this.sid,
          live: options.live,
          backends: options.backends,
          tenant: options.tenant,
          upstream: options.upstream,
          gatewayMetrics: options.gatewayMetrics,
          clientRequestTimeoutMs: options.config.sessions.clientRequestTimeoutMs,
          nextServerRequestId: () => options.host.nextServerRequestId(),
          log: this.log,
          principal: this.principal,
          credential: options.credentials?.(options.tenant, options.subjectDigest, m.server),
          gone: reason => { this.#members.down(m.server, reason) },
          fromConnection: (message, answer) => { this.#fromMemberConnection(m.server, message, answer) }
        }),
      listsChanged: () => {
        this.#catalogue.invalidate()
        for (const method of Object.keys(LIST_CHANGED_KINDS)) this.#announce(method)
      },
      log: this.log,
      metrics: options.gatewayMetrics
    })
    this.#catalogue = new AggregateCatalogue({
      aggregate: this.server,
      separator: options.aggregate.separator,
      memberTimeoutMs: options.aggregate.memberTimeoutMs,
      members: this.#members.all,
      fetch: async (member, method, params) => await this.#ask(member, method, params),
      toolPolicy: () => options.toolPolicy?.(options.tenant, this.server) ?? null,
      log: this.log,
      metrics: options.gatewayMetrics
    })
  }

  /** Starts the members (session-members.ts says how long it waits for each). */
  async open (): Promise<void> {
    await this.#members.open()
  }

  override get inFlightCount (): number { return this.#running.size }

  override setClient (protocolVersion: string | undefined, clientCapabilities: Record<string, unknown> | undefined): void {
    if (protocolVersion !== undefined) this.#protocolVersionOfClient = protocolVersion
    if (clientCapabilities !== undefined) this.#capabilitiesOfClient = clientCapabilities
  }

  override inFlight (id: RequestId): boolean {
    return this.#running.has(idKey(id))
  }

  override refuse (request: JsonRpcRequest, streamId: string, err: unknown): void {
    const gwErr = isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(this.server, err instanceof Error ? err.message : String(err))
    this.#reply(streamId, toJsonRpcError(gwErr, request.id))
  }

  override failAll (err: GatewayError): void {
    for (const [key, running] of [...this.#running]) {
      this.#running.delete(key)
      clearTimeout(running.timer)
      running.call?.cancel('session ended')
      this.#reply(running.streamId, toJsonRpcError(err, running.clientId))
    }
    this.#asks.clear()
  }

  /** Stops every member's connection of this session (pooled members have none). */
  async close (): Promise<void> {
    this.#closed = true
    clearTimeout(this.#listChangedTimer)
    await this.#members.close()
  }

  // ---- client -> members -------------------------------------------------------------------

  override deliver (message: JsonRpcMessage, streamId: string | null, _trace?: TraceCarrier, holder?: string): void {
    if (isResponse(message)) {
      const id = message.id
      const answer = typeof id === 'string' ? this.#asks.get(id) : undefined
      if (answer === undefined) return
      this.#asks.delete(id as string)
      answer(message)
      return
    }
    if (!isRequest(message)) {
      this.#fromClientNotification(message)
      return
    }
    const target = streamId ?? (this.legacy ? LEGACY_STREAM : GET_STREAM)
    this.#request(message, target, holder).catch(err => {
      this.log.warn({ err, method: message.method }, 'aggregate request failed')
      this.refuse(message, target, err)
    })
  }

  #fromClientNotification (notification: JsonRpcNotification): void {
    if (notification.method === 'notifications/cancelled') {
      const params = isRecord(notification.params) ? notification.params : {}
      const requestId = params.requestId
      if (typeof requestId !== 'string' && typeof requestId !== 'number') return
      const running = this.#running.get(idKey(requestId))
      if (running === undefined) return
      this.#settle(requestId)
      running.call?.cancel(typeof params.reason === 'string' ? params.reason.slice(0, 200) : 'cancelled by the client')
      this.#reply(running.streamId, cancelledAnswer(running.clientId))
      return
    }
    if (notification.method === 'notifications/roots/list_changed') {
      for (const m of this.#members.all) if (m.down === null) m.link.notify(notification)
    }
    // initialized and others: the members were initialised by the gateway.
  }

  async #request (request: JsonRpcRequest, streamId: string, holder: string | undefined): Promise<void> {
    const params = isRecord(request.params) ? request.params : {}
    const answer = (result: Record<string, unknown>): void => { this.#reply(streamId, { jsonrpc: '2.0', id: request.id, result }, holder) }
    const fail = (code: number, message: string): void => { this.#reply(streamId, errorResponse(request.id, code, message), holder) }
    // Members still starting are waited for, not left out (each start is bounded).
    if (request.method !== 'ping') await this.#members.started()
    // A session's own: its initialize, ping and log level. The rest goes where route.ts says, as a
    // 2026-07-28 request to the aggregate would.
    switch (request.method) {
      case 'initialize':
        answer(this.#initializeResult())
        return
      case 'ping':
        answer({})
        return
      case 'logging/setLevel': {
        if (typeof params.level !== 'string') { fail(INVALID_PARAMS, 'Invalid params: level must be a string'); return }
        this.#logLevel = params.level
        // Every member that logs hears it (pooled members get it with each request).
        await Promise.allSettled(this.#members.all.filter(m => m.down === null && m.info?.capabilities.logging !== undefined && m.link instanceof DedicatedLink)
          .map(async m => { await this.#ask(m, 'logging/setLevel', { level: params.level }) }))
        answer({})
        return
      }
    }
    // Tasks: a task id says its member (tasks.ts); the list is every member's.
    if (TASK_ID_METHODS.has(request.method)) {
      const taskId = params.taskId
      if (typeof taskId !== 'string') { fail(INVALID_PARAMS, 'Invalid params: taskId must be a string'); return }
      const own = untagTaskId(taskId)
      const member = own === null ? undefined : this.#members.byServer(own.server)
      if (own === null || member === undefined || !hasTasks(member) || !isRecord(member.info?.capabilities.tasks)) { fail(INVALID_PARAMS, unknownTaskMessage(request.method, taskId)); return }
      this.#run(member, { ...request, params: { ...params, taskId: own.taskId } }, streamId, holder)
      return
    }
    if (request.method === 'tasks/list') {
      await this.#listTasks(params, answer, fail)
      return
    }
    const route = await routeRequest(this.#catalogue, request.method, params, { subscriptions: true })
    switch (route.to) {
      case 'error':
        fail(route.code, route.message)
        return
      case 'list':
        // The exposed names become the aggregate's tool labels (metrics.ts bounds them).
        if (route.kind === 'tools') this.metrics.toolsListed(route.page)
        answer(route.kind === 'tools' ? withoutTaskSupport(route.page, new Set(this.#members.all.filter(m => !hasTasks(m)).map(m => m.server))) : route.page)
        return
      case 'member': {
        // Under the member's own name or URI; a read's contents come back under the aggregate's URIs.
        const { member } = route
        const shown = route.read !== undefined ? (r: Record<string, unknown>) => this.#catalogue.exposeReadResult(member, r) : undefined
        let own = route.params
        if (!hasTasks(member) && own.task !== undefined) {
          // A pooled member's task would live on one connection of a pool other sessions share:
          // the call runs as a plain one (the specification's receiver that ignores `task`).
          const { task: _ignored, ...rest } = own
          own = rest
        }
        this.#run(member, { ...request, params: own }, streamId, holder, route.tool, shown)
      }
    }
  }

  /** tasks/list: the taking-part members' lists merged (tasks.ts). */
  async #listTasks (params: Record<string, unknown>, answer: (result: Record<string, unknown>) => void, fail: (code: number, message: string) => void): Promise<void> {
    const listing = this.#members.all.filter(m => m.down === null && hasTasks(m) && isRecord(m.info?.capabilities.tasks) && m.info.capabilities.tasks.list !== undefined)
    if (listing.length === 0) { fail(JSONRPC_METHOD_NOT_FOUND, 'Method not found: tasks/list'); return }
    if (params.cursor !== undefined) { fail(INVALID_PARAMS, 'Invalid params: unknown cursor'); return }
    const byServer = new Map(listing.map(m => [m.server, m]))
    answer(await mergedTasks([...byServer.keys()], async (server, p) => await this.#ask(byServer.get(server) as SessionMember, 'tasks/list', p), this.#options.aggregate.memberTimeoutMs, this.log))
  }

  #initializeResult (): Record<string, unknown> {
    const up = this.#members.all.filter(m => m.down === null)
    const { protocolVersion, capabilities, serverInfo, instructions } = unitedInfo(this.server, up, this.#protocolVersionOfClient)
    // A session's own: 2026-07-28 requests (stateless.ts, server/discover) have no tasks.
    const tasks = unitedTasks(up.filter(hasTasks).map(m => m.info?.capabilities ?? {}))
    return { protocolVersion, capabilities: tasks !== undefined ? { ...capabilities, tasks } : capabilities, serverInfo, ...(instructions !== undefined ? { instructions } : {}) }
  }

  /** A consent the user must give, as this client can take it (a URL elicitation where it declared one). */
  #forClient (err: GatewayError): GatewayError {
    return consentErrorFor(err, { protocolVersion: this.#protocolVersionOfClient, capabilities: this.#capabilitiesOfClient })
  }

  /** A request of the gateway's own to one member; its result, or throws. */
  async #ask (member: SessionMember, method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    const message = await new Promise<JsonRpcResponse>((resolve) => {
      member.link.run(key => ({ jsonrpc: '2.0', id: key, method, params }), {
        onMessage: m => { if (isResponse(m)) resolve(m) }
      }, this.#logLevel).catch((err: unknown) => { resolve(errorResponse(null, -32603, err instanceof Error ? err.message : String(err))) })
    })
    if ('error' in message) throw new GW_ERR_BACKEND_UNAVAILABLE(member.server, `${method}: ${message.error.message}`)
    return isRecord(message.result) ? message.result : {}
  }

  // ---- running a request on a member -------------------------------------------------------

  #run (member: SessionMember, request: JsonRpcRequest, streamId: string, holder: string | undefined, tool?: string, shown?: (result: Record<string, unknown>) => Record<string, unknown>): void {
    if (member.down !== null) {
      // A credential that could not be had says what to do (a consent link, as this client takes it).
      this.#reply(streamId, toJsonRpcError(this.#forClient(downError(member)), request.id), holder)
      return
    }
    const id = idKey(request.id)
    if (this.#running.has(id)) {
      this.#reply(streamId, errorResponse(request.id, -32600, 'Invalid Request: a request with this id is in flight'), holder)
      return
    }
    const timeoutMs = this.#options.aggregate.requestTimeoutMs
    const running: Running = {
      clientId: request.id,
      streamId,
      member,
      call: null,
      progressToken: progressTokenOf(request),
      holder,
      method: request.method,
      tool,
      shown,
      startedAt: performance.now(),
      timer: setTimeout(() => {
        if (!this.#settle(request.id)) return
        running.call?.cancel('gateway timeout')
        this.#answered(running, toJsonRpcError(new GW_ERR_BACKEND_TIMEOUT(this.server, timeoutMs), request.id))
      }, timeoutMs)
    }
    running.timer.unref()
    this.#running.set(id, running)
    member.link.run(key => underGatewayKey(request, key), { onMessage: message => { this.#fromMember(running, message) } }, this.#logLevel).then(call => {
      if (this.#running.get(id) !== running) { call.cancel('cancelled'); return }
      running.call = call
    }, (err: unknown) => {
      if (!this.#settle(request.id)) return
      const gwErr = isGatewayError(err) ? this.#forClient(err) : new GW_ERR_BACKEND_UNAVAILABLE(member.server, err instanceof Error ? err.message : String(err))
      this.#answered(running, toJsonRpcError(gwErr, request.id))
    })
  }

  /** A running request's one answer: to its stream, and to the aggregate's operation metrics (its member's are the member's own). */
  #answered (running: Running, response: JsonRpcResponse): void {
    this.#reply(running.streamId, response, running.holder)
    this.metrics.operation(running.method, running.tool, errorTypeOf(response), running.startedAt)
  }

  /** Removes a running request; false when it had ended already. */
  #settle (clientId: RequestId): boolean {
    const running = this.#running.get(idKey(clientId))
    if (running === undefined) return false
    this.#running.delete(idKey(clientId))
    clearTimeout(running.timer)
    return true
  }

  /** What a member sent about one running request. */
  #fromMember (running: Running, message: JsonRpcMessage): void {
    if (this.#running.get(idKey(running.clientId)) !== running) {
      // Ended here (timeout, cancellation): a late request of the member still gets an answer.
      if (isRequest(message)) running.call?.answer(errorResponse(message.id, -32603, 'the request it belongs to has ended'))
      return
    }
    if (isResponse(message)) {
      this.#settle(running.clientId)
      let shown = message
      if ('result' in message && isRecord(message.result)) {
        let result = running.shown !== undefined ? running.shown(message.result) : message.result
        if (hasTasks(running.member)) result = tagTaskResult(running.member.server, running.method, result)
        if (result !== message.result) shown = { ...message, result }
      }
      this.#answered(running, { ...shown, id: running.clientId } as JsonRpcResponse)
      return
    }
    const side = isJsonStream(running.streamId) ? GET_STREAM : running.streamId
    if (isRequest(message)) {
      this.#askClient(running.member, message, side, response => { running.call?.answer(response) })
      return
    }
    if (message.method === 'notifications/progress') {
      const progress = progressForClient(message, running.progressToken)
      if (progress !== undefined) this.#reply(side, progress)
      return
    }
    this.#fromMemberNotification(running.member, message, side)
  }

  /** A member's server-to-client request: to the client if it declared the capability, under its opaque id. */
  #askClient (member: SessionMember, request: JsonRpcRequest, streamId: string, answer: (response: JsonRpcResponse) => void): void {
    const capability = capabilityNeededBy(request.method)
    if (capability !== undefined && this.#capabilitiesOfClient[capability] === undefined) {
      answer(errorResponse(request.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${request.method} (no '${capability}' capability)`))
      return
    }
    if (request.method === 'ping') { answer({ jsonrpc: '2.0', id: request.id, result: {} }); return }
    const opaque = String(request.id)
    this.#asks.set(opaque, answer)
    this.#reply(streamId, hasTasks(member) && isRecord(request.params) ? { ...request, params: tagTaskParams(member.server, request.method, request.params) } : request)
  }

  /** A member's notification (of a request, or of its connection). */
  #fromMemberNotification (member: SessionMember, received: JsonRpcNotification, streamId: string): void {
    // Task ids it carries (a status notification's, a related task's) are shown tagged.
    const notification = hasTasks(member) && isRecord(received.params) ? { ...received, params: tagTaskParams(member.server, received.method, received.params) } : received
    const params = isRecord(notification.params) ? notification.params : {}
    const kinds = LIST_CHANGED_KINDS[notification.method]
    if (kinds !== undefined) {
      this.#catalogue.invalidate(kinds)
      this.#announce(notification.method)
      return
    }
    switch (notification.method) {
      case 'notifications/message':
        // Logs say which member they come from.
        this.#reply(streamId, { ...notification, params: { ...params, logger: typeof params.logger === 'string' ? `${member.server}/${params.logger}` : member.server } })
        return
      case 'notifications/cancelled':
        if (typeof params.requestId === 'string') this.#asks.delete(params.requestId)
        this.#reply(streamId, notification)
        return
      case 'notifications/resources/updated':
        this.#reply(this.legacy ? LEGACY_STREAM : GET_STREAM, notification)
        return
      default:
        this.#reply(streamId, notification)
    }
  }

  /** A member connection's message that belongs to no request of the aggregate's. */
  #fromMemberConnection (server: string, message: JsonRpcMessage, answer: (response: JsonRpcResponse) => void): void {
    const member = this.#members.byServer(server)
    if (member === undefined) return
    const side = this.legacy ? LEGACY_STREAM : GET_STREAM
    if (isRequest(message)) { this.#askClient(member, message, side, answer); return }
    if (isNotification(message)) this.#fromMemberNotification(member, message, side)
  }

  /**
   * A pooled member's session-level notification (its pool saw it): `subject` names the one
   * subject whose own pool it was (a per-user credential), whose sessions alone hear it.
   */
  poolEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage): void {
    if (tenant !== this.#options.tenant || !isNotification(message)) return
    if (subject !== null && subject !== this.#options.subjectDigest) return
    const member = this.#members.all.find(m => m.server === server && m.link instanceof PooledLink)
    if (member !== undefined) this.#fromMemberNotification(member, message, this.legacy ? LEGACY_STREAM : GET_STREAM)
  }

  /** Whether a pooled member of this aggregate is `server`. */
  hasPooledMember (server: string): boolean {
    return this.#members.all.some(m => m.server === server && m.link instanceof PooledLink)
  }

  /** One list_changed per method for several members' changes close together. */
  #announce (method: string): void {
    this.#pendingListChanged.add(method)
    if (this.#listChangedTimer !== undefined) return
    this.#listChangedTimer = setTimeout(() => {
      this.#listChangedTimer = undefined
      const capabilities = this.#initializeResult().capabilities as Record<string, unknown>
      for (const m of this.#pendingListChanged) {
        const capability = m.split('/')[1] ?? ''
        if (capabilities[capability] !== undefined) this.#reply(this.legacy ? LEGACY_STREAM : GET_STREAM, { jsonrpc: '2.0', method: m })
      }
      this.#pendingListChanged.clear()
    }, LIST_CHANGED_COALESCE_MS)
    this.#listChangedTimer.unref()
  }

  #reply (streamId: string, message: JsonRpcMessage, holder?: string): void {
    if (this.#closed && !isResponse(message)) return
    this.#host.append(this.sid, streamId, message, holder).catch(err => { this.log.warn({ err }, 'aggregate message not appended') })
  }
}

/**
 * Whether a member takes part in tasks: one with a connection of the session's own (dedicated,
 * HTTP, SSE), whose tasks are this session's alone. A pooled member's connection serves other
 * sessions of the tenant too, and the next request of this session may take another one.
 */
function hasTasks (member: SessionMember): boolean {
  return member.link instanceof DedicatedLink
}
