// 2026-07-28 (stateless) requests to an aggregate server (issue 27): no session, so every member
// is reached through its (server, tenant) pool, as a modern request to that member would be. One
// catalogue per (aggregate, tenant) on this replica gives the merged lists and the routing; a
// routed request is handed back to the modern face renamed for its member, and runs on that
// member's pool like any modern request (input_required rounds, parked calls and all).
import type { Logger } from 'pino'
import { compileToolPolicy, type ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerSource } from '../../config/live.js'
import type { AggregateServerConfig } from '../../config/schema.js'
import { isAggregateConfig } from '../../config/server-kind.js'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, toJsonRpcError } from '../../core/errors.js'
import { errorResponse, isRecord, isResponse, JSONRPC_METHOD_NOT_FOUND, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import { AggregateCatalogue, LIST_METHOD, unitedInfo, withTimeout, type CatalogueMember, type ListKind } from './catalogue.js'
import type { BackendInfo, ConnectionPool } from '../upstream/pool.js'

/** How long a member found down is left out before it is tried again. */
const RETRY_DOWN_MS = 5000
const RESOURCE_NOT_FOUND = -32002
const INVALID_PARAMS = -32602

interface PoolMember extends CatalogueMember {
  info: BackendInfo | null
  /** When a member found down may be tried again (performance-free: Date.now()). */
  retryAt: number
}

interface Entry {
  config: AggregateServerConfig
  catalogue: AggregateCatalogue<PoolMember>
  members: PoolMember[]
}

/** What the modern face does with a request to an aggregate. */
export type StatelessRoute =
  | { kind: 'answer', response: JsonRpcResponse }
  | { kind: 'member', server: string, request: JsonRpcRequest }

export interface StatelessAggregatesOptions {
  live: ServerSource
  pool: ConnectionPool
  toolPolicy?: ToolPolicyLookup
  metrics: GatewayMetrics
  log: Logger
}

export class StatelessAggregates {
  readonly #o: StatelessAggregatesOptions
  readonly #entries = new Map<string, Entry>()

  constructor (options: StatelessAggregatesOptions) {
    this.#o = options
  }

  isAggregate (server: string): boolean {
    return this.#configOf(server) !== undefined
  }

  /** The aggregates that have `member` as a member (its pool's events concern their listeners). */
  aggregatesOf (member: string): string[] {
    return Object.entries(this.#o.live.servers)
      .filter(([, c]) => isAggregateConfig(c) && c.members.some(m => m.server === member))
      .map(([name]) => name)
  }

  /** The aggregate's members' servers, in order. */
  membersOf (server: string): string[] {
    return this.#configOf(server)?.members.map(m => m.server) ?? []
  }

  /** What the aggregate says of itself (server/discover): the union of its up members. */
  async info (server: string, tenant: string | null): Promise<BackendInfo> {
    const entry = await this.#entry(server, tenant)
    const up = entry.members.filter(m => m.down === null)
    return unitedInfo(server, up, up.find(m => m.info !== null)?.info?.protocolVersion ?? '2025-11-25')
  }

  /**
   * A request to the aggregate: answered here (lists, unknown names), or routed to a member with
   * its name (or ref) made the member's own.
   */
  async route (server: string, tenant: string | null, request: JsonRpcRequest): Promise<StatelessRoute> {
    const entry = await this.#entry(server, tenant)
    const params = isRecord(request.params) ? request.params : {}
    const answer = (result: Record<string, unknown>): StatelessRoute => ({ kind: 'answer', response: { jsonrpc: '2.0', id: request.id, result } })
    const fail = (code: number, message: string): StatelessRoute => ({ kind: 'answer', response: errorResponse(request.id, code, message) })
    const kind = (Object.keys(LIST_METHOD) as ListKind[]).find(k => LIST_METHOD[k] === request.method)
    if (kind !== undefined) {
      const page = await entry.catalogue.page(kind, params.cursor)
      return page === null ? fail(INVALID_PARAMS, 'Invalid params: unknown cursor') : answer(page)
    }
    const member = (m: PoolMember, p: Record<string, unknown>): StatelessRoute => m.down !== null
      ? { kind: 'answer', response: errorResponse(request.id, -32007, `Backend '${m.server}' is unavailable: aggregate member is down (${m.down})`) }
      : { kind: 'member', server: m.server, request: { ...request, params: p } }
    switch (request.method) {
      case 'tools/call':
      case 'prompts/get': {
        if (typeof params.name !== 'string') return fail(INVALID_PARAMS, 'Invalid params: name must be a string')
        const routed = await entry.catalogue.byName(request.method === 'tools/call' ? 'tools' : 'prompts', params.name)
        if (routed === null) return fail(INVALID_PARAMS, request.method === 'tools/call' ? `Unknown tool: ${params.name}` : `Unknown prompt: ${params.name}`)
        return member(routed.member, { ...params, name: routed.name })
      }
      case 'resources/read': {
        if (typeof params.uri !== 'string') return fail(INVALID_PARAMS, 'Invalid params: uri must be a string')
        const routed = await entry.catalogue.byUri(params.uri)
        if (routed === null) return fail(RESOURCE_NOT_FOUND, `Resource not found: ${params.uri}`)
        if (routed.uri === params.uri || routed.member.down !== null) return member(routed.member, params)
        // A ui:// URI the aggregate rewrote: read here, so the contents come back under its URI
        // (a UI resource is a static document: no input_required rounds to carry).
        const read = await this.#send(routed.member.server, tenant, 'resources/read', { ...params, uri: routed.uri })
        if ('error' in read) return { kind: 'answer', response: { ...read, id: request.id } }
        return answer(entry.catalogue.exposeReadResult(routed.member, isRecord(read.result) ? read.result : {}))
      }
      case 'completion/complete': {
        const ref = isRecord(params.ref) ? params.ref : {}
        if (ref.type === 'ref/prompt' && typeof ref.name === 'string') {
          const routed = await entry.catalogue.byName('prompts', ref.name)
          return routed === null ? fail(INVALID_PARAMS, `Unknown prompt: ${ref.name}`) : member(routed.member, { ...params, ref: { ...ref, name: routed.name } })
        }
        if (ref.type === 'ref/resource' && typeof ref.uri === 'string') {
          const routed = await entry.catalogue.byUri(ref.uri)
          return routed === null ? fail(RESOURCE_NOT_FOUND, `Resource not found: ${ref.uri}`) : member(routed.member, { ...params, ref: { ...ref, uri: routed.uri } })
        }
        return fail(INVALID_PARAMS, 'Invalid params: ref must name a prompt or a resource')
      }
      default:
        return fail(JSONRPC_METHOD_NOT_FOUND, `Method not found: ${request.method}`)
    }
  }

  /** A member's list changed (its pool saw list_changed): the merged lists are made again. */
  invalidate (member: string): void {
    for (const [key, entry] of this.#entries) {
      if (entry.members.some(m => m.server === member)) entry.catalogue.invalidate()
      // A reload may have changed the aggregate: its entry is made again from the config.
      if (this.#configOf(key.split('\0')[0] ?? '') !== entry.config) this.#entries.delete(key)
    }
  }

  #configOf (server: string): AggregateServerConfig | undefined {
    const config = Object.hasOwn(this.#o.live.servers, server) ? this.#o.live.servers[server] : undefined
    return isAggregateConfig(config) ? config : undefined
  }

  /** The (aggregate, tenant) entry, its members' info refreshed where they were down. */
  async #entry (server: string, tenant: string | null): Promise<Entry> {
    const config = this.#configOf(server)
    if (config === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'not an aggregate server')
    const key = `${server}\0${tenant ?? ''}`
    let entry = this.#entries.get(key)
    if (entry === undefined || entry.config !== config) {
      const members: PoolMember[] = config.members.map(m => ({
        server: m.server,
        prefix: m.prefix ?? m.server,
        tools: m.tools !== undefined ? compileToolPolicy(m.tools) : undefined,
        down: 'not started',
        info: null,
        retryAt: 0
      }))
      const catalogue = new AggregateCatalogue<PoolMember>({
        aggregate: server,
        separator: config.separator,
        memberTimeoutMs: config.memberTimeoutMs,
        members,
        fetch: async (member, method, params) => await this.#ask(member.server, tenant, method, params),
        toolPolicy: () => this.#o.toolPolicy?.(tenant, server) ?? null,
        log: this.#o.log,
        metrics: this.#o.metrics
      })
      entry = { config, catalogue, members }
      this.#entries.set(key, entry)
    }
    const now = Date.now()
    const stale = entry.members.filter(m => m.down !== null && m.retryAt <= now)
    if (stale.length > 0) {
      await Promise.all(stale.map(async m => {
        try {
          m.info = await withTimeout(this.#o.pool.info(m.server, tenant), config.memberTimeoutMs, () => new GW_ERR_BACKEND_TIMEOUT(m.server, config.memberTimeoutMs))
          m.down = null
        } catch (err) {
          if (m.down === 'not started' || m.retryAt === 0) this.#o.metrics.aggregateMemberLeftOut(server, m.server, 'down')
          m.down = err instanceof Error ? err.message : String(err)
          m.retryAt = now + RETRY_DOWN_MS
          this.#o.log.warn({ aggregate: server, member: m.server, reason: m.down }, 'aggregate member is down: left out of lists, its calls fail at once')
        }
      }))
      entry.catalogue.invalidate()
    }
    return entry
  }

  /** A list request to a member, on its pool. */
  async #ask (server: string, tenant: string | null, method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    const message = await this.#call(server, tenant, method, params)
    if ('error' in message) throw new GW_ERR_BACKEND_UNAVAILABLE(server, `${method}: ${message.error.message}`)
    return isRecord(message.result) ? message.result : {}
  }

  /** A request of the gateway's own to a member, on its pool: its answer, or a failure to get one as an error answer. */
  async #send (server: string, tenant: string | null, method: string, params: Record<string, unknown>): Promise<JsonRpcResponse> {
    try {
      return await this.#call(server, tenant, method, params)
    } catch (err) {
      return toJsonRpcError(isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(server, err instanceof Error ? err.message : String(err)), null)
    }
  }

  /** A request of the gateway's own to a member, on its pool: its answer; rejects when none can come. */
  async #call (server: string, tenant: string | null, method: string, params: Record<string, unknown>): Promise<JsonRpcResponse> {
    return await new Promise<JsonRpcResponse>((resolve, reject) => {
      this.#o.pool.call(server, tenant, key => ({ jsonrpc: '2.0', id: key, method, params }), {
        onMessage: m => { if (isResponse(m)) resolve(m) }
      }).catch(reject)
    })
  }
}
