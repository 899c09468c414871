// Tasks as clients see them (MCP 2025-11-25, "Tasks"), observed where every message for a client
// passes (ClientStreams.append) and where every client message enters (Router.fromClient), so
// dedicated, aggregate and pooled sessions are seen alike, under the ids their clients see, and no
// session is asked its kind. From what passes it keeps:
// - the session's task view (state/session-tasks.ts) that the console shows;
// - mcpgw_tasks_created_total and mcpgw_task_status_transitions_total (each move once per task:
//   the view's previous status decides, so a task polled on two replicas is counted once);
// - audit lines `task.created` (a CreateTaskResult reached its client) and `task.cancel` (a client
//   asked tasks/cancel), with tenant, subject digest, session digest, server and task id.
// It reads message shapes only (never bodies into logs) and never delays a message: its writes run
// after the append is under way, and a failure costs the view an entry, not the message.
import type { Logger } from 'pino'
import { principalOfRecord } from '../../auth/principal.js'
import { isRecord, type JsonRpcMessage } from '../../core/jsonrpc.js'
import type { SessionRecord, SessionStore } from '../../state/session-store.js'
import { MAX_SESSION_TASKS, type SessionTask, type SessionTasks } from '../../state/session-tasks.js'
import { audit } from '../../telemetry/audit.js'
import { shortHash } from '../../telemetry/logger.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'

/** Entries of the memos below before they are cleared (a bound, not a cache policy). */
const MEMO_MAX = 10_000

export interface TaskEventsOptions {
  store: SessionStore
  tasks: SessionTasks
  metrics: GatewayMetrics
  log: Logger
  /** How long a session's view lives after its last write (the session's idle timeout). */
  ttlMs: number
}

/** Who a session is, for metrics and audit lines. */
interface Owner { server: string, tenant: string | null, subject: string }

/** An MCP `Task`: the fields the view keeps. */
function asTask (value: unknown): SessionTask | undefined {
  if (!isRecord(value) || typeof value.taskId !== 'string' || typeof value.status !== 'string') return undefined
  const task: SessionTask = { taskId: value.taskId.slice(0, 256), status: value.status.slice(0, 32), seenAt: Date.now() }
  if (typeof value.statusMessage === 'string') task.statusMessage = value.statusMessage.slice(0, 512)
  if (typeof value.createdAt === 'string') task.createdAt = value.createdAt.slice(0, 64)
  if (typeof value.lastUpdatedAt === 'string') task.lastUpdatedAt = value.lastUpdatedAt.slice(0, 64)
  if (typeof value.ttl === 'number' || value.ttl === null) task.ttl = value.ttl
  if (typeof value.pollInterval === 'number') task.pollInterval = value.pollInterval
  return task
}

/**
 * The tasks a message for a client tells of, and whether it creates them: a CreateTaskResult
 * (`result.task`), a Task result (tasks/get, tasks/cancel), a tasks/list result, or a status
 * notification. A tool's result (`content`) is never read as one.
 */
export function tasksOf (message: JsonRpcMessage): { tasks: SessionTask[], created: boolean } | undefined {
  if ('result' in message) {
    const result = message.result
    if (!isRecord(result) || 'content' in result) return undefined
    if (isRecord(result.task)) {
      const task = asTask(result.task)
      return task === undefined ? undefined : { tasks: [task], created: true }
    }
    if (typeof result.taskId === 'string') {
      const task = asTask(result)
      return task === undefined ? undefined : { tasks: [task], created: false }
    }
    if (Array.isArray(result.tasks)) {
      const tasks = result.tasks.slice(0, MAX_SESSION_TASKS).map(asTask).filter((t): t is SessionTask => t !== undefined)
      return tasks.length === 0 ? undefined : { tasks, created: false }
    }
    return undefined
  }
  if ('method' in message && message.method === 'notifications/tasks/status') {
    const task = asTask(message.params)
    return task === undefined ? undefined : { tasks: [task], created: false }
  }
  return undefined
}

export class TaskEvents {
  readonly #options: TaskEventsOptions
  /** sid -> its owner, as last read (a record read per task event would be a store round trip each). */
  readonly #owners = new Map<string, Owner>()
  /** `sid \n taskId` -> what was last written for it here: a poll that changed nothing writes nothing. */
  readonly #written = new Map<string, string>()

  constructor (options: TaskEventsOptions) {
    this.#options = options
  }

  /** A message for a client (ClientStreams.append). Cheap when it is not about a task. */
  toClient (sid: string, message: JsonRpcMessage): void {
    const found = tasksOf(message)
    if (found !== undefined) for (const task of found.tasks) this.#seen(sid, task, found.created)
  }

  /** A client message (Router.fromClient): tasks/cancel is audited; a task-augmented request notes its session. */
  fromClient (record: SessionRecord, message: JsonRpcMessage): void {
    if (!('method' in message) || !('id' in message)) return
    const params = message.params
    if (message.method === 'tasks/cancel') {
      const taskId = isRecord(params) && typeof params.taskId === 'string' ? params.taskId.slice(0, 256) : null
      audit(this.#options.log, 'task.cancel', { ...principalOfRecord(record), server: record.server, session: shortHash(record.id), taskId })
    } else if (!isRecord(params) || params.task === undefined) {
      return
    }
    this.#remember(record.id, { server: record.server, ...principalOfRecord(record) })
  }

  /** The session ended: its view goes. */
  ended (sid: string): void {
    this.#owners.delete(sid)
    this.#options.tasks.forget(sid).catch(err => { this.#options.log.debug({ err }, 'task view not forgotten; it expires') })
  }

  #seen (sid: string, task: SessionTask, created: boolean): void {
    const key = `${sid}\n${task.taskId}`
    const state = `${task.status}\n${task.statusMessage ?? ''}\n${task.lastUpdatedAt ?? ''}`
    if (!created && this.#written.get(key) === state) return
    if (this.#written.size >= MEMO_MAX) this.#written.clear()
    this.#written.set(key, state)
    // Written now, in the order messages pass; who the session is may need a read, after. A view
    // that cannot be written (the store away) still leaves the audit line and the counts.
    const put = this.#options.tasks.put(sid, task, this.#options.ttlMs).catch((err: unknown) => {
      this.#options.log.warn({ err, sid: shortHash(sid) }, 'task view not written')
      return undefined
    })
    void put.then(async before => {
      // A CreateTaskResult is one response, appended once: it counts once. Its status may have
      // reached the view first (a status notification sent as the task started).
      if (!created && before === task.status) return
      const owner = await this.#owner(sid)
      if (owner === undefined) return
      if (created) {
        this.#options.metrics.taskCreated(owner.server, owner.tenant)
        audit(this.#options.log, 'task.created', { tenant: owner.tenant, subject: owner.subject, server: owner.server, session: shortHash(sid), taskId: task.taskId, status: task.status })
      }
      if (before !== task.status) this.#options.metrics.taskStatus(owner.server, task.status)
    }).catch(err => { this.#options.log.warn({ err, sid: shortHash(sid) }, 'task event not recorded') })
  }

  async #owner (sid: string): Promise<Owner | undefined> {
    const known = this.#owners.get(sid)
    if (known !== undefined) return known
    const record = await this.#options.store.get(sid)
    if (record === null) return undefined
    const owner = { server: record.server, ...principalOfRecord(record) }
    this.#remember(sid, owner)
    return owner
  }

  #remember (sid: string, owner: Owner): void {
    if (this.#owners.size >= MEMO_MAX) this.#owners.clear()
    this.#owners.set(sid, owner)
  }
}
