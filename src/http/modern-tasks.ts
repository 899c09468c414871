// The 2026-07-28 Tasks extension (io.modelcontextprotocol/tasks, SEP-2663; docs/spec-rules.md M-18 to
// M-21) on the gateway's face:
// the tasks the gateway hosts itself (docs/behaviour.md "2026-07-28 Tasks"). A request declares the
// extension in its `_meta` client capabilities; a server offers it in `server/discover` when it
// hosts tasks (config `tasks`) or its 2026-07-28 backend offers its own.
//
// - host(): a tools/call that may become a hosted task (modern-task-host.ts).
// - answer(): tasks/get, tasks/update, tasks/cancel naming a task the gateway holds, on any replica,
//   from the task store. A task of another tenant or subject is unknown (-32602). A task whose
//   replica is gone ends failed. tasks/cancel and tasks/update reach the replica running the call
//   over the bus; tasks/update answers the inputRequests of a pooled call the backend made wait.
// Tasks of a 2026-07-28 backend are not the gateway's: their requests are relayed as they are.
import { GW_ERR_BACKEND_LOST, GW_ERR_MISSING_CAPABILITY, GW_ERR_SHUTTING_DOWN, toJsonRpcError, withData } from '../core/errors.js'
import { errorResponse, isRecord, JSONRPC_INVALID_PARAMS, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse } from '../core/jsonrpc.js'
import type { TaskHostingConfig } from '../config/schema.js'
import type { Envelope } from '../state/bus.js'
import { isTerminalStatus, ownsTask, type TaskOutcome, type TaskPatch, type TaskRecord, type TaskStore } from '../state/task-store.js'
import type { ParkedCalls } from '../routing/upstream/mrtr.js'
import { audit, type AuditLog } from '../telemetry/audit.js'
import { NO_METRICS, type GatewayMetrics } from '../telemetry/metrics.js'
import { Exchange } from './modern-exchange.js'
import { HostingSink, taskWith, type HostRegistry } from './modern-task-host.js'
import type { Peers, ResponseSink } from './modern-response.js'
import type { RequestEnvelope } from './modern-rules.js'

export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks'

/** The methods that name a task (SEP-2663); the Mcp-Name header mirrors their params.taskId. */
export const TASK_METHODS: ReadonlySet<string> = new Set(['tasks/get', 'tasks/update', 'tasks/cancel'])

/** Most records of a lost replica failed in one pass. */
const LOST_BATCH = 1000

/** Whether the request declared the Tasks extension in its client capabilities. */
export function declaresTasks (envelope: RequestEnvelope): boolean {
  const extensions = envelope.clientCapabilities.extensions
  return isRecord(extensions) && isRecord(extensions[TASKS_EXTENSION])
}

/** -32021 naming the extension (SEP-2663, "Capability Negotiation"). */
export function missingTasksCapability (id: JsonRpcRequest['id']): JsonRpcResponse {
  return toJsonRpcError(withData(new GW_ERR_MISSING_CAPABILITY(TASKS_EXTENSION), { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } }), id)
}

/** The capabilities `server/discover` states, with the extension offered. */
export function withTasksExtension (capabilities: Record<string, unknown>): Record<string, unknown> {
  const extensions = isRecord(capabilities.extensions) ? capabilities.extensions : {}
  return { ...capabilities, extensions: { ...extensions, [TASKS_EXTENSION]: {} } }
}

/** Who asks about a task. */
export interface TaskCaller {
  tenant: string | null
  subjectDigest: string | null
}

/** Who makes a call that may become a task, where. */
export interface HostCaller extends TaskCaller {
  server: string
  /** The principal's key (a parked call is bound to it). */
  principal: string
  /** Whether the backend's later input rounds can be answered by tasks/update (a pooled call). */
  resumable: boolean
}

export interface ModernTasksOptions {
  store: TaskStore
  peers: Peers
  /** A server's task hosting as configured now (live reload); undefined when off. */
  hosting: (server: string) => TaskHostingConfig | undefined
  /** Calls parked between input rounds (a hosted task's wait for tasks/update is one). */
  parked: ParkedCalls
  /** How long a task waits for tasks/update before it fails (the parked call's own lifetime). */
  inputWaitMs: number
  /** A hosted task's new state, for the listen streams that named it (any replica's). */
  notify: (server: string, tenant: string | null, message: JsonRpcNotification) => void
  warn: (err: unknown, msg: string) => void
  /** mcpgw_tasks_created_total and mcpgw_task_status_transitions_total, as the sessions' tasks count them. */
  metrics?: GatewayMetrics
  /** Where the task.created and task.cancel audit lines go. */
  auditLog?: AuditLog
}

/** Most task ids one listen stream may name. */
const MAX_LISTEN_TASKS = 100

/** A hosted task whose call waits, parked here, for tasks/update. */
interface Waiting {
  sink: HostingSink
  requestState: unknown
  timer: NodeJS.Timeout
}

/** An answer the face writes as it is. */
export interface TaskAnswer {
  status: number
  body: JsonRpcResponse
}

export class ModernTasks {
  readonly #options: ModernTasksOptions
  /** Hosted calls running on this replica, by task id: what cancels each. */
  readonly #running = new Map<string, () => void>()
  readonly #waiting = new Map<string, Waiting>()
  readonly #registry: HostRegistry

  constructor (options: ModernTasksOptions) {
    this.#options = options
    const { store, peers, warn } = options
    this.#registry = {
      replicaId: peers.replicaId,
      create: async record => {
        await store.create(record)
        this.#created(record)
      },
      running: (taskId, cancel) => { this.#running.set(taskId, cancel) },
      ended: (taskId, outcome, task) => {
        this.#running.delete(taskId)
        this.#store(taskId, outcome, task)
      },
      described: (taskId, task) => {
        // Not a status change of the gateway's task: published, not counted.
        store.update(taskId, { task }).then(record => { this.#published(record) }, err => { warn(err, 'bridged task status not stored') })
      },
      waiting: (taskId, requestState, task, sink) => { this.#wait(taskId, requestState, task, sink) },
      drop: (requestState, principal) => { try { options.parked.take(requestState, principal).onExpire() } catch {} },
      warn
    }
  }

  /** Whether `server` hosts tasks (its `server/discover` offers the extension). */
  hosts (server: string): boolean {
    return this.#options.hosting(server) !== undefined
  }

  /** The sink a pooled call writes to: `out` itself, or a host that may make the call a task. */
  host (out: ResponseSink, request: JsonRpcRequest, envelope: RequestEnvelope, caller: HostCaller, bridged?: TaskHostingConfig, onCancel?: () => void): ResponseSink {
    const settings = bridged ?? this.#options.hosting(caller.server)
    if (settings === undefined || request.method !== 'tools/call' || !declaresTasks(envelope)) return out
    return new HostingSink(out, { ...caller, request, envelope, settings, ...(onCancel !== undefined ? { onCancel } : {}) }, this.#registry)
  }

  /** The server's task hosting as configured now (undefined: off). */
  settings (server: string): TaskHostingConfig | undefined {
    return this.#options.hosting(server)
  }

  /**
   * tasks/get, tasks/update or tasks/cancel: answered here when the task is one the gateway holds
   * for `server`; null when it is not (a 2026-07-28 backend's own: relayed).
   */
  async answer (request: JsonRpcRequest, server: string, envelope: RequestEnvelope, caller: TaskCaller): Promise<TaskAnswer | null> {
    if (!TASK_METHODS.has(request.method)) return null
    const params = isRecord(request.params) ? request.params : {}
    const taskId = typeof params.taskId === 'string' ? params.taskId : ''
    if (!declaresTasks(envelope)) {
      // A server that relays its backend's tasks lets the backend say; one that hosts refuses (SEP-2663).
      return this.hosts(server) ? { status: 400, body: missingTasksCapability(request.id) } : null
    }
    let record = taskId === '' ? null : await this.#options.store.get(taskId)
    // Not a task the gateway hosts: a 2026-07-28 backend's own (relayed), or unknown (the server's kind says so).
    if (record === null || record.backendTaskId !== null || record.sessionId !== null) return null
    // Another caller's task, or another server's, is unknown to this one (never "forbidden").
    if (record.server !== server || !ownsTask(record, { ...caller, sessionId: null })) return unknown(request, taskId)
    if (!isTerminalStatus(record.task.status) && !await this.#runs(record)) record = await this.#lost(record) ?? record
    switch (request.method) {
      case 'tasks/get':
        return { status: 200, body: { jsonrpc: '2.0', id: request.id, result: { resultType: 'complete', ...detailed(record) } } }
      case 'tasks/cancel':
        if (!isTerminalStatus(record.task.status)) await this.#cancel(record)
        return ack(request)
      default: {
        // Keys not outstanding are ignored (SEP-2663): only a task waiting for input takes answers.
        const answers = params.inputResponses
        if (record.task.status !== 'input_required' || !isRecord(answers)) return ack(request)
        if (record.replica === this.#options.peers.replicaId) this.#resumeHere(record.id, answers)
        else await this.#options.peers.send(record.replica, { kind: 'task-update', taskId: record.id, inputResponses: answers }).catch(err => { this.#options.warn(err, 'task update not sent to the replica running it') })
        return ack(request)
      }
    }
  }

  /**
   * The task ids of a listen request's `notifications.taskIds` that name the caller's hosted tasks
   * of `server` (others are left out of the acknowledgement). Naming any without the extension
   * declared is -32021 (SEP-2663).
   */
  async listenable (server: string, wanted: unknown, envelope: RequestEnvelope, caller: TaskCaller): Promise<string[]> {
    if (!Array.isArray(wanted) || wanted.length === 0) return []
    if (!declaresTasks(envelope)) throw withData(new GW_ERR_MISSING_CAPABILITY(TASKS_EXTENSION), { requiredCapabilities: { extensions: { [TASKS_EXTENSION]: {} } } })
    const ids = [...new Set(wanted.filter((id): id is string => typeof id === 'string' && id.length <= 200))].slice(0, MAX_LISTEN_TASKS)
    const records = await Promise.all(ids.map(async id => await this.#options.store.get(id)))
    return records.filter((r): r is TaskRecord => r !== null && r.backendTaskId === null && r.sessionId === null && r.server === server && ownsTask(r, { ...caller, sessionId: null }))
      .map(r => r.id)
  }

  /** A bus envelope for this face (router.onModernEnvelope). */
  onEnvelope (envelope: Envelope): void {
    if (envelope.kind === 'task-cancel') this.#cancelHere(envelope.taskId)
    if (envelope.kind === 'task-update') this.#resumeHere(envelope.taskId, envelope.inputResponses)
  }

  /**
   * A replica is gone (the heartbeat watch found it): the hosted tasks it ran end failed, as their
   * calls died with it.
   */
  async replicaGone (replica: string): Promise<void> {
    const records = await this.#options.store.ofReplica(replica, LOST_BATCH)
    for (const record of records) {
      if (record.backendTaskId === null && record.sessionId === null && !isTerminalStatus(record.task.status)) await this.#lost(record)
    }
  }

  /**
   * This replica stops (a graceful shutdown): the hosted calls it runs (bridged ones included) die
   * with it, so their tasks end failed now, saying why, rather than `working` until another
   * replica finds the heartbeat missing. Awaited before the pool and the store close.
   */
  async shutdown (): Promise<void> {
    const ids = [...new Set([...this.#running.keys(), ...this.#waiting.keys()])]
    for (const waiting of this.#waiting.values()) clearTimeout(waiting.timer)
    this.#running.clear()
    this.#waiting.clear()
    const err = toJsonRpcError(new GW_ERR_SHUTTING_DOWN(), null).error
    const message = `The gateway replica ${this.#options.peers.replicaId} running the task shut down`
    await Promise.all(ids.map(async taskId => {
      const record = await this.#options.store.get(taskId)
      if (record === null || isTerminalStatus(record.task.status)) return
      await this.#update(taskId, { task: taskWith(record.task, 'failed', message), outcome: { error: err } })
    }).map(async failing => { await failing.catch(e => { this.#options.warn(e, 'hosted task not failed at shutdown') }) }))
  }

  /** Whether the call of a live task still runs (here, or on a replica that is alive). */
  async #runs (record: TaskRecord): Promise<boolean> {
    const { peers } = this.#options
    if (record.replica === peers.replicaId) return this.#running.has(record.id)
    return await peers.isAlive(record.replica)
  }

  async #lost (record: TaskRecord): Promise<TaskRecord | null> {
    const err = toJsonRpcError(new GW_ERR_BACKEND_LOST(record.server, `replica ${record.replica} running the task is gone`), null).error
    return await this.#update(record.id, { task: taskWith(record.task, 'failed', err.message), outcome: { error: err } })
  }

  /**
   * Changes a record and publishes it. A status it takes on is counted once, by the replica whose
   * change it was: a terminal status the store kept makes the patch's a no-op, and nothing is counted.
   */
  async #update (taskId: string, patch: TaskPatch): Promise<TaskRecord | null> {
    const record = this.#published(await this.#options.store.update(taskId, patch))
    const status = patch.task?.status
    if (record !== null && typeof status === 'string' && record.task.status === status) this.#metrics.taskStatus(record.server, status)
    return record
  }

  get #metrics (): GatewayMetrics { return this.#options.metrics ?? NO_METRICS }

  #created (record: TaskRecord): void {
    this.#metrics.taskCreated(record.server, record.tenant)
    if (typeof record.task.status === 'string') this.#metrics.taskStatus(record.server, record.task.status)
    if (this.#options.auditLog !== undefined) audit(this.#options.auditLog, 'task.created', { tenant: record.tenant, subject: record.subjectDigest ?? undefined, server: record.server, taskId: record.id, status: record.task.status, hosted: record.backendTaskId === null })
  }

  /** A changed record's task to the listen streams that named it (SEP-2663 notifications/tasks). */
  #published (record: TaskRecord | null): TaskRecord | null {
    if (record !== null) this.#options.notify(record.server, record.tenant, { jsonrpc: '2.0', method: 'notifications/tasks', params: detailed(record) })
    return record
  }

  async #cancel (record: TaskRecord): Promise<void> {
    const { peers, warn } = this.#options
    // The status first: a tasks/get on any replica sees `cancelled` from the ack on, and the call's
    // late answer cannot change it (a terminal status is kept).
    if (this.#options.auditLog !== undefined) audit(this.#options.auditLog, 'task.cancel', { tenant: record.tenant, subject: record.subjectDigest ?? undefined, server: record.server, taskId: record.id })
    await this.#update(record.id, { task: taskWith(record.task, 'cancelled', 'cancelled by the client') })
    if (record.replica === peers.replicaId) {
      this.#cancelHere(record.id)
      return
    }
    await peers.send(record.replica, { kind: 'task-cancel', taskId: record.id }).catch(err => { warn(err, 'task cancel not sent to the replica running it') })
  }

  #wait (taskId: string, requestState: unknown, task: Record<string, unknown>, sink: HostingSink): void {
    const timer = setTimeout(() => {
      if (this.#waiting.get(taskId)?.sink !== sink) return
      this.#waiting.delete(taskId)
      this.#running.delete(taskId)
      // The parked call is cancelled by its own expiry (ParkedCalls) at about this time.
      const error = { code: -32603, message: `no tasks/update answered the task's input requests within ${this.#options.inputWaitMs} ms` }
      this.#store(taskId, { error }, taskWith(task, 'failed', error.message))
    }, this.#options.inputWaitMs)
    timer.unref()
    this.#waiting.set(taskId, { sink, requestState, timer })
    this.#update(taskId, { task }).catch(err => { this.#options.warn(err, 'hosted task status not stored') })
  }

  /** tasks/update for a task whose call is parked here: its answers go to the backend, the call goes on. */
  #resumeHere (taskId: string, inputResponses: Record<string, unknown>): void {
    const waiting = this.#waiting.get(taskId)
    if (waiting === undefined) return
    this.#waiting.delete(taskId)
    clearTimeout(waiting.timer)
    const { sink, requestState } = waiting
    const hosted = sink.hosted
    const { store, parked, warn } = this.#options
    store.get(taskId).then(async record => {
      if (record === null || record.task.status !== 'input_required') return
      await this.#update(taskId, { task: taskWith(record.task, 'working') })
      const call = parked.take(requestState, hosted.principal)
      sink.rearm()
      new Exchange(parked, sink, hosted.request, hosted.envelope, call.server, hosted.principal, call.serverInfo, {}).resume(call, inputResponses)
    }).catch(err => { warn(err, 'hosted task not resumed') })
  }

  #cancelHere (taskId: string): void {
    const waiting = this.#waiting.get(taskId)
    if (waiting !== undefined) {
      // A parked call: taken and cancelled (its exchange is not listening).
      this.#waiting.delete(taskId)
      clearTimeout(waiting.timer)
      this.#registry.drop(waiting.requestState, waiting.sink.hosted.principal)
      waiting.sink.hosted.onCancel?.()
    }
    const cancel = this.#running.get(taskId)
    this.#running.delete(taskId)
    cancel?.()
  }

  #store (taskId: string, outcome: TaskOutcome, task: Record<string, unknown>): void {
    this.#update(taskId, { task, outcome }).catch(err => { this.#options.warn(err, 'hosted task outcome not stored') })
  }
}

/** The task as tasks/get shows it (SEP-2663 DetailedTask): the result or error inline once it ended. */
function detailed (record: TaskRecord): Record<string, unknown> {
  const task = { ...record.task }
  const outcome = record.outcome
  if (task.status === 'completed' && outcome !== undefined && 'result' in outcome) return { ...task, result: withoutResultType(outcome.result) }
  if (task.status === 'failed') return { ...task, error: outcome !== undefined && 'error' in outcome ? outcome.error : { code: -32603, message: 'the task failed' } }
  return task
}

/** The inlined result is the request's result; its discriminator belonged to the response that carried it. */
function withoutResultType (result: Record<string, unknown>): Record<string, unknown> {
  const { resultType: _, ...rest } = result
  return rest
}

function ack (request: JsonRpcRequest): TaskAnswer {
  return { status: 200, body: { jsonrpc: '2.0', id: request.id, result: { resultType: 'complete' } } }
}

function unknown (request: JsonRpcRequest, taskId: string): TaskAnswer {
  return { status: 200, body: errorResponse(request.id, JSONRPC_INVALID_PARAMS, `Unknown task: ${JSON.stringify(taskId.slice(0, 200))}`) }
}
