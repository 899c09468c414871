// A 2026-07-28 tools/call on a pooled server whose 2025-era backend runs the tool as a task of its
// own (2025-11-25 Tasks: `execution.taskSupport` "required" or "optional", task-augmented
// `tools/call`), for a client that declared io.modelcontextprotocol/tasks (docs/behaviour.md
// "2026-07-28 Tasks"). The gateway makes the backend's task on a pooled connection, hands the client
// a task of its own (the record written first, as for a hosted task), and follows the backend's task
// on that same connection with `tasks/result`, which the backend answers once the task ended: its
// result or error becomes the record's outcome. The backend's mid-task asks (elicitation, sampling)
// arrive on that request, so they become the task's inputRequests, answered with tasks/update.
// tasks/cancel cancels the backend's task (2025 `tasks/cancel` on its connection).
// A client that did not declare the extension calling a "required" tool gets -32021 (SEP-2663).
import { isRecord, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../core/jsonrpc.js'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../core/errors.js'
import type { ConnectionPool } from '../routing/upstream/pool.js'
import type { ParkedCalls } from '../routing/upstream/mrtr.js'
import { Exchange } from './modern-exchange.js'
import { HostingSink } from './modern-task-host.js'
import type { ResponseSink } from './modern-response.js'
import { legacyParams, type RequestEnvelope } from './modern-rules.js'
import { declaresTasks, missingTasksCapability, withTasksExtension, type HostCaller, type ModernTasks } from './modern-tasks.js'

/** How long a server's tool list is trusted for its tools' task support. */
const TOOLS_TTL_MS = 30_000
/** The ttl asked of the backend's task when the server configures none. */
const DEFAULT_TTL_MS = 3_600_000

export interface TaskBridgeOptions {
  pool: ConnectionPool
  parked: ParkedCalls
  tasks: ModernTasks
}

/** One request to bridge: the client's call and where it goes. */
export interface BridgedCall {
  out: ResponseSink
  request: JsonRpcRequest
  envelope: RequestEnvelope
  caller: HostCaller
  serverInfo: Record<string, unknown>
}

/** Answers one pooled request whose answer is all that matters (tools/list, tools/call with a task). */
async function ask (pool: ConnectionPool, server: string, tenant: string | null, build: (key: string) => JsonRpcRequest, connectionId?: string): Promise<{ answer: JsonRpcResponse, connectionId: string }> {
  const reservation = connectionId === undefined ? await pool.reserve(server, tenant) : await pool.reserveOn(server, tenant, connectionId)
  return await new Promise(resolve => {
    const call = reservation.run(build, {
      onMessage (message: JsonRpcMessage) {
        // A backend that asks before its task exists gets no client to ask: refused.
        if ('method' in message && 'id' in message) call.answer({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `${message.method} is not available before the task exists` } })
        else if (!('method' in message)) resolve({ answer: message, connectionId: call.connectionId })
      }
    })
  })
}

export class TaskBridge {
  readonly #options: TaskBridgeOptions
  /** `taskSupport` of each tool, per (server, tenant), with when it was read. */
  readonly #support = new Map<string, { at: number, tools: Promise<Map<string, string>> }>()
  /** The gateway's task of each backend task followed here, by connection id and backend task id. */
  readonly #following = new Map<string, HostingSink>()

  constructor (options: TaskBridgeOptions) {
    this.#options = options
    // The backend's notifications/tasks/status of a task followed here (its statusMessage as it
    // goes) become the gateway's task's; what no bridged task here names is left to the others.
    options.pool.watchTasks({
      message: (connectionId, message) => {
        if (!('method' in message) || message.method !== 'notifications/tasks/status' || !isRecord(message.params)) return false
        const sink = this.#following.get(followKey(connectionId, message.params.taskId))
        sink?.said(message.params.status, message.params.statusMessage)
        return sink !== undefined
      },
      lost: () => {}
    })
  }

  /** The tool's 2025 `execution.taskSupport` ("forbidden" when unknown). */
  async #taskSupport (server: string, tenant: string | null, tool: string): Promise<string> {
    const key = `${server}\0${tenant ?? ''}`
    let known = this.#support.get(key)
    if (known === undefined || Date.now() - known.at > TOOLS_TTL_MS) {
      const tools = ask(this.#options.pool, server, tenant, id => ({ jsonrpc: '2.0', id, method: 'tools/list', params: {} })).then(({ answer }) => {
        const list = 'result' in answer && isRecord(answer.result) && Array.isArray(answer.result.tools) ? answer.result.tools : []
        return new Map(list.filter(isRecord).map(t => [String(t.name), isRecord(t.execution) && typeof t.execution.taskSupport === 'string' ? t.execution.taskSupport : 'forbidden']))
      })
      known = { at: Date.now(), tools }
      this.#support.set(key, known)
      tools.catch(() => { if (this.#support.get(key) === known) this.#support.delete(key) })
    }
    return (await known.tools).get(tool) ?? 'forbidden'
  }

  /**
   * Serves the call when its tool runs as a backend task (true), or leaves it to the usual pooled
   * call (false, nothing written).
   */
  async serve (call: BridgedCall): Promise<boolean> {
    const { request, envelope, caller, out } = call
    const params = isRecord(request.params) ? request.params : {}
    if (request.method !== 'tools/call' || typeof params.name !== 'string' || params.requestState !== undefined) return false
    const support = await this.#taskSupport(caller.server, caller.tenant, params.name)
    if (support !== 'required' && support !== 'optional') return false
    if (!declaresTasks(envelope)) {
      if (support !== 'required') return false
      out.finish(missingTasksCapability(request.id), 400)
      return true
    }
    const { pool, parked, tasks } = this.#options
    const settings = tasks.settings(caller.server)
    const outgoing: Record<string, unknown> = { ...legacyParams(params), task: { ttl: settings?.ttlMs ?? DEFAULT_TTL_MS } }
    delete outgoing.inputResponses
    const created = await ask(pool, caller.server, caller.tenant, id => ({ jsonrpc: '2.0', id, method: 'tools/call', params: outgoing }))
    const answer = created.answer
    const backendTask = 'result' in answer && isRecord(answer.result) && isRecord(answer.result.task) ? answer.result.task : undefined
    if (backendTask === undefined || typeof backendTask.taskId !== 'string') {
      // No task made (an error, or the backend answered at once): that answer is the call's.
      const exchange = new Exchange(parked, out, request, envelope, caller.server, caller.principal, call.serverInfo, {})
      exchange.onMessage({ ...answer, id: 'bridge' })
      return true
    }
    const backendId = backendTask.taskId
    const connectionId = created.connectionId
    const cancelBackend = (): void => {
      ask(pool, caller.server, caller.tenant, id => ({ jsonrpc: '2.0', id, method: 'tasks/cancel', params: { taskId: backendId } }), connectionId).catch(() => {})
    }
    // The gateway's task is handed out at once (hostAfterMs 0), and follows the backend's.
    const sink = tasks.host(out, request, envelope, { ...caller, resumable: true }, {
      hostAfterMs: 0,
      ttlMs: typeof backendTask.ttl === 'number' ? backendTask.ttl : settings?.ttlMs ?? DEFAULT_TTL_MS,
      pollIntervalMs: typeof backendTask.pollInterval === 'number' ? backendTask.pollInterval : settings?.pollIntervalMs ?? 1000
    }, cancelBackend)
    const exchange = new Exchange(parked, sink, request, envelope, caller.server, caller.principal, call.serverInfo, {})
    const key = followKey(connectionId, backendId)
    if (sink instanceof HostingSink) this.#following.set(key, sink)
    try {
      const reservation = await pool.reserveOn(caller.server, caller.tenant, connectionId)
      // Followed until tasks/result answers (the task ended, or its connection did).
      const followed = { onMessage: (message: JsonRpcMessage): void => { if (!('method' in message)) this.#following.delete(key); exchange.onMessage(message) } }
      exchange.start(reservation.run(id => ({ jsonrpc: '2.0', id, method: 'tasks/result', params: { taskId: backendId } }), followed))
    } catch (err) {
      this.#following.delete(key)
      cancelBackend()
      sink.fail(new GW_ERR_BACKEND_UNAVAILABLE(caller.server, `the task's connection cannot be reached: ${err instanceof Error ? err.message : String(err)}`), request.id)
    }
    return true
  }
}

function followKey (connectionId: string, backendId: unknown): string {
  return `${connectionId}\0${String(backendId)}`
}

/**
 * A legacy server's capabilities as a modern server states them: the same (its `resources.subscribe`
 * means listen streams can name resources; the gateway subscribes upstream for them), but its
 * 2025-11-25 `tasks` slot, which this era replaced with the Tasks extension: offered when its
 * tools/call may be a task (bridged, above).
 */
export function modernCapabilities (legacy: Record<string, unknown>): Record<string, unknown> {
  const { tasks: _, ...rest } = legacy
  return bridgeable(legacy) ? withTasksExtension(rest) : rest
}

/** Whether a 2025-era backend's tools/call may be task-augmented (2025-11-25 `tasks.requests.tools.call`). */
export function bridgeable (capabilities: Record<string, unknown>): boolean {
  const tasks = capabilities.tasks
  return isRecord(tasks) && isRecord(tasks.requests) && isRecord(tasks.requests.tools) && isRecord(tasks.requests.tools.call)
}
