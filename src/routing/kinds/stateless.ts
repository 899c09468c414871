// The stateless 2026-07-28 request as a kind (docs/architecture.md, "Session kinds"): it has no
// session, so what it runs on is decided per request from the live config, here and nowhere else.
// The HTTP face (http/modern.ts) asks each server the same questions and never which kind it is:
// - pooled:    a stdio or 2025-era HTTP backend; the request runs on a pooled, initialised
//              connection of the (server, tenant) pool (upstream/pool.ts);
// - modern:    a 2026-07-28 HTTP backend (`protocol`, or probed once on `auto`); the request is
//              relayed as it is;
// - aggregate: lists are answered from the members' merged catalogue, anything else runs on the
//              pool of the member that serves it, under the member's own name (aggregate/stateless.ts).
import type { ServerSource } from '../../config/live.js'
import type { HttpServerConfig, ServerConfig } from '../../config/schema.js'
import { backendConfigOf, isAggregateConfig, serverConfigOf } from '../../config/server-kind.js'
import { errorResponse, isRecord, JSONRPC_INVALID_PARAMS, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import { eraOf } from '../../backends/modern-http.js'
import type { StatelessAggregates } from '../aggregate/stateless.js'
import type { BackendInfo, ConnectionPool } from '../upstream/pool.js'

/** What a request to a server is, for the face to carry out. */
export type StatelessPlan =
  /** Answered here (an aggregate's merged lists, a name no member has, a task the gateway does not know). */
  | { kind: 'answer', response: JsonRpcResponse, serverInfo?: Record<string, unknown> }
  /** Runs on `server`'s pool with these params; `serverInfo`: what the answer names as its server, when not the pool's own. */
  | { kind: 'pool', server: string, params: unknown, serverInfo?: Record<string, unknown> }

/** One server as a stateless request sees it. */
export interface StatelessServer {
  /**
   * The backend to relay the request to as it is (a 2026-07-28 server), or null when the gateway
   * serves the request itself. `headers` are those the era probe of an `auto` backend sends.
   */
  relayTo (headers: (config: HttpServerConfig) => Record<string, string>): Promise<HttpServerConfig | null>
  /** What the server says of itself (server/discover, what a listen stream can honour). */
  info (tenant: string | null, subject?: string): Promise<BackendInfo>
  /** Whether a listen stream may subscribe to the server's resources. */
  readonly subscribesResources: boolean
  /** The pool topics whose events a listen stream of this server hears. */
  listenTopics (): string[]
  /** Keeps open, while a listen stream lasts, the pools it hears (subscribed to `uris` where supported). */
  holdForListen (tenant: string | null, uris: readonly string[], subject?: string): Promise<() => void>
  /** Where a request (other than listen and discover) goes; `subject`: the caller's digest (its own pools, where a credential is one user's). */
  plan (tenant: string | null, request: JsonRpcRequest, subject?: string): Promise<StatelessPlan>
}

export interface StatelessKindsOptions {
  /** The servers as configured now (live reload). */
  live: ServerSource
  pool: ConnectionPool
  aggregates: StatelessAggregates
}

export class StatelessKinds {
  readonly #options: StatelessKindsOptions
  readonly #made = new Map<string, { config: ServerConfig, kind: StatelessServer }>()

  constructor (options: StatelessKindsOptions) {
    this.#options = options
  }

  /** The server as its live config makes it now. */
  of (server: string): StatelessServer {
    const { live, pool, aggregates } = this.#options
    const config = serverConfigOf(live, server)
    // Made once per server and config (a reload gives a changed server a new config object), not
    // per request: every 2026-07-28 request asks.
    const made = this.#made.get(server)
    if (made !== undefined && made.config === config) return made.kind
    const kind = isAggregateConfig(config) ? aggregateServer(server, pool, aggregates) : pooledServer(server, pool, live)
    if (config !== undefined) this.#made.set(server, { config, kind })
    else this.#made.delete(server)
    return kind
  }

  /**
   * The servers whose listen streams hear an event of `server`'s pool: the server itself and the
   * aggregates it is a member of (whose merged lists are made again when a member's list changed).
   */
  hearersOf (server: string, message: JsonRpcMessage): string[] {
    const { aggregates } = this.#options
    const containing = aggregates.aggregatesOf(server)
    if (containing.length > 0 && 'method' in message && message.method.endsWith('/list_changed')) aggregates.invalidate(server)
    return [...containing, server]
  }
}

/**
 * The methods of the 2026-07-28 Tasks extension that name a task. The tasks the gateway hosts are
 * answered before a request gets here (http/modern-tasks.ts), and so are a 2025-era backend's own
 * tasks, which reach this era only bridged into tasks the gateway holds: here every other task id is
 * unknown.
 */
const TASK_METHODS = new Set(['tasks/get', 'tasks/update', 'tasks/cancel'])

function unknownTask (request: JsonRpcRequest): StatelessPlan {
  const params = isRecord(request.params) ? request.params : {}
  const taskId = typeof params.taskId === 'string' ? params.taskId.slice(0, 200) : ''
  return { kind: 'answer', response: errorResponse(request.id, JSONRPC_INVALID_PARAMS, `Unknown task: ${JSON.stringify(taskId)}`) }
}

function pooledServer (server: string, pool: ConnectionPool, live: ServerSource): StatelessServer {
  return {
    async relayTo (headers) {
      const config = backendConfigOf(serverConfigOf(live, server))
      if (config?.transport !== 'streamable-http') return null
      return await eraOf(server, config, () => headers(config)) === 'modern' ? config : null
    },
    async info (tenant, subject) { return await pool.info(server, tenant, subject) },
    subscribesResources: true,
    listenTopics: () => [server],
    async holdForListen (tenant, uris, subject) { return await pool.hold(server, tenant, uris, subject) },
    async plan (_tenant, request) {
      if (TASK_METHODS.has(request.method)) return unknownTask(request)
      return { kind: 'pool', server, params: request.params }
    }
  }
}

function aggregateServer (server: string, pool: ConnectionPool, aggregates: StatelessAggregates): StatelessServer {
  return {
    async relayTo () { return null },
    async info (tenant, subject) { return await aggregates.info(server, tenant, subject) },
    // Members' resource subscriptions are not routed through an aggregate's listen stream: it
    // honours list_changed only.
    subscribesResources: false,
    // Other replicas send a member's events by member.
    listenTopics: () => aggregates.membersOf(server),
    async holdForListen (tenant, _uris, subject) {
      const held = await Promise.allSettled(aggregates.membersOf(server).map(async m => await pool.hold(m, tenant, [], subject)))
      return () => { for (const h of held) if (h.status === 'fulfilled') h.value() }
    },
    async plan (tenant, request, subject) {
      if (TASK_METHODS.has(request.method)) return unknownTask(request)
      const routed = await aggregates.route(server, tenant, request, subject)
      const serverInfo = (await aggregates.info(server, tenant, subject)).serverInfo
      return routed.kind === 'answer'
        ? { kind: 'answer', response: routed.response, serverInfo }
        : { kind: 'pool', server: routed.server, params: routed.request.params, serverInfo }
    }
  }
}
