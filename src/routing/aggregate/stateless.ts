// 2026-07-28 (stateless) requests to an aggregate server (docs/behaviour.md, "Aggregating
// servers"): no session, so every member is reached through its (server, tenant) pool, as a modern
// request to that member would be. One catalogue per (aggregate, tenant) on this replica gives the
// merged lists, and route.ts the routing, as for a session; a routed request is handed back to the
// modern face renamed for its member, and runs on that member's pool like any modern request
// (input_required rounds, parked calls and all). With no session to hold a timer, a member found
// down is asked again by the first request after its retry time.
// A member whose credential is one user's (docs/credentials.md) runs on the caller's own pool: the
// caller's subject digest goes with every request to it, and the catalogue is then the caller's
// own, (aggregate, tenant, subject), so no list is made with one user's credential and shown to another.
import type { Logger } from 'pino'
import type { ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerSource } from '../../config/live.js'
import type { AggregateServerConfig } from '../../config/schema.js'
import { isAggregateConfig } from '../../config/server-kind.js'
import { GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, toJsonRpcError } from '../../core/errors.js'
import { errorResponse, isRecord, isResponse, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import { AggregateCatalogue, unitedInfo } from './catalogue.js'
import { MEMBER_RETRY_MS, downError, markDown, markUp, memberOf, startWithin, type MemberState } from './member-state.js'
import { routeRequest } from './route.js'
import { poolKey } from '../upstream/ports.js'
import type { BackendInfo, ConnectionPool } from '../upstream/pool.js'

/** Entries kept on a replica: one per (aggregate, tenant), or per caller where a member's credential is one user's. */
const MAX_ENTRIES = 1024

interface PoolMember extends MemberState {
  info: BackendInfo | null
  /** When a member found down may be tried again (a Date.now() time; 0 before its first start). */
  retryAt: number
}

interface Entry {
  /** The aggregate server. */
  server: string
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
  /** Whether each subject of `tenant` has connections of its own to `server` (the pool's own rule). */
  ownConnections?: (server: string, tenant: string | null) => boolean
  metrics: GatewayMetrics
  log: Logger
}

export class StatelessAggregates {
  readonly #options: StatelessAggregatesOptions
  readonly #entries = new Map<string, Entry>()

  constructor (options: StatelessAggregatesOptions) {
    this.#options = options
  }

  /** The aggregates that have `member` as a member (its pool's events concern their listeners). */
  aggregatesOf (member: string): string[] {
    return Object.entries(this.#options.live.servers)
      .filter(([, c]) => isAggregateConfig(c) && c.members.some(m => m.server === member))
      .map(([name]) => name)
  }

  /** The aggregate's members' servers, in order. */
  membersOf (server: string): string[] {
    return this.#configOf(server)?.members.map(m => m.server) ?? []
  }

  /** What the aggregate says of itself (server/discover): the union of its up members. */
  async info (server: string, tenant: string | null, subject?: string): Promise<BackendInfo> {
    const entry = await this.#entry(server, tenant, subject)
    const up = entry.members.filter(m => m.down === null)
    return unitedInfo(server, up, up.find(m => m.info !== null)?.info?.protocolVersion ?? '2025-11-25')
  }

  /**
   * A request to the aggregate: answered here (lists, unknown names), or routed to a member with
   * its name (or ref) made the member's own.
   */
  async route (server: string, tenant: string | null, request: JsonRpcRequest, subject?: string): Promise<StatelessRoute> {
    const entry = await this.#entry(server, tenant, subject)
    const params = isRecord(request.params) ? request.params : {}
    const answer = (result: Record<string, unknown>): StatelessRoute => ({ kind: 'answer', response: { jsonrpc: '2.0', id: request.id, result } })
    const route = await routeRequest(entry.catalogue, request.method, params, { subscriptions: false })
    if (route.to === 'error') return { kind: 'answer', response: errorResponse(request.id, route.code, route.message) }
    if (route.to === 'list') return answer(route.page)
    const { member } = route
    // A credential that could not be had fails the request as it would to the member itself (its
    // HTTP status, its code, a consent link); another fall is an answer of the aggregate's.
    if (member.credentialError !== null) throw member.credentialError
    if (member.down !== null) return { kind: 'answer', response: toJsonRpcError(downError(member), request.id) }
    if (route.read?.renamed === true) {
      // A ui:// URI the aggregate rewrote: read here, so the contents come back under its URI
      // (a UI resource is a static document: no input_required rounds to carry).
      const read = await this.#send(member.server, tenant, subject, 'resources/read', route.params)
      if ('error' in read) return { kind: 'answer', response: { ...read, id: request.id } }
      return answer(entry.catalogue.exposeReadResult(member, isRecord(read.result) ? read.result : {}))
    }
    return { kind: 'member', server: member.server, request: { ...request, params: route.params } }
  }

  /** A member's list changed (its pool saw list_changed): the merged lists are made again. */
  invalidate (member: string): void {
    for (const [key, entry] of this.#entries) {
      if (entry.members.some(m => m.server === member)) entry.catalogue.invalidate()
      // A reload may have changed the aggregate: its entry is made again from the config.
      if (this.#configOf(entry.server) !== entry.config) this.#entries.delete(key)
    }
  }

  #configOf (server: string): AggregateServerConfig | undefined {
    const config = Object.hasOwn(this.#options.live.servers, server) ? this.#options.live.servers[server] : undefined
    return isAggregateConfig(config) ? config : undefined
  }

  /**
   * The (aggregate, tenant) entry, or the caller's own (aggregate, tenant, subject) one when a
   * member's credential is one user's; its members' info refreshed where they were down.
   */
  async #entry (server: string, tenant: string | null, subject: string | undefined): Promise<Entry> {
    const config = this.#configOf(server)
    if (config === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(server, 'not an aggregate server')
    const own = config.members.some(m => this.#options.ownConnections?.(m.server, tenant) === true)
    const key = poolKey(server, tenant, own ? subject ?? '' : null)
    let entry = this.#entries.get(key)
    if (entry === undefined || entry.config !== config) {
      const members: PoolMember[] = config.members.map(m => ({ ...memberOf(m), info: null, retryAt: 0 }))
      const catalogue = new AggregateCatalogue<PoolMember>({
        aggregate: server,
        separator: config.separator,
        memberTimeoutMs: config.memberTimeoutMs,
        members,
        fetch: async (member, method, params) => await this.#ask(member.server, tenant, subject, method, params),
        toolPolicy: () => this.#options.toolPolicy?.(tenant, server) ?? null,
        log: this.#options.log,
        metrics: this.#options.metrics
      })
      entry = { server, config, catalogue, members }
      this.#entries.set(key, entry)
      // Per-caller entries (a per-user member) come and go with users: the least recently made go first.
      if (this.#entries.size > MAX_ENTRIES) this.#entries.delete(this.#entries.keys().next().value as string)
    }
    const now = Date.now()
    const stale = entry.members.filter(m => m.down !== null && m.retryAt <= now)
    if (stale.length > 0) {
      await Promise.all(stale.map(async m => {
        try {
          m.info = await startWithin(m.server, this.#options.pool.info(m.server, tenant, subject), config.memberTimeoutMs)
          markUp(m)
        } catch (err) {
          const reason = err instanceof Error ? err.message : String(err)
          if (markDown(m, reason, err)) this.#options.metrics.aggregateMemberLeftOut(server, m.server, 'down')
          m.retryAt = now + MEMBER_RETRY_MS
          this.#options.log.warn({ aggregate: server, member: m.server, reason }, 'aggregate member is down: left out of lists, its calls fail at once')
        }
      }))
      entry.catalogue.invalidate()
    }
    return entry
  }

  /** A list request to a member, on its pool. */
  async #ask (server: string, tenant: string | null, subject: string | undefined, method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> {
    const message = await this.#call(server, tenant, subject, method, params)
    if ('error' in message) throw new GW_ERR_BACKEND_UNAVAILABLE(server, `${method}: ${message.error.message}`)
    return isRecord(message.result) ? message.result : {}
  }

  /** A request of the gateway's own to a member, on its pool: its answer, or a failure to get one as an error answer. */
  async #send (server: string, tenant: string | null, subject: string | undefined, method: string, params: Record<string, unknown>): Promise<JsonRpcResponse> {
    try {
      return await this.#call(server, tenant, subject, method, params)
    } catch (err) {
      return toJsonRpcError(isGatewayError(err) ? err : new GW_ERR_BACKEND_UNAVAILABLE(server, err instanceof Error ? err.message : String(err)), null)
    }
  }

  /** A request of the gateway's own to a member, on its pool: its answer; rejects when none can come. */
  async #call (server: string, tenant: string | null, subject: string | undefined, method: string, params: Record<string, unknown>): Promise<JsonRpcResponse> {
    return await new Promise<JsonRpcResponse>((resolve, reject) => {
      this.#options.pool.call(server, tenant, key => ({ jsonrpc: '2.0', id: key, method, params }), {
        onMessage: m => { if (isResponse(m)) resolve(m) }
      }, undefined, subject).catch(reject)
    })
  }
}
