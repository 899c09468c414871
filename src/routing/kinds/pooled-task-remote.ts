// The task store's side of pooled sessions' tasks (MCP spec, "Tasks"; docs/architecture.md, "A
// pooled task across replicas"). A task lives in one replica's pool connection (pooled-tasks.ts
// keeps what only that replica can: the pin, the backend's id on that connection, the wakes); its
// record in the task store (state/task-store.ts) lets every replica answer for it:
//
// - whom it belongs to (tenant, subject digest, session): a request naming another's task gets
//   "unknown task", on every replica, exactly as for an id that never was;
// - which replica holds it: a request about it goes there (its answer reaches the client's stream
//   through the event log, wherever that stream is held);
// - its last status, written by that replica each time it learns one: tasks/list reads it;
// - a replica found gone: its live tasks are failed in the store, saying why, so they never stay
//   `working` and a request about them is answered from the store.
import { GW_ERR_BACKEND_LOST, GW_ERR_TASK_LIMIT, toJsonRpcError } from '../../core/errors.js'
import { errorResponse, isRecord, JSONRPC_INVALID_PARAMS, type JsonRpcMessage, type JsonRpcRequest } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import { isTerminalStatus, ownsTask, type TaskOutcome, type TaskOwner, type TaskRecord, type TaskStore } from '../../state/task-store.js'

/** How many live (not yet terminal) tasks one session may hold at once. */
export const MAX_LIVE_TASKS_PER_SESSION = 50
/** How many records of a session (or of a lost replica) one pass reads. */
const READ_LIMIT = 1000
/** How long a lost replica whose tasks were all found ended is not read again. */
const SETTLED_MS = 60_000

export interface RemoteTasksOptions {
  replicaId: string
  tasks: TaskStore
  /** Whether a replica's heartbeat is there (read from the store, not cached). */
  isAlive: (replica: string) => Promise<boolean>
}

/** Who the session's requests speak for. */
export function ownerOf (record: SessionRecord): TaskOwner {
  return { tenant: record.tenant ?? null, subjectDigest: record.subjectDigest ?? null, sessionId: record.id }
}

/** The error of a request naming a task the session does not own (the SDK's wording). */
export function unknownTask (request: JsonRpcRequest): JsonRpcMessage {
  const taskId = isRecord(request.params) ? request.params.taskId : undefined
  const message = request.method === 'tasks/get' ? 'Failed to retrieve task: Task not found' : `Task not found: ${String(taskId)}`
  return errorResponse(request.id, JSONRPC_INVALID_PARAMS, message)
}

export class RemoteTasks {
  readonly #options: RemoteTasksOptions
  /** Lost replicas with no live task left, and when they were found so. */
  readonly #settled = new Map<string, number>()

  constructor (options: RemoteTasksOptions) {
    this.#options = options
  }

  get store (): TaskStore { return this.#options.tasks }
  get replicaId (): string { return this.#options.replicaId }

  /** The session's record of a task (null: unknown, expired, or someone else's). */
  async find (session: SessionRecord, taskId: unknown): Promise<TaskRecord | null> {
    if (typeof taskId !== 'string' || taskId.length === 0 || taskId.length > 200) return null
    const record = await this.#options.tasks.get(taskId)
    return record !== null && ownsTask(record, ownerOf(session)) ? record : null
  }

  /** The session's records, oldest first (its own only). */
  async ofSession (session: SessionRecord): Promise<TaskRecord[]> {
    const owner = ownerOf(session)
    return (await this.#options.tasks.ofSession(session.id, READ_LIMIT)).filter(record => ownsTask(record, owner))
  }

  /**
   * Where a request about one of the session's tasks goes: the live replica that holds it, when
   * that is another one; undefined when this replica answers it (it holds the task, the task is
   * unknown, or it is over and its answer is in the store).
   */
  async replicaFor (session: SessionRecord, request: JsonRpcRequest): Promise<string | undefined> {
    if (request.method === 'tasks/list' || !isRecord(request.params)) return undefined
    const record = await this.find(session, request.params.taskId)
    return record === null ? undefined : await this.holderOf(record)
  }

  /** Whether a replica's heartbeat is there now. */
  async isAlive (replica: string): Promise<boolean> {
    return await this.#options.isAlive(replica)
  }

  /** The live replica, other than this one, that holds a task still running there (else undefined). */
  async holderOf (record: TaskRecord): Promise<string | undefined> {
    if (record.replica === this.#options.replicaId || record.outcome !== undefined) return undefined
    return await this.#options.isAlive(record.replica) ? record.replica : undefined
  }

  /** Refuses a new task when the session holds as many live ones as it may. */
  async admitTask (session: SessionRecord): Promise<void> {
    const live = (await this.ofSession(session)).filter(record => !isTerminalStatus(record.task.status))
    if (live.length >= MAX_LIVE_TASKS_PER_SESSION) throw new GW_ERR_TASK_LIMIT(MAX_LIVE_TASKS_PER_SESSION)
  }

  /**
   * The answer to a request about a task no live replica holds (its replica is gone, or it was
   * failed by the gateway): from the store, after failing it if its replica died with it live.
   */
  async answerFromStore (request: JsonRpcRequest, found: TaskRecord): Promise<JsonRpcMessage> {
    let record = found
    // Its replica is gone, or it is this one and the task is not held here (a record of a process
    // that had this replica's id before): nothing will ever end it but this.
    const here = record.replica === this.#options.replicaId
    if (record.outcome === undefined && !isTerminalStatus(record.task.status) && (here || !await this.#options.isAlive(record.replica))) {
      record = await this.failLost(record, here ? `replica ${record.replica} no longer holds it (it restarted)` : undefined) ?? record
    }
    const task = record.task
    switch (request.method) {
      case 'tasks/get':
        return { jsonrpc: '2.0', id: request.id, result: task }
      case 'tasks/cancel':
        if (isTerminalStatus(task.status)) return errorResponse(request.id, JSONRPC_INVALID_PARAMS, `Cannot cancel task in terminal status: ${String(task.status)}`)
        return lostAnswer(request, record, 'the replica holding the task cannot be reached')
      default: {
        const outcome = record.outcome
        if (outcome !== undefined && 'error' in outcome) return { jsonrpc: '2.0', id: request.id, error: outcome.error }
        if (outcome !== undefined) return { jsonrpc: '2.0', id: request.id, result: outcome.result }
        return lostAnswer(request, record, 'the replica holding the task cannot be reached')
      }
    }
  }

  /** A live task whose replica is gone: failed in the store, saying why (null: it expired meanwhile). */
  async failLost (record: TaskRecord, reason = `replica ${record.replica} is gone`): Promise<TaskRecord | null> {
    const task = { ...record.task, status: 'failed', statusMessage: `The gateway lost the replica that ran this task: ${reason}`, lastUpdatedAt: new Date().toISOString() }
    const outcome: TaskOutcome = { error: toJsonRpcError(new GW_ERR_BACKEND_LOST(record.server, reason), null).error }
    return await this.#options.tasks.update(record.id, { task, outcome, connectionId: null })
  }

  /**
   * Every replica that runs tasks and is gone: its live tasks are failed (every replica runs this
   * pass; a second failure of one task changes nothing, as a terminal status is kept).
   */
  async sweepLost (): Promise<number> {
    let failed = 0
    const now = Date.now()
    for (const [replica, at] of this.#settled) if (at + SETTLED_MS <= now) this.#settled.delete(replica)
    for (const replica of await this.#options.tasks.replicas()) {
      if (replica === this.#options.replicaId || this.#settled.has(replica) || await this.#options.isAlive(replica)) continue
      for (const record of await this.#options.tasks.ofReplica(replica, READ_LIMIT)) {
        if (record.outcome !== undefined || isTerminalStatus(record.task.status)) continue
        if (await this.failLost(record) !== null) failed++
      }
      this.#settled.set(replica, now)
    }
    return failed
  }
}

/** -32007 for a task whose replica (and backend connection) is gone. */
function lostAnswer (request: JsonRpcRequest, record: TaskRecord, reason: string): JsonRpcMessage {
  return toJsonRpcError(new GW_ERR_BACKEND_LOST(record.server, reason), request.id)
}
