// The client's task requests of pooled sessions (MCP spec, "Tasks"; docs/architecture.md, "A pooled
// call"): tasks/get, tasks/result, tasks/list and tasks/cancel, answered from the records
// (pooled-tasks.ts) and the one pool connection that holds each task; a session sees and names only
// its own tasks. What the pool's connections send about a task reaches its session's stream here,
// under the session's id.
//
// Every task has a record in the task store (pooled-task-remote.ts), written before the client
// sees its id: a request about a task held by another replica is passed there (the admission
// names that replica, so the request's marker does too, and its loss answers it -32007), and one
// about a task no live replica holds is answered from its record.
//
// tasks/result is waited for here (status notifications, else tasks/get every pollInterval) and
// sent to the backend only once the task is terminal or needs input: a connection runs one request
// at a time, and a tasks/result blocking it for the task's whole life would hold up every other
// request that needs that connection.
import type { Logger } from 'pino'
import { GW_ERR_BACKEND_UNAVAILABLE, isGatewayError, toJsonRpcError } from '../../core/errors.js'
import { errorResponse, isRecord, isResponse, JSONRPC_INVALID_PARAMS, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId } from '../../core/jsonrpc.js'
import { GET_STREAM, LEGACY_STREAM } from '../../state/event-log.js'
import type { SessionRecord } from '../../state/session-store.js'
import type { ConnectionPool } from '../upstream/pool.js'
import { asGatewayError } from '../upstream/relay.js'
import { shortHash } from '../../telemetry/logger.js'
import type { TaskRecord } from '../../state/task-store.js'
import { unknownTask, type RemoteTasks } from './pooled-task-remote.js'
import { ForwardedTaskRequests } from './pooled-task-forwarded.js'
import { isTerminal, PooledTasks, relatedTaskOf, withTaskIds, type PooledTask } from './pooled-tasks.js'

/** Bounds of how often a waiting tasks/result asks the backend (the task's pollInterval, else a second). */
const TASK_POLL_MS = { min: 250, max: 5_000, default: 1_000 }
/** How long tasks/list waits for a task's connection to refresh its status before answering the last one known. */
const LIST_REFRESH_MS = 2_000

/** A request waiting here, known to the session's calls (a cancellation or the session's end settles it). */
export interface TrackedCall {
  /** False once it was settled (by the client's cancellation, the session's end, or settle()). */
  current (): boolean
  settle (): void
}

/** What the task requests need of the pooled sessions that run them (PooledSessions). */
export interface TaskRequestHost {
  readonly pool: ConnectionPool
  /** The task store, as this kind reads it. */
  readonly remote: RemoteTasks
  readonly log: Logger
  /** Passes a client's task request to the replica that holds the task (its answer goes to `streamId` from there). */
  forward (replica: string, sid: string, streamId: string, request: JsonRpcRequest): Promise<void>
  /** Appends to a client stream's log (failures are logged there). */
  append (sid: string, streamId: string, message: JsonRpcMessage): void
  /** Appends an answer unless the stream's log holds one to its request already. */
  answerOnce (sid: string, streamId: string, message: JsonRpcMessage): Promise<void>
  /** Records a request waiting here among the session's calls. */
  track (sid: string, clientId: RequestId, streamId: string, connectionId: string): TrackedCall
  /** Runs a client's request on the connection `connectionId`, as any request of the session. */
  run (record: SessionRecord, request: JsonRpcRequest, streamId: string, connectionId: string): void
}

export class PooledTaskRequests {
  readonly #host: TaskRequestHost
  readonly #tasks: PooledTasks
  readonly #unwatch: () => void
  /** Requests passed to a task's holder with no marker naming it (pooled-task-forwarded.ts). */
  readonly #forwarded: ForwardedTaskRequests

  constructor (host: TaskRequestHost) {
    this.#host = host
    this.#forwarded = new ForwardedTaskRequests({ isAlive: async replica => await host.remote.isAlive(replica), answerOnce: host.answerOnce, log: host.log })
    this.#tasks = new PooledTasks(task => { void this.#stored(task) })
    this.#unwatch = host.pool.watchTasks({
      message: (connectionId, message) => this.#taskNotification(connectionId, message),
      lost: (connectionId, reason) => { this.#tasks.lost(connectionId, reason) }
    })
  }

  /**
   * A client's task request: its answer (or error) goes to `streamId`. `forwarded`: another
   * replica passed it here, as the task's holder; it is never passed on again.
   */
  request (record: SessionRecord, request: JsonRpcRequest, streamId: string, forwarded = false): void {
    this.#taskRequest(record, request, streamId, forwarded).catch(err => {
      this.#host.append(record.id, streamId, toJsonRpcError(asGatewayError(err, record.server), request.id))
    })
  }

  /** The client's answer to a task's request (its elicitation), naming the task by the backend's id again. */
  answerForBackend (sid: string, response: JsonRpcResponse): JsonRpcResponse {
    return withTaskIds(response, taskId => this.#tasks.of(sid, taskId)?.backendId) as JsonRpcResponse
  }

  /** A backend message of a call on `connectionId`, in the session's task ids (undefined: dropped). */
  forClient (sid: string, connectionId: string | null, message: JsonRpcMessage): JsonRpcMessage | undefined {
    return withTaskIds(message, this.#taskIdsOf(sid, connectionId))
  }

  /**
   * A CreateTaskResult of a call on `connectionId`: the task recorded (here, and in the task store
   * before the client sees its id), shown under the session's id.
   */
  async created (record: SessionRecord, connectionId: string | null, response: JsonRpcResponse & { result: Record<string, unknown> }): Promise<JsonRpcResponse> {
    const described = response.result.task
    if (connectionId === null || !isRecord(described)) return response
    const tenant = record.tenant ?? null
    const task = this.#tasks.record({
      sid: record.id,
      tenant,
      subject: record.subjectDigest ?? null,
      server: record.server,
      connectionId,
      stream: record.transport === 'legacy' ? LEGACY_STREAM : GET_STREAM,
      task: described,
      pin: () => this.#host.pool.pin(record.server, tenant, connectionId, record.subjectDigest)
    })
    if (task === undefined) return response
    const view = this.#tasks.view(task)
    const now = Date.now()
    const stored: TaskRecord = {
      id: task.id,
      tenant,
      subjectDigest: record.subjectDigest ?? null,
      sessionId: record.id,
      server: record.server,
      replica: this.#host.remote.replicaId,
      connectionId,
      backendTaskId: task.backendId,
      task: view,
      createdAt: now,
      expiresAt: task.expiresAt
    }
    try {
      await this.#host.remote.store.create(stored)
    } catch (err) {
      // A task nobody could find again on another replica: it is not shown, and the backend stops it.
      if (live(task)) this.#askTask(task, 'tasks/cancel').catch(() => {})
      this.#tasks.forget(task)
      return toJsonRpcError(asGatewayError(err, record.server), response.id ?? null)
    }
    // A status learnt while the record was being written found no record to change: written now.
    if (JSON.stringify(this.#tasks.view(task)) !== JSON.stringify(view)) void this.#stored(task)
    const shown = withTaskIds(response, this.#taskIdsOf(record.id, connectionId)) as JsonRpcResponse & { result: Record<string, unknown> }
    return { ...shown, result: { ...shown.result, task: this.#tasks.view(task) } }
  }

  /** The session ended: nobody can name its tasks any more, so the backend stops working on them. */
  sessionEnded (sid: string): void {
    for (const task of this.#tasks.ofSession(sid)) {
      if (live(task)) this.#askTask(task, 'tasks/cancel').catch(() => {})
      this.#host.remote.store.delete(task.id).catch(() => {})
    }
    this.#tasks.forgetSession(sid)
    this.#forwarded.sessionEnded(sid)
  }

  /** A task-augmented tools/call while the session holds as many live tasks as it may: refused, its error sent. */
  async refusesNew (record: SessionRecord, request: JsonRpcRequest, streamId: string): Promise<boolean> {
    if (request.method !== 'tools/call' || !isRecord(request.params) || !isRecord(request.params.task)) return false
    try {
      await this.#host.remote.admitTask(record)
      return false
    } catch (err) {
      this.#host.append(record.id, streamId, toJsonRpcError(asGatewayError(err, record.server), request.id))
      return true
    }
  }

  /** Whether the session's task `taskId` is held here (no need to read its record to route it). */
  holds (sid: string, request: JsonRpcRequest): boolean {
    return isRecord(request.params) && this.#tasks.of(sid, request.params.taskId) !== undefined
  }

  /** The sessions whose tasks are held here (the sweep checks they still exist). */
  sessions (): string[] {
    return [...this.#tasks.sessions()]
  }

  stop (): void {
    this.#unwatch()
    this.#forwarded.stop()
    this.#tasks.stop()
  }

  /**
   * This replica stops gracefully: the tasks it holds die with its pool connections, so they end
   * failed now, in the store too (awaited), rather than `working` until another replica finds
   * this one's heartbeat missing.
   */
  async shutdown (replicaId: string): Promise<void> {
    const failed = this.#tasks.shutdown(`The gateway replica ${replicaId} holding this task shut down`)
    await Promise.all(failed.map(async task => { await this.#stored(task) }))
  }

  /** A task's status changed here: its record follows (tasks/list and other replicas read it). */
  async #stored (task: PooledTask): Promise<void> {
    const view = this.#tasks.view(task)
    const lost = task.lost === undefined ? {} : { outcome: { error: toJsonRpcError(new GW_ERR_BACKEND_UNAVAILABLE(task.server, task.lost), null).error }, connectionId: null }
    await this.#host.remote.store.update(task.id, { task: view, ...lost }).then(() => {}, err => {
      this.#host.log.warn({ err, sid: shortHash(task.sid) }, 'task status not written to the task store')
    })
  }

  /** tasks/get, tasks/result, tasks/list, tasks/cancel of a pooled session: only its own tasks, on the connection that holds each. */
  async #taskRequest (record: SessionRecord, request: JsonRpcRequest, streamId: string, forwarded: boolean): Promise<void> {
    const sid = record.id
    const params = isRecord(request.params) ? request.params : {}
    const send = (message: JsonRpcMessage): void => { this.#host.append(sid, streamId, message) }
    const reply = (result: Record<string, unknown>): void => { send({ jsonrpc: '2.0', id: request.id, result }) }
    if (request.method === 'tasks/list') {
      // The gateway hands out no cursor: every task of the session comes in one page.
      if (params.cursor !== undefined) { send(errorResponse(request.id, JSONRPC_INVALID_PARAMS, 'Invalid cursor')); return }
      // The session's tasks wherever they run (the store), those held here asked afresh; those
      // held elsewhere as their replica last wrote them.
      const records = await this.#host.remote.ofSession(record)
      await Promise.all(this.#tasks.ofSession(sid).filter(live).map(async task => { await this.#refresh(task, LIST_REFRESH_MS) }))
      reply({ tasks: records.map(stored => { const here = this.#tasks.of(sid, stored.id); return here !== undefined ? this.#tasks.view(here) : stored.task }) })
      return
    }
    const task = this.#tasks.of(sid, params.taskId)
    if (task === undefined) {
      // Not held here: its record says whose it is and where it runs. What a backend answers for a
      // task it does not know (the SDK's wording) is the answer for another's task, too.
      const stored = await this.#host.remote.find(record, params.taskId)
      if (stored === null) { send(unknownTask(request)); return }
      const replica = forwarded ? undefined : await this.#host.remote.holderOf(stored)
      if (replica !== undefined) {
        // Passed on here (legacy, a batch): its marker, if any, names this replica, so this
        // replica answers it should the holder die first.
        this.#forwarded.watch({ sid, streamId, id: request.id, replica, server: stored.server, until: stored.expiresAt })
        await this.#host.forward(replica, sid, streamId, request)
        return
      }
      send(await this.#host.remote.answerFromStore(request, stored))
      return
    }
    switch (request.method) {
      case 'tasks/get': {
        if (!live(task)) { reply(this.#tasks.view(task)); return }
        let busy = false
        const answer = await this.#askTask(task, 'tasks/get').catch((err: unknown) => {
          busy = isGatewayError(err) && err.code === 'GW_ERR_POOL_BUSY'
          // The connection died under the request, or was found dead, before the pool reported it
          // lost: the task is failed now (as that report would do; a child started again knows no
          // task of the one that died), and tasks/get answers its status, not -32007.
          if (isGatewayError(err) && (err.code === 'GW_ERR_BACKEND_LOST' || err.code === 'GW_ERR_BACKEND_UNAVAILABLE')) this.#tasks.lost(task.connectionId, err.message)
          return toJsonRpcError(asGatewayError(err, task.server), request.id)
        })
        // Its connection stayed busy past poolWaitMs (a long request of another session): the
        // status last known (its notifications keep it) rather than a 503 for a status read.
        if (busy) { reply(this.#tasks.view(task)); return }
        if ('result' in answer && isRecord(answer.result)) this.#tasks.update(task, answer.result)
        if ('error' in answer && task.lost === undefined) { send(backendIdsHidden({ ...answer, id: request.id }, task)); return }
        reply(this.#tasks.view(task))
        return
      }
      case 'tasks/cancel': {
        if (task.lost !== undefined) { send(errorResponse(request.id, JSONRPC_INVALID_PARAMS, 'Cannot cancel task in terminal status: failed')); return }
        const answer = await this.#askTask(task, 'tasks/cancel').catch((err: unknown) => toJsonRpcError(asGatewayError(err, task.server), request.id))
        if ('error' in answer) { send(backendIdsHidden({ ...answer, id: request.id }, task)); return }
        if (isRecord(answer.result)) this.#tasks.update(task, answer.result)
        reply({ ...(isRecord(answer.result) ? answer.result : {}), taskId: task.id })
        return
      }
      default:
        await this.#awaitResult(record, request, streamId, task)
    }
  }

  /**
   * tasks/result: waits here until the task is terminal or needs input, then asks its connection
   * (which answers at once, or delivers the task's queued requests to the client and then its result).
   */
  async #awaitResult (record: SessionRecord, request: JsonRpcRequest, streamId: string, task: PooledTask): Promise<void> {
    const sid = record.id
    // Cancelled by the client, or its session ended: the wait stops.
    const waiting = this.#host.track(sid, request.id, streamId, task.connectionId)
    while (waiting.current()) {
      if (task.lost !== undefined) {
        waiting.settle()
        this.#host.append(sid, streamId, toJsonRpcError(new GW_ERR_BACKEND_UNAVAILABLE(task.server, task.lost), request.id))
        return
      }
      if (this.#tasks.of(sid, task.id) === undefined) {
        waiting.settle()
        this.#host.append(sid, streamId, errorResponse(request.id, JSONRPC_INVALID_PARAMS, `Task not found: ${task.id}`))
        return
      }
      const status = task.task.status
      if (isTerminal(status) || status === 'input_required') break
      await changedOrAfter(task, pollMsOf(task))
      if (waiting.current()) await this.#refresh(task)
    }
    if (!waiting.current()) return
    waiting.settle()
    const params = isRecord(request.params) ? request.params : {}
    this.#host.run(record, { ...request, params: { ...params, taskId: task.backendId } }, streamId, task.connectionId)
  }

  /** Asks the backend for the task's status (bounded by `withinMs`): the record follows; a failure leaves it as it was. */
  async #refresh (task: PooledTask, withinMs?: number): Promise<void> {
    const asked = this.#askTask(task, 'tasks/get').then(answer => {
      if ('result' in answer && isRecord(answer.result)) this.#tasks.update(task, answer.result)
    }, () => {})
    if (withinMs === undefined) { await asked; return }
    let timer: NodeJS.Timeout | undefined
    await Promise.race([asked, new Promise<void>(resolve => { timer = setTimeout(resolve, withinMs) })])
    clearTimeout(timer)
  }

  /** A request of the gateway's own about a task, on the connection that holds it, under the backend's id. */
  async #askTask (task: PooledTask, method: string): Promise<JsonRpcResponse> {
    const reservation = await this.#host.pool.reserveOn(task.server, task.tenant, task.connectionId, task.subject ?? undefined)
    return await new Promise<JsonRpcResponse>((resolve, reject) => {
      try {
        reservation.run(key => ({ jsonrpc: '2.0', id: key, method, params: { taskId: task.backendId } }), {
          onMessage: message => { if (isResponse(message)) resolve(message) }
        })
      } catch (err) {
        reservation.release()
        reject(err)
      }
    })
  }

  /**
   * A notification of a connection about one of the tasks recorded here (PooledTasks): to its
   * session's stream, under the session's id; false when no task here is concerned.
   */
  #taskNotification (connectionId: string, message: JsonRpcMessage): boolean {
    const task = this.#tasks.onConnection(connectionId, relatedTaskOf(message))
    if (task === undefined) return false
    if ('method' in message && message.method === 'notifications/tasks/status' && isRecord(message.params)) {
      const { _meta: _unused, ...described } = message.params
      this.#tasks.update(task, described)
    }
    const shown = withTaskIds(message, this.#taskIdsOf(task.sid, connectionId))
    if (shown !== undefined) this.#host.append(task.sid, task.stream, shown)
    return true
  }

  /** The session's id of a backend task id on a connection (undefined: not one of its tasks). */
  #taskIdsOf (sid: string, connectionId: string | null): (backendId: unknown) => string | undefined {
    return backendId => {
      if (connectionId === null) return undefined
      const task = this.#tasks.onConnection(connectionId, backendId)
      return task !== undefined && task.sid === sid ? task.id : undefined
    }
  }
}

/** Whether a task may still change (the gateway asks its connection about it). */
function live (task: PooledTask): boolean {
  return task.lost === undefined && !isTerminal(task.task.status)
}

/** How long a waiting tasks/result lets pass between two tasks/get: the task's pollInterval, bounded. */
function pollMsOf (task: PooledTask): number {
  const asked = task.task.pollInterval
  return typeof asked === 'number' ? Math.min(TASK_POLL_MS.max, Math.max(TASK_POLL_MS.min, asked)) : TASK_POLL_MS.default
}

/** Resolves when the task changes (a status notification) or after `ms`, whichever is first. */
async function changedOrAfter (task: PooledTask, ms: number): Promise<void> {
  await new Promise<void>(resolve => {
    const done = (): void => {
      clearTimeout(timer)
      task.changed.delete(done)
      resolve()
    }
    const timer = setTimeout(done, ms)
    task.changed.add(done)
  })
}

/** A backend's error about a task, its own id replaced by the session's in the message. */
function backendIdsHidden (response: JsonRpcResponse, task: PooledTask): JsonRpcResponse {
  if (!('error' in response)) return response
  return { ...response, error: { ...response.error, message: response.error.message.split(task.backendId).join(task.id) } }
}
