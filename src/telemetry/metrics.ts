// Prometheus metrics of one gateway instance (docs/operating.md, Metrics; docs/architecture.md).
// Every metric is defined here, on a registry of the instance's own, so several
// gateways in one process (tests) never share or collide. Names follow the OpenTelemetry MCP
// semantic conventions where they exist (`mcp.server.operation.duration` ->
// `mcp_server_operation_duration_seconds`, attribute `mcp.method.name` -> label `mcp_method_name`);
// the gateway's own metrics are `mcpgw_*`.
//
// Labels are bounded: a configured server name, a method from the known MCP list (else `other`), a
// tool name the backend listed in a tools/list result (capped, else `other`), a tenant from config.
// Never a session id, request id or subject. Call sites get pre-bound label children (no label
// hashing on the hot path); with `metrics.enabled: false` they get NO_METRICS, whose methods do nothing.
import { performance } from 'node:perf_hooks'
import type { Command } from 'ioredis'
import type { Redis } from '../state/redis/client.js'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import type { Bus, DeliverEnvelope, Envelope, EnvelopeHandler, PreparedWake } from '../state/bus.js'

/** MCP method names (semconv `mcp.method.name` values, plus the 2025-11-25 tasks methods). */
export const MCP_METHODS: readonly string[] = [
  'initialize', 'ping', 'tools/list', 'tools/call', 'resources/list', 'resources/templates/list',
  'resources/read', 'resources/subscribe', 'resources/unsubscribe', 'prompts/list', 'prompts/get',
  'completion/complete', 'logging/setLevel', 'sampling/createMessage', 'elicitation/create', 'roots/list',
  'tasks/get', 'tasks/list', 'tasks/result', 'tasks/cancel',
  'notifications/initialized', 'notifications/cancelled', 'notifications/progress', 'notifications/message',
  'notifications/roots/list_changed', 'notifications/tools/list_changed', 'notifications/prompts/list_changed',
  'notifications/resources/list_changed', 'notifications/resources/updated'
]
const KNOWN_METHODS: ReadonlySet<string> = new Set(MCP_METHODS)
/** The label value for anything outside a bounded set. */
export const OTHER = 'other'
/** Tool names kept as label values per server; later ones (a hostile backend listing thousands) are `other`. */
export const MAX_TOOLS_PER_SERVER = 200
const TOOL_NAME = /^[\w./:-]{1,128}$/
/** JSON-RPC error codes kept as `error_type` values (standard ones and the gateway's). */
const KNOWN_CODES: ReadonlySet<number> = new Set([-32700, -32600, -32601, -32602, -32603, -32000, -32001, -32002, -32006, -32007, -32010, -32011, -32012, -32013, -32014, -32042])

export const methodLabel = (method: string): string => KNOWN_METHODS.has(method) ? method : OTHER
const ENVELOPE_KINDS = new Set(['deliver', 'wake', 'release', 'end-session', 'mrtr-resume', 'mrtr-out', 'mrtr-cancel', 'listen-event', 'task-cancel', 'task-update', 'admin-reload'])
const envelopeKind = (kind: string): string => ENVELOPE_KINDS.has(kind) ? kind : OTHER
/** MCP task statuses (2025-11-25, "Tasks"): the label values of mcpgw_task_status_transitions_total. */
const TASK_STATUSES: ReadonlySet<string> = new Set(['working', 'input_required', 'completed', 'failed', 'cancelled'])

/** semconv `error.type`: '' on success, the JSON-RPC code, or 'tool_error' for a CallToolResult with isError. */
export function errorTypeOf (response: { error?: { code?: unknown }, result?: unknown }): string {
  if (response.error !== undefined) {
    const code = response.error.code
    return typeof code === 'number' && KNOWN_CODES.has(code) ? String(code) : OTHER
  }
  const result = response.result as { isError?: unknown } | undefined
  return result?.isError === true ? 'tool_error' : ''
}

/** Why an HTTP request was refused, from the typed error's code first, else its status. */
export function refusalReason (status: number, code: string): string {
  if (/AUTH|TOKEN|CREDENTIAL/.test(code) || status === 401) return 'auth'
  if (/QUOTA/.test(code)) return 'quota'
  if (/RATE/.test(code) || status === 429) return 'rate_limit'
  if (status === 403) return 'forbidden'
  if (/NOT_FOUND/.test(code) || status === 404) return 'not_found'
  if (/CAPACITY/.test(code)) return 'capacity'
  if (/SHUTTING_DOWN|STORE_UNAVAILABLE/.test(code) || status === 503) return 'unavailable'
  if (/BACKEND/.test(code)) return 'backend'
  if (status >= 400 && status < 500) return 'bad_input'
  return 'internal'
}

export type BackendErrorKind = 'timeout' | 'unavailable' | 'shutdown' | 'error_response'
export type StreamKind = 'request' | 'get' | 'legacy'
/** The router tick's upkeep passes (routing/replica/upkeep.ts): the label of mcpgw_upkeep_pass_duration_seconds. */
export type UpkeepPass = 'owner_leases' | 'stream_leases' | 'owner_watch' | 'heartbeat'
export const streamKindOf = (streamId: string): StreamKind => streamId === 'get' ? 'get' : streamId === 'legacy' ? 'legacy' : 'request'

/** What a relay records: bound to one server and tenant. */
export interface SessionMetrics {
  /** One request answered (or failed) `startedAt` (performance.now()) ago. */
  operation (method: string, tool: string | undefined, errorType: string, startedAt: number): void
  /** A tools/list result: its tool names become label values (up to the cap). */
  toolsListed (result: unknown): void
  backendError (kind: BackendErrorKind): void
  /** The session ended here (its owner); createdAt is the record's (ms since the epoch). */
  sessionEnded (createdAt: number): void
  /** A crashed child is being restarted. */
  childRestarted (): void
}

/** Live counts read at scrape time (no hot-path cost): what app.ts hands over once wired. */
export interface MetricSources {
  /** Sessions whose backend connection this replica owns, by server. */
  sessions: () => Map<string, number>
  /** Client streams written by this replica, by kind. */
  streams: () => Map<StreamKind, number>
  /** stdio children running, by server. */
  children: () => Map<string, number>
  /** stdio children of the pools (pooled sessions, 2026-07-28 requests), by server. */
  pooledChildren?: () => Map<string, number>
  /** The (server, tenant) pools of backend connections. */
  pools?: () => Array<{ server: string, connections: number, busy: number, waiting: number }>
}

export interface GatewayMetrics {
  /** The registry to render, or null when metrics are off. */
  readonly registry: Registry | null
  forSession (server: string, tenant: string | null | undefined): SessionMetrics
  childStarted (server: string): void
  childCrashed (server: string): void
  httpRefusal (status: number, code: string): void
  /** Entries a client stream's writer found trimmed from the log before it could deliver them. */
  eventLogLost (kind: StreamKind, count: number): void
  /** A resume whose Last-Event-ID was no longer in the log: an unknown number of messages lost. */
  resumeCursorMissing (kind: StreamKind): void
  /** An aggregate's member left out of its lists: `down` (not started or gone), `slow` or `error` (a list failed). */
  aggregateMemberLeftOut (aggregate: string, member: string, why: 'down' | 'slow' | 'error'): void
  /** One upkeep pass took `seconds` (wall clock, store round trips included). */
  upkeepPass (pass: UpkeepPass, seconds: number): void
  /** A client was told of a new task (a CreateTaskResult) of a session of `server`. */
  taskCreated (server: string, tenant: string | null | undefined): void
  /** A task a client was told of moved to `status` (each move once, however often it is polled). */
  taskStatus (server: string, status: string): void
  /**
   * One lookup of a caller's backend credential (credentials/): its source and outcome, and how long
   * the authorization server took when it was asked (`grantSeconds`). Never a subject or token.
   */
  credentialLookup (server: string, source: string, outcome: string, grantSeconds?: number): void
  observe (sources: MetricSources): void
  /** Live reload: the configured server and tenant names (the only label values allowed). */
  reconfigure (servers: Iterable<string>, tenants: Iterable<string>): void
  /** Times every command of this (non-blocking) connection and counts its errors. */
  instrumentRedis (redis: Redis): void
  /** Counts envelopes sent and received, and their lag (send to receive). */
  instrumentBus (bus: Bus): Bus
}

const NO_SESSION_METRICS: SessionMetrics = {
  operation () {},
  toolsListed () {},
  backendError () {},
  sessionEnded () {},
  childRestarted () {}
}

/** Metrics off: nothing is defined, recorded or served. */
export const NO_METRICS: GatewayMetrics = {
  registry: null,
  forSession: () => NO_SESSION_METRICS,
  childStarted () {},
  childCrashed () {},
  httpRefusal () {},
  eventLogLost () {},
  resumeCursorMissing () {},
  aggregateMemberLeftOut () {},
  upkeepPass () {},
  taskCreated () {},
  taskStatus () {},
  credentialLookup () {},
  observe () {},
  reconfigure () {},
  instrumentRedis () {},
  instrumentBus: bus => bus
}

const OPERATION_BUCKETS = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300]
const SESSION_BUCKETS = [1, 10, 60, 300, 900, 1800, 3600, 7200, 14_400, 43_200, 86_400]
const REDIS_BUCKETS = [0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1]
const UPKEEP_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
const LAG_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5]

const CREDENTIAL_SOURCES: ReadonlySet<string> = new Set(['static', 'token-exchange', 'client-credentials', 'user-authorization'])
const CREDENTIAL_OUTCOMES: ReadonlySet<string> = new Set(['cached', 'issued', 'refused', 'refused_cached', 'unavailable', 'missing', 'consent_required', 'rejected'])

type Observe = (value: number) => void
type Inc = (value?: number) => void

/** A cache of pre-bound children keyed by one label value (bounded by the caller's normalisation). */
class Bound<T> {
  readonly #children = new Map<string, T>()
  constructor (readonly make: (value: string) => T) {}
  get (value: string): T {
    let child = this.#children.get(value)
    if (child === undefined) {
      child = this.make(value)
      this.#children.set(value, child)
    }
    return child
  }
}

class PromSessionMetrics implements SessionMetrics {
  /** method -> tool -> error type -> observe. */
  readonly #ops: Bound<Bound<Bound<Observe>>>
  readonly #errors: Bound<Inc>
  readonly #sessionEnded: Observe
  readonly #restarted: Inc
  readonly #tools: Set<string>

  constructor (m: PromMetrics, server: string, tenant: string) {
    this.#tools = m.toolsOf(server)
    this.#ops = new Bound(method => new Bound(tool => new Bound(errorType => {
      const child = m.operationDuration.labels({ server, tenant, mcp_method_name: method, gen_ai_tool_name: tool, error_type: errorType })
      return (v: number) => { child.observe(v) }
    })))
    this.#errors = new Bound(kind => {
      const child = m.backendErrors.labels({ server, kind })
      return (v?: number) => { child.inc(v) }
    })
    const ended = m.sessionDuration.labels({ server, tenant })
    this.#sessionEnded = v => { ended.observe(v) }
    const restarted = m.childrenRestarted.labels({ server })
    this.#restarted = () => { restarted.inc() }
  }

  operation (method: string, tool: string | undefined, errorType: string, startedAt: number): void {
    const toolLabel = tool === undefined ? '' : this.#tools.has(tool) ? tool : OTHER
    this.#ops.get(methodLabel(method)).get(toolLabel).get(errorType)((performance.now() - startedAt) / 1000)
  }

  toolsListed (result: unknown): void {
    const tools = (result as { tools?: unknown } | null)?.tools
    if (!Array.isArray(tools)) return
    for (const tool of tools) {
      if (this.#tools.size >= MAX_TOOLS_PER_SERVER) return
      const name = (tool as { name?: unknown } | null)?.name
      if (typeof name === 'string' && TOOL_NAME.test(name) && name !== OTHER) this.#tools.add(name)
    }
  }

  backendError (kind: BackendErrorKind): void { this.#errors.get(kind)() }
  sessionEnded (createdAt: number): void { this.#sessionEnded(Math.max(0, Date.now() - createdAt) / 1000) }
  childRestarted (): void { this.#restarted() }
}

class PromMetrics implements GatewayMetrics {
  readonly registry = new Registry()
  #servers: ReadonlySet<string>
  #tenants: ReadonlySet<string>
  readonly #tools = new Map<string, Set<string>>()
  readonly #sessions = new Map<string, PromSessionMetrics>()

  readonly operationDuration: Histogram<string>
  readonly sessionDuration: Histogram<string>
  readonly backendErrors: Counter<string>
  readonly childrenRestarted: Counter<string>
  readonly #started: Bound<Inc>
  readonly #crashed: Bound<Inc>
  readonly #refusals: Counter<string>
  readonly #lost: Counter<string>
  readonly #cursorMissing: Counter<string>
  readonly #memberLeftOut: Counter<string>
  readonly #credentials: Counter<string>
  readonly #grants: Histogram<string>
  readonly #upkeep: Bound<Observe>
  readonly #tasksCreated: Counter<string>
  readonly #taskStatus: Counter<string>
  readonly #busSent: Bound<Inc>
  readonly #busReceived: Bound<Inc>
  readonly #busLag: Observe
  readonly #redisDuration: Bound<Observe>
  readonly #redisErrors: Bound<Inc>
  #sources: MetricSources | null = null

  constructor (servers: Iterable<string>, tenants: Iterable<string>) {
    this.#servers = new Set(servers)
    this.#tenants = new Set(tenants)
    const registers = [this.registry]
    collectDefaultMetrics({ register: this.registry })
    this.operationDuration = new Histogram({
      name: 'mcp_server_operation_duration_seconds',
      help: 'MCP request duration from its arrival at the backend connection\'s owner until its response (semconv mcp.server.operation.duration)',
      labelNames: ['server', 'tenant', 'mcp_method_name', 'gen_ai_tool_name', 'error_type'],
      buckets: OPERATION_BUCKETS,
      registers
    })
    this.sessionDuration = new Histogram({
      name: 'mcp_server_session_duration_seconds',
      help: 'MCP session duration, observed when the session ends on the replica owning its backend connection (semconv mcp.server.session.duration)',
      labelNames: ['server', 'tenant'],
      buckets: SESSION_BUCKETS,
      registers
    })
    this.backendErrors = new Counter({ name: 'mcpgw_backend_request_errors_total', help: 'Requests to a backend that failed, by kind (timeout, unavailable, shutdown, error_response)', labelNames: ['server', 'kind'], registers })
    const started = new Counter({ name: 'mcpgw_backend_children_started_total', help: 'stdio children spawned (restarts included)', labelNames: ['server'], registers })
    const crashed = new Counter({ name: 'mcpgw_backend_children_crashed_total', help: 'stdio children that exited without being asked to', labelNames: ['server'], registers })
    this.childrenRestarted = new Counter({ name: 'mcpgw_backend_children_restarted_total', help: 'Restarts begun after a child crashed (within the restart cap)', labelNames: ['server'], registers })
    this.#started = new Bound(server => { const c = started.labels({ server }); return () => { c.inc() } })
    this.#crashed = new Bound(server => { const c = crashed.labels({ server }); return () => { c.inc() } })
    this.#refusals = new Counter({ name: 'mcpgw_http_refusals_total', help: 'HTTP requests answered with an error status, by status, reason and gateway error code', labelNames: ['status', 'reason', 'code'], registers })
    this.#credentials = new Counter({ name: 'mcpgw_credential_lookups_total', help: 'Lookups of a caller\'s backend credential, by server, source and outcome (cached, issued, refused, refused_cached, unavailable, missing, consent_required, rejected)', labelNames: ['server', 'source', 'outcome'], registers })
    this.#grants = new Histogram({ name: 'mcpgw_credential_grant_duration_seconds', help: 'Time an authorization server took to answer a grant (token exchange, client credentials), by server and source', labelNames: ['server', 'source'], buckets: OPERATION_BUCKETS, registers })
    this.#memberLeftOut = new Counter({ name: 'mcpgw_aggregate_member_left_out_total', help: 'Times an aggregate server left a member out: down (not started, gone), slow (a list past memberTimeoutMs) or error (a list failed)', labelNames: ['aggregate', 'member', 'reason'], registers })
    this.#lost = new Counter({ name: 'mcpgw_event_log_lost_total', help: 'Messages trimmed from a client stream\'s bounded log before they were delivered (a slow or absent client lost them)', labelNames: ['stream'], registers })
    this.#cursorMissing = new Counter({ name: 'mcpgw_event_log_resume_cursor_missing_total', help: 'Resumes whose Last-Event-ID was already trimmed from the log (an unknown number of messages lost)', labelNames: ['stream'], registers })
    this.#tasksCreated = new Counter({ name: 'mcpgw_tasks_created_total', help: 'Tasks a client was told of (CreateTaskResult), by server and tenant, whatever the session\'s kind', labelNames: ['server', 'tenant'], registers })
    this.#taskStatus = new Counter({ name: 'mcpgw_task_status_transitions_total', help: 'Tasks a client saw move to a status (working, input_required, completed, failed, cancelled), by server', labelNames: ['server', 'status'], registers })
    const upkeep = new Histogram({ name: 'mcpgw_upkeep_pass_duration_seconds', help: 'How long one upkeep pass over this replica\'s leases and streams took (a pass near a third of redis.leaseMs risks leases), by pass', labelNames: ['pass'], buckets: UPKEEP_BUCKETS, registers })
    this.#upkeep = new Bound(pass => { const h = upkeep.labels({ pass }); return (v: number) => { h.observe(v) } })
    const sent = new Counter({ name: 'mcpgw_bus_envelopes_sent_total', help: 'Envelopes sent to other replicas, by kind', labelNames: ['kind'], registers })
    const received = new Counter({ name: 'mcpgw_bus_envelopes_received_total', help: 'Envelopes received from other replicas, by kind', labelNames: ['kind'], registers })
    const lag = new Histogram({ name: 'mcpgw_bus_envelope_lag_seconds', help: 'Time from sending an envelope to its receipt (clocks of two replicas)', buckets: LAG_BUCKETS, registers })
    this.#busSent = new Bound(kind => { const c = sent.labels({ kind }); return () => { c.inc() } })
    this.#busReceived = new Bound(kind => { const c = received.labels({ kind }); return () => { c.inc() } })
    this.#busLag = v => { lag.observe(v) }
    const redisDuration = new Histogram({ name: 'mcpgw_redis_command_duration_seconds', help: 'Redis command latency (sent to reply), by command', labelNames: ['command'], buckets: REDIS_BUCKETS, registers })
    const redisErrors = new Counter({ name: 'mcpgw_redis_command_errors_total', help: 'Redis commands that failed (error reply, timeout, connection lost), by command', labelNames: ['command'], registers })
    this.#redisDuration = new Bound(command => { const h = redisDuration.labels({ command }); return (v: number) => { h.observe(v) } })
    this.#redisErrors = new Bound(command => { const c = redisErrors.labels({ command }); return () => { c.inc() } })
    // Live counts, read when scraped.
    const sessions: Gauge<string> = new Gauge({
      name: 'mcpgw_sessions_open',
      help: 'Sessions whose backend connection this replica owns, by server',
      labelNames: ['server'],
      registers,
      collect: () => { this.#collect(sessions, 'server', this.#sources?.sessions()) }
    })
    const streams: Gauge<string> = new Gauge({
      name: 'mcpgw_client_streams_open',
      help: 'Client streams (POST response streams, GET streams, legacy SSE streams) written by this replica',
      labelNames: ['stream'],
      registers,
      collect: () => { this.#collect(streams, 'stream', this.#sources?.streams()) }
    })
    const children: Gauge<string> = new Gauge({
      name: 'mcpgw_backend_children_running',
      help: 'stdio backend children running on this replica, by server',
      labelNames: ['server'],
      registers,
      collect: () => { this.#collect(children, 'server', this.#sources?.children()) }
    })
    const byMode: Gauge<string> = new Gauge({
      name: 'mcpgw_backend_children_by_mode',
      help: 'stdio backend children running on this replica, by server and mode (dedicated: one session each; pooled: the pools)',
      labelNames: ['server', 'mode'],
      registers,
      collect: () => {
        byMode.reset()
        const all = this.#sources?.children() ?? new Map<string, number>()
        const pooled = this.#sources?.pooledChildren?.() ?? new Map<string, number>()
        for (const server of new Set([...this.#servers, ...all.keys()])) {
          const p = pooled.get(server) ?? 0
          byMode.set({ server: this.#server(server), mode: 'pooled' }, p)
          byMode.set({ server: this.#server(server), mode: 'dedicated' }, (all.get(server) ?? 0) - p)
        }
      }
    })
    const pool = (name: string, help: string, field: 'connections' | 'busy' | 'waiting'): void => {
      const gauge: Gauge<string> = new Gauge({
        name,
        help,
        labelNames: ['server'],
        registers,
        collect: () => {
          const counts = new Map<string, number>()
          for (const p of this.#sources?.pools?.() ?? []) counts.set(p.server, (counts.get(p.server) ?? 0) + p[field])
          this.#collect(gauge, 'server', counts)
        }
      })
    }
    pool('mcpgw_pool_connections', 'Backend connections of the pools (all tenants) on this replica, by server', 'connections')
    pool('mcpgw_pool_connections_busy', 'Pooled backend connections running a request now, by server', 'busy')
    pool('mcpgw_pool_requests_waiting', 'Requests waiting for a pooled backend connection (the pool at poolMax), by server', 'waiting')
  }

  #collect (gauge: Gauge<string>, label: string, counts: Map<string, number> | undefined): void {
    gauge.reset()
    if (label === 'server') for (const server of this.#servers) gauge.set({ server }, 0)
    for (const [value, n] of counts ?? []) gauge.set({ [label]: label === 'server' ? this.#server(value) : value }, n)
  }

  #server (name: string): string { return this.#servers.has(name) ? name : OTHER }

  /** The tool names listed for one server (shared by its sessions). */
  toolsOf (server: string): Set<string> {
    let tools = this.#tools.get(server)
    if (tools === undefined) {
      tools = new Set()
      this.#tools.set(server, tools)
    }
    return tools
  }

  forSession (server: string, tenant: string | null | undefined): SessionMetrics {
    const s = this.#server(server)
    const t = tenant == null ? '' : this.#tenants.has(tenant) ? tenant : OTHER
    const key = `${s}\n${t}`
    let bound = this.#sessions.get(key)
    if (bound === undefined) {
      bound = new PromSessionMetrics(this, s, t)
      this.#sessions.set(key, bound)
    }
    return bound
  }

  childStarted (server: string): void { this.#started.get(this.#server(server))() }
  childCrashed (server: string): void { this.#crashed.get(this.#server(server))() }

  httpRefusal (status: number, code: string): void {
    const gwCode = /^GW_ERR_[A-Z_]{1,48}$/.test(code) ? code : OTHER
    this.#refusals.inc({ status: String(status), reason: refusalReason(status, gwCode), code: gwCode })
  }

  eventLogLost (kind: StreamKind, count: number): void { this.#lost.inc({ stream: kind }, count) }
  resumeCursorMissing (kind: StreamKind): void { this.#cursorMissing.inc({ stream: kind }) }
  aggregateMemberLeftOut (aggregate: string, member: string, why: 'down' | 'slow' | 'error'): void {
    this.#memberLeftOut.inc({ aggregate: this.#server(aggregate), member: this.#server(member), reason: why })
  }
  upkeepPass (pass: UpkeepPass, seconds: number): void { this.#upkeep.get(pass)(seconds) }
  taskCreated (server: string, tenant: string | null | undefined): void {
    this.#tasksCreated.inc({ server: this.#server(server), tenant: tenant == null ? '' : this.#tenants.has(tenant) ? tenant : OTHER })
  }

  taskStatus (server: string, status: string): void {
    this.#taskStatus.inc({ server: this.#server(server), status: TASK_STATUSES.has(status) ? status : OTHER })
  }

  credentialLookup (server: string, source: string, outcome: string, grantSeconds?: number): void {
    const labels = { server: this.#server(server), source: CREDENTIAL_SOURCES.has(source) ? source : OTHER }
    this.#credentials.inc({ ...labels, outcome: CREDENTIAL_OUTCOMES.has(outcome) ? outcome : OTHER })
    if (grantSeconds !== undefined) this.#grants.observe(labels, grantSeconds)
  }

  observe (sources: MetricSources): void { this.#sources = sources }

  reconfigure (servers: Iterable<string>, tenants: Iterable<string>): void {
    this.#servers = new Set(servers)
    this.#tenants = new Set(tenants)
    this.#sessions.clear()
  }

  instrumentRedis (redis: Redis): void {
    // A standalone client and a Cluster both route every command through sendCommand (their
    // trailing arguments differ; they are passed on untouched).
    const target = redis as unknown as { sendCommand: (command: Command, ...rest: unknown[]) => unknown }
    const send = target.sendCommand.bind(target)
    // A command can pass through sendCommand again (offline queue flush, resend after a
    // reconnect): it is timed once, from its first pass, as its caller waits.
    const timed = new WeakSet<object>()
    target.sendCommand = (command, ...rest) => {
      if (timed.has(command)) return send(command, ...rest)
      timed.add(command)
      const startedAt = performance.now()
      const result = send(command, ...rest)
      const name = typeof command.name === 'string' && /^[a-z]{1,24}$/i.test(command.name) ? command.name.toLowerCase() : OTHER
      command.promise?.then(
        () => { this.#redisDuration.get(name)((performance.now() - startedAt) / 1000) },
        () => { this.#redisErrors.get(name)() }
      )
      return result
    }
  }

  instrumentBus (bus: Bus): Bus {
    return new InstrumentedBus(bus, kind => { this.#busSent.get(envelopeKind(kind))() }, (kind, lagMs) => {
      this.#busReceived.get(envelopeKind(kind))()
      if (lagMs >= 0) this.#busLag(lagMs / 1000)
    })
  }
}

/** An envelope on the wire carries its send time, so the receiver can tell the lag. */
type Stamped = Envelope & { sentAt?: number }

class InstrumentedBus implements Bus {
  constructor (
    readonly bus: Bus,
    readonly sent: (kind: string) => void,
    readonly received: (kind: string, lagMs: number) => void
  ) {}

  get ordered (): boolean { return this.bus.ordered }

  async start (replicaId: string, handler: EnvelopeHandler): Promise<void> {
    await this.bus.start(replicaId, envelope => {
      const sentAt = (envelope as Stamped).sentAt
      this.received(envelope.kind, typeof sentAt === 'number' ? Date.now() - sentAt : -1)
      handler(envelope)
    })
  }

  async send (replicaId: string, envelope: Envelope): Promise<void> {
    this.sent(envelope.kind)
    const stamped: Stamped = { ...envelope, sentAt: Date.now() }
    await this.bus.send(replicaId, stamped)
  }

  prepareWake (replicaId: string, sid: string, streamId: string, json: string): PreparedWake | undefined {
    // Stamped like a sent envelope; counted once the event log wrote it.
    const prepared = this.bus.prepareWake(replicaId, sid, streamId, json, { sentAt: Date.now() })
    return prepared === undefined ? undefined : { ...prepared, sent: () => { this.sent('wake') } }
  }

  async takeUnread (dead: string, sid: string, servedBy: string): Promise<DeliverEnvelope[]> {
    return await this.bus.takeUnread(dead, sid, servedBy)
  }

  async close (): Promise<void> { await this.bus.close() }
}

/** The metrics of one gateway instance: a registry of its own, or NO_METRICS when off. */
export function createMetrics (options: { enabled: boolean, servers: Iterable<string>, tenants?: Iterable<string> }): GatewayMetrics {
  return options.enabled ? new PromMetrics(options.servers, options.tenants ?? []) : NO_METRICS
}
