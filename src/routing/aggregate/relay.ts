// Aggregate servers (ARCHITECTURE.md flow 10, issue 27): one client session in front of several
// configured servers, its members. The session is a routed one (an owner replica, takeover when it
// dies); what the owner holds for it is this relay, which holds a link per member:
// - a dedicated member (a stdio server with `sessions: dedicated`, an HTTP or SSE server): a
//   backend connection of the session's own, opened by the supervisor as `<sid>~<member>`, behind
//   an inner Relay (ids, progress tokens, deadlines, server-to-client requests as for any session);
// - a pooled member (`sessions: pooled`): each request borrows a connection of the member's
//   (server, tenant) pool (pool.ts), as a pooled session's does.
// The gateway answers `initialize` (the union of the members' capabilities, the aggregate's own
// serverInfo, the members' instructions under their names), `ping` and `logging/setLevel` (sent to
// every member); lists are merged under exposed names (routing/aggregate/names.ts) and paged with a cursor
// of the gateway's; a call is routed by its exposed name, a resource by its URI, a completion by
// its ref. A member that is down or slow is left out of lists (a warning, a metric) and its calls
// fail at once; it is tried again in the background, and its return is announced with list_changed.
// A member still starting is not down: the session's initialize waits for it memberTimeoutMs, and
// every request after that (lists, calls) waits for its start to end, within memberStartTimeoutMs
// (a cold gateway under load may take seconds to initialise a child).
import { performance } from 'node:perf_hooks'
import { compileToolPolicy, type ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerSource } from '../../config/live.js'
import type { AggregateServerConfig, Config } from '../../config/schema.js'
import { backendConfigOf, kindNameOf, serverConfigOf } from '../../config/server-kind.js'
import {
  GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, cancelledAnswer, isGatewayError, toJsonRpcError, type GatewayError
} from '../../core/errors.js'
import {
  errorResponse, idKey, isNotification, isRecord, isRequest, isResponse, progressTokenOf, JSONRPC_METHOD_NOT_FOUND,
  type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../../core/jsonrpc.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import { errorTypeOf, type GatewayMetrics } from '../../telemetry/metrics.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import { AggregateCatalogue, LIST_METHOD, unitedInfo, withTimeout, type CatalogueMember, type ListKind } from './catalogue.js'
import type { BackendPool, UpstreamLookup } from '../upstream/ports.js'
import { type BackendInfo, type ConnectionPool, type PooledCall } from '../upstream/pool.js'
import { GATEWAY_INITIALIZE_PARAMS, gatewayRelay } from '../upstream/gateway-relay.js'
import { isJsonStream, Relay, type RelayHost, type RelayOptions } from '../upstream/relay.js'
import { capabilityNeededBy } from '../../core/mcp.js'

/** How often a member that is down is tried again. */
const MEMBER_RETRY_MS = 5000
/** The state of a member before its first start ends. */
const NOT_STARTED = 'not started'
/** list_changed of several members within this are one for the client. */
const LIST_CHANGED_COALESCE_MS = 50
/** MCP's error for an unknown resource. */
const RESOURCE_NOT_FOUND = -32002
const INVALID_PARAMS = -32602

const LIST_CHANGED_KINDS: Record<string, ListKind[]> = {
  'notifications/tools/list_changed': ['tools'],
  'notifications/prompts/list_changed': ['prompts'],
  'notifications/resources/list_changed': ['resources', 'resourceTemplates']
}

/** What a member sends about one request of the aggregate. */
interface MemberSink { onMessage (message: JsonRpcMessage): void }

/** One request of the aggregate running on a member. */
interface MemberCall {
  cancel (reason: string): void
  /** Answers one of the member's server-to-client requests made during this call. */
  answer (response: JsonRpcResponse): void
}

/** The aggregate's connection to one member. */
interface MemberLink {
  readonly server: string
  start (): Promise<BackendInfo>
  run (build: (key: string) => JsonRpcRequest, sink: MemberSink, logLevel: string | null): Promise<MemberCall>
  /** A client notification for the member (roots/list_changed). */
  notify (notification: JsonRpcNotification): void
  close (): Promise<void>
}

interface Member extends CatalogueMember {
  link: MemberLink
  info: BackendInfo | null
  retry: NodeJS.Timeout | undefined
  /** Its first start, while it runs (bounded by memberStartTimeoutMs): requests wait for it. */
  starting: Promise<void> | null
}

/** A request of the client running on a member. */
interface Running {
  clientId: RequestId
  streamId: string
  member: Member
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
  backends: BackendPool
  pool: ConnectionPool
  tenant: string | null
  upstream: UpstreamLookup | undefined
  toolPolicy: ToolPolicyLookup | undefined
  gatewayMetrics: GatewayMetrics
}

export class AggregateRelay extends Relay {
  readonly #a: AggregateOptions
  readonly #host: RelayHost
  readonly #members: Member[]
  #protocolVersionOfClient: string
  #capabilitiesOfClient: Record<string, unknown>
  #logLevel: string | null = null
  readonly #running = new Map<string, Running>()
  /** Server-to-client requests of members sent to the client, by opaque id: how to answer each. */
  readonly #asks = new Map<string, (response: JsonRpcResponse) => void>()
  /** The merged lists, for routing names and URIs. */
  readonly #catalogue: AggregateCatalogue<Member>
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
    this.#a = options
    this.#host = options.host
    this.#protocolVersionOfClient = options.protocolVersion
    this.#capabilitiesOfClient = options.clientCapabilities
    this.#members = options.aggregate.members.map(m => {
      const memberConfig = options.live.servers[m.server]
      const pooled = kindNameOf(memberConfig) === 'pooled'
      const member: Member = {
        server: m.server,
        prefix: m.prefix ?? m.server,
        tools: m.tools !== undefined ? compileToolPolicy(m.tools) : undefined,
        link: undefined as unknown as MemberLink,
        info: null,
        down: NOT_STARTED,
        retry: undefined,
        starting: null
      }
      member.link = pooled ? new PooledLink(this.#a, m.server) : new DedicatedLink(this, this.#a, member)
      return member
    })
    this.#catalogue = new AggregateCatalogue({
      aggregate: this.server,
      separator: options.aggregate.separator,
      memberTimeoutMs: options.aggregate.memberTimeoutMs,
      members: this.#members,
      fetch: async (member, method, params) => await this.#ask(member, method, params),
      toolPolicy: () => options.toolPolicy?.(options.tenant, this.server) ?? null,
      log: this.log,
      metrics: options.gatewayMetrics
    })
  }

  /**
   * Starts every member, waiting for each at most memberTimeoutMs: one still starting then goes on
   * starting (within memberStartTimeoutMs), and the requests that need it wait for it. Those that
   * fail are tried again later.
   */
  async open (): Promise<void> {
    const waitMs = this.#a.aggregate.memberTimeoutMs
    await Promise.all(this.#members.map(async m => {
      const started = this.#start(m, false)
      m.starting = started
      started.finally(() => { if (m.starting === started) m.starting = null }).catch(() => {})
      let timer: NodeJS.Timeout | undefined
      await Promise.race([started, new Promise<void>(resolve => { timer = setTimeout(resolve, waitMs) })])
      clearTimeout(timer)
    }))
  }

  /** Members still in their first start: what a request needs of them waits for it (bounded). */
  async #started (): Promise<void> {
    const starting = this.#members.flatMap(m => m.starting === null ? [] : [m.starting])
    if (starting.length > 0) await Promise.all(starting)
  }

  async #start (member: Member, announce: boolean): Promise<void> {
    if (this.#closed) return
    const { memberTimeoutMs, memberStartTimeoutMs } = this.#a.aggregate
    // A start may take longer than a list (a cold child under load): it is bounded by
    // memberStartTimeoutMs. Nothing is answered without a member still in its first start (every
    // request but ping waits for it), so its end needs no announcement.
    const boundMs = Math.max(memberTimeoutMs, memberStartTimeoutMs)
    try {
      member.info = await withTimeout(member.link.start(), boundMs, () => new GW_ERR_BACKEND_TIMEOUT(member.server, boundMs))
      const was = member.down
      member.down = null
      if (announce && was !== null) {
        this.log.info({ member: member.server }, 'aggregate member is back')
        this.#catalogue.invalidate()
        for (const method of Object.keys(LIST_CHANGED_KINDS)) this.#announce(method)
      }
    } catch (err) {
      this.#memberDown(member, err instanceof Error ? err.message : String(err))
    }
  }

  /** A member failed to start or went away: out of lists until it comes back. */
  #memberDown (member: Member, reason: string): void {
    if (this.#closed) return
    // Once per fall: its first start failing counts (a retry failing again does not).
    if (member.down === null || member.down === NOT_STARTED) {
      this.log.warn({ member: member.server, reason }, 'aggregate member is down: left out of lists, its calls fail at once')
      this.#a.gatewayMetrics.aggregateMemberLeftOut(this.server, member.server, 'down')
    }
    if (member.down === null) {
      this.#catalogue.invalidate()
      for (const method of Object.keys(LIST_CHANGED_KINDS)) this.#announce(method)
    }
    member.down = reason
    clearTimeout(member.retry)
    member.retry = setTimeout(() => {
      member.retry = undefined
      member.link.close().then(async () => { await this.#start(member, true) }).catch(() => {})
    }, MEMBER_RETRY_MS)
    member.retry.unref()
  }

  /** @internal A dedicated link's backend is gone for good (restart cap): the member is down. */
  memberGone (server: string, reason: string): void {
    const member = this.#members.find(m => m.server === server)
    if (member !== undefined) this.#memberDown(member, reason)
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
    for (const m of this.#members) clearTimeout(m.retry)
    await Promise.all(this.#members.map(async m => { await m.link.close().catch(() => {}) }))
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
      for (const m of this.#members) if (m.down === null) m.link.notify(notification)
    }
    // initialized and others: the members were initialised by the gateway.
  }

  async #request (request: JsonRpcRequest, streamId: string, holder: string | undefined): Promise<void> {
    const params = isRecord(request.params) ? request.params : {}
    const answer = (result: Record<string, unknown>): void => { this.#reply(streamId, { jsonrpc: '2.0', id: request.id, result }, holder) }
    const fail = (code: number, message: string): void => { this.#reply(streamId, errorResponse(request.id, code, message), holder) }
    // Members still starting are waited for, not left out (each start is bounded).
    if (request.method !== 'ping') await this.#started()
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
        await Promise.allSettled(this.#members.filter(m => m.down === null && m.info?.capabilities.logging !== undefined && m.link instanceof DedicatedLink)
          .map(async m => { await this.#ask(m, 'logging/setLevel', { level: params.level }) }))
        answer({})
        return
      }
      case 'tools/list':
      case 'prompts/list':
      case 'resources/list':
      case 'resources/templates/list': {
        const kind = (Object.keys(LIST_METHOD) as ListKind[]).find(k => LIST_METHOD[k] === request.method) as ListKind
        const page = await this.#catalogue.page(kind, params.cursor)
        if (page === null) { fail(INVALID_PARAMS, 'Invalid params: unknown cursor'); return }
        // The exposed names become the aggregate's tool labels (metrics.ts bounds them).
        if (kind === 'tools') this.metrics.toolsListed(page)
        answer(page)
        return
      }
      case 'tools/call':
      case 'prompts/get': {
        const kind: ListKind = request.method === 'tools/call' ? 'tools' : 'prompts'
        const name = params.name
        if (typeof name !== 'string') { fail(INVALID_PARAMS, 'Invalid params: name must be a string'); return }
        const routed = await this.#catalogue.byName(kind, name)
        if (routed === null) { fail(INVALID_PARAMS, kind === 'tools' ? `Unknown tool: ${name}` : `Unknown prompt: ${name}`); return }
        this.#run(routed.member, { ...request, params: { ...params, name: routed.name } }, streamId, holder, kind === 'tools' ? name : undefined)
        return
      }
      case 'resources/read':
      case 'resources/subscribe':
      case 'resources/unsubscribe': {
        const uri = params.uri
        if (typeof uri !== 'string') { fail(INVALID_PARAMS, 'Invalid params: uri must be a string'); return }
        const routed = await this.#catalogue.byUri(uri)
        if (routed === null) { fail(RESOURCE_NOT_FOUND, `Resource not found: ${uri}`); return }
        // Under the member's own URI; a read's contents come back under the aggregate's.
        const shown = request.method === 'resources/read' ? (r: Record<string, unknown>) => this.#catalogue.exposeReadResult(routed.member, r) : undefined
        this.#run(routed.member, { ...request, params: { ...params, uri: routed.uri } }, streamId, holder, undefined, shown)
        return
      }
      case 'completion/complete': {
        const ref = isRecord(params.ref) ? params.ref : {}
        if (ref.type === 'ref/prompt' && typeof ref.name === 'string') {
          const routed = await this.#catalogue.byName('prompts', ref.name)
          if (routed === null) { fail(INVALID_PARAMS, `Unknown prompt: ${ref.name}`); return }
          this.#run(routed.member, { ...request, params: { ...params, ref: { ...ref, name: routed.name } } }, streamId, holder)
          return
        }
        if (ref.type === 'ref/resource' && typeof ref.uri === 'string') {
          const routed = await this.#catalogue.byUri(ref.uri)
          if (routed === null) { fail(RESOURCE_NOT_FOUND, `Resource not found: ${ref.uri}`); return }
          this.#run(routed.member, { ...request, params: { ...params, ref: { ...ref, uri: routed.uri } } }, streamId, holder)
          return
        }
        fail(INVALID_PARAMS, 'Invalid params: ref must name a prompt or a resource')
        return
      }
      default:
        fail(JSONRPC_METHOD_NOT_FOUND, `Method not found: ${request.method}`)
    }
  }

  #initializeResult (): Record<string, unknown> {
    const { protocolVersion, capabilities, serverInfo, instructions } = unitedInfo(this.server, this.#members.filter(m => m.down === null), this.#protocolVersionOfClient)
    return { protocolVersion, capabilities, serverInfo, ...(instructions !== undefined ? { instructions } : {}) }
  }

  /** A request of the gateway's own to one member; its result, or throws. */
  async #ask (member: Member, method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    const message = await new Promise<JsonRpcResponse>((resolve) => {
      member.link.run(key => ({ jsonrpc: '2.0', id: key, method, params }), {
        onMessage: m => { if (isResponse(m)) resolve(m) }
      }, this.#logLevel).catch((err: unknown) => { resolve(errorResponse(null, -32603, err instanceof Error ? err.message : String(err))) })
    })
    if ('error' in message) throw new GW_ERR_BACKEND_UNAVAILABLE(member.server, `${method}: ${message.error.message}`)
    return isRecord(message.result) ? message.result : {}
  }

  // ---- running a request on a member -------------------------------------------------------

  #run (member: Member, request: JsonRpcRequest, streamId: string, holder: string | undefined, tool?: string, shown?: (result: Record<string, unknown>) => Record<string, unknown>): void {
    if (member.down !== null) {
      this.#reply(streamId, toJsonRpcError(new GW_ERR_BACKEND_UNAVAILABLE(member.server, `aggregate member is down (${member.down})`), request.id), holder)
      return
    }
    const id = idKey(request.id)
    if (this.#running.has(id)) {
      this.#reply(streamId, errorResponse(request.id, -32600, 'Invalid Request: a request with this id is in flight'), holder)
      return
    }
    const timeoutMs = this.#a.aggregate.requestTimeoutMs
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
    const build = (key: string): JsonRpcRequest => {
      const params = isRecord(request.params) ? request.params : undefined
      if (params === undefined || running.progressToken === undefined) return { ...request, id: key }
      return { ...request, id: key, params: { ...params, _meta: { ...(params._meta as Record<string, unknown>), progressToken: key } } }
    }
    member.link.run(build, { onMessage: message => { this.#fromMember(running, message) } }, this.#logLevel).then(call => {
      if (this.#running.get(id) !== running) { call.cancel('cancelled'); return }
      running.call = call
    }, (err: unknown) => {
      if (!this.#settle(request.id)) return
      const gwErr = isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(member.server, err instanceof Error ? err.message : String(err))
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
      const shown = running.shown !== undefined && 'result' in message && isRecord(message.result) ? { ...message, result: running.shown(message.result) } : message
      this.#answered(running, { ...shown, id: running.clientId } as JsonRpcResponse)
      return
    }
    const side = isJsonStream(running.streamId) ? GET_STREAM : running.streamId
    if (isRequest(message)) {
      this.#askClient(message, side, response => { running.call?.answer(response) })
      return
    }
    const params = isRecord(message.params) ? message.params : {}
    if (message.method === 'notifications/progress') {
      if (running.progressToken === undefined) return
      this.#reply(side, { ...message, params: { ...params, progressToken: running.progressToken } })
      return
    }
    this.#fromMemberNotification(running.member, message, side)
  }

  /** A member's server-to-client request: to the client if it declared the capability, under its opaque id. */
  #askClient (request: JsonRpcRequest, streamId: string, answer: (response: JsonRpcResponse) => void): void {
    const capability = capabilityNeededBy(request.method)
    if (capability !== undefined && this.#capabilitiesOfClient[capability] === undefined) {
      answer(errorResponse(request.id, JSONRPC_METHOD_NOT_FOUND, `Client does not support ${request.method} (no '${capability}' capability)`))
      return
    }
    if (request.method === 'ping') { answer({ jsonrpc: '2.0', id: request.id, result: {} }); return }
    const opaque = String(request.id)
    this.#asks.set(opaque, answer)
    this.#reply(streamId, request)
  }

  /** A member's notification (of a request, or of its connection). */
  #fromMemberNotification (member: Member, notification: JsonRpcNotification, streamId: string): void {
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

  /** @internal A member connection's message that belongs to no request of the aggregate's. */
  fromMemberConnection (server: string, message: JsonRpcMessage, answer: (response: JsonRpcResponse) => void): void {
    const member = this.#members.find(m => m.server === server)
    if (member === undefined) return
    const side = this.legacy ? LEGACY_STREAM : GET_STREAM
    if (isRequest(message)) { this.#askClient(message, side, answer); return }
    if (isNotification(message)) this.#fromMemberNotification(member, message, side)
  }

  /** A pooled member's session-level notification (its pool saw it). */
  poolEvent (server: string, tenant: string | null, message: JsonRpcMessage): void {
    if (tenant !== this.#a.tenant || !isNotification(message)) return
    const member = this.#members.find(m => m.server === server && m.link instanceof PooledLink)
    if (member !== undefined) this.#fromMemberNotification(member, message, this.legacy ? LEGACY_STREAM : GET_STREAM)
  }

  /** Whether a pooled member of this aggregate is `server`. */
  hasPooledMember (server: string): boolean {
    return this.#members.some(m => m.server === server && m.link instanceof PooledLink)
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

/** A dedicated member: a backend connection of the session's own behind an inner relay. */
class DedicatedLink implements MemberLink {
  readonly server: string
  readonly #outer: AggregateRelay
  readonly #a: AggregateOptions
  readonly #sinks = new Map<string, MemberSink>()
  #relay: Relay | null = null
  #seq = 0

  constructor (outer: AggregateRelay, options: AggregateOptions, member: Member) {
    this.#outer = outer
    this.#a = options
    this.server = member.server
  }

  get #sid (): string { return `${this.#outer.sid}~${this.server}` }

  async start (): Promise<BackendInfo> {
    const a = this.#a
    const config = backendConfigOf(serverConfigOf(a.live, this.server))
    if (config === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not a configured backend server')
    const log = this.#outer.log.child({ member: this.server })
    const relay = gatewayRelay({
      sid: this.#sid,
      server: this.server,
      config,
      clientRequestTimeoutMs: a.config.sessions.clientRequestTimeoutMs,
      host: {
        append: async (_sid, streamId, message) => { this.#toSink(streamId, message) },
        endSession: async (_sid, reason) => { this.#outer.memberGone(this.server, reason) },
        nextServerRequestId: () => a.host.nextServerRequestId()
      },
      log,
      metrics: a.gatewayMetrics.forSession(this.server, a.tenant),
      principal: this.#outer.principal
    })
    this.#relay = relay
    const initializeParams = GATEWAY_INITIALIZE_PARAMS
    relay.backend = await a.backends.open(this.#sid, this.server, {
      onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'member message not routed')) },
      onRestarting: info => { relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, `backend stopped (${info.reason}); restarting`)) },
      onGone: reason => {
        relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, reason))
        this.#outer.memberGone(this.server, reason)
      }
    }, {
      log,
      protocolVersion: LATEST_VERSION,
      initializeParams,
      listen: true,
      ...(a.upstream !== undefined ? { upstream: a.upstream(a.tenant, this.server) } : {})
    })
    const key = `i${++this.#seq}`
    const answer = await new Promise<JsonRpcMessage>(resolve => {
      this.#sinks.set(key, { onMessage: m => { if (isResponse(m)) resolve(m) } })
      relay.deliver({ jsonrpc: '2.0', id: key, method: 'initialize', params: initializeParams }, key)
    })
    if (!isResponse(answer) || 'error' in answer) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, `initialize failed: ${isResponse(answer) && 'error' in answer ? answer.error.message : 'no answer'}`)
    relay.deliver({ jsonrpc: '2.0', method: 'notifications/initialized' }, null)
    return backendInfo(this.server, answer.result)
  }

  async run (build: (key: string) => JsonRpcRequest, sink: MemberSink): Promise<MemberCall> {
    const relay = this.#relay
    if (relay === null) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not started')
    const key = `a${++this.#seq}`
    this.#sinks.set(key, sink)
    relay.deliver(build(key), key)
    return {
      cancel: reason => {
        if (!this.#sinks.delete(key)) return
        relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: key, reason } }, null)
      },
      answer: response => { relay.deliver(response, null) }
    }
  }

  notify (notification: JsonRpcNotification): void {
    this.#relay?.deliver(notification, null)
  }

  async close (): Promise<void> {
    const relay = this.#relay
    this.#relay = null
    this.#sinks.clear()
    if (relay === null) return
    relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'session ended'))
    await this.#a.backends.stop(this.#sid)
  }

  #toSink (streamId: string, message: JsonRpcMessage): void {
    const sink = this.#sinks.get(streamId)
    if (sink !== undefined) {
      if (isResponse(message) && message.id === streamId) this.#sinks.delete(streamId)
      sink.onMessage(message)
      return
    }
    // The member connection's own (GET stream): list_changed, or what came while several requests ran.
    if (isResponse(message)) return
    this.#outer.fromMemberConnection(this.server, message, response => { this.#relay?.deliver(response, null) })
  }
}

/** A pooled member: each request borrows a connection of the member's (server, tenant) pool. */
class PooledLink implements MemberLink {
  readonly server: string
  readonly #a: AggregateOptions

  constructor (options: AggregateOptions, server: string) {
    this.#a = options
    this.server = server
  }

  async start (): Promise<BackendInfo> {
    return await this.#a.pool.info(this.server, this.#a.tenant)
  }

  async run (build: (key: string) => JsonRpcRequest, sink: MemberSink, logLevel: string | null): Promise<MemberCall> {
    const call: PooledCall = await this.#a.pool.call(this.server, this.#a.tenant, build, sink, { logLevel })
    return { cancel: reason => { call.cancel(reason) }, answer: response => { call.answer(response) } }
  }

  notify (): void {
    // A pooled connection belongs to no session: roots changes reach it with the next request's asks.
  }

  async close (): Promise<void> {}
}

function backendInfo (server: string, result: unknown): BackendInfo {
  const r = isRecord(result) ? result : {}
  return {
    protocolVersion: typeof r.protocolVersion === 'string' ? r.protocolVersion : LATEST_VERSION,
    capabilities: isRecord(r.capabilities) ? r.capabilities : {},
    serverInfo: isRecord(r.serverInfo) ? r.serverInfo : { name: server, version: '0' },
    ...(typeof r.instructions === 'string' ? { instructions: r.instructions } : {})
  }
}
