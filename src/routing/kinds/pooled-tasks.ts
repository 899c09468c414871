// The tasks of pooled sessions (MCP 2025-11-25, "Tasks") held on this replica. A task lives in the
// backend child whose connection ran its task-augmented request; the session holds no connection,
// so the gateway keeps, per task, which session (and tenant, subject) it belongs to and which pool
// connection holds it, and shows the client an id of its own: random, so a task of another session
// cannot be named by guessing, and mapped to (connection, backend task id) only here. Its record in
// the task store (pooled-task-remote.ts) is what other replicas read; this is what only the replica
// holding the connection can keep:
//
// - A connection that holds live tasks is pinned (the pool does not stop it as idle); a task that
//   ends (terminal status), expires or whose session ends lets go of it.
// - A connection that loses its backend (it stopped, restarted, was closed) fails its live tasks
//   with a statusMessage saying so: they never stay `working`.
// - A status that changes is told to whoever keeps the store's record (`changed`).
// - Records live for the task's ttl (bounded by MAX_TTL_MS), then are forgotten.
import { randomBytes } from 'node:crypto'
import { isRecord, type JsonRpcMessage } from '../../core/jsonrpc.js'

/** The `_meta` key of a message about a task (MCP spec, "Tasks": related-task metadata). */
export const RELATED_TASK = 'io.modelcontextprotocol/related-task'
/** The client's task requests: answered from the records and the connection that holds the task. */
export const TASK_METHODS: ReadonlySet<string> = new Set(['tasks/get', 'tasks/result', 'tasks/list', 'tasks/cancel'])
/** How long a record outlives its creation at most (a task with no ttl, or a longer one). */
const MAX_TTL_MS = 60 * 60_000
/** How often expired records are forgotten. */
const SWEEP_MS = 30_000
const TERMINAL: ReadonlySet<unknown> = new Set(['completed', 'failed', 'cancelled'])

export const isTerminal = (status: unknown): boolean => TERMINAL.has(status)

/** One task of a pooled session. */
export interface PooledTask {
  /** The id the client sees. */
  readonly id: string
  readonly sid: string
  readonly tenant: string | null
  readonly subject: string | null
  readonly server: string
  readonly connectionId: string
  readonly backendId: string
  /** The client stream its status notifications go to (GET, or the legacy stream). */
  readonly stream: string
  /** The task as the backend last described it (its own id inside). */
  task: Record<string, unknown>
  /** Why the gateway failed it (its connection lost it), if it did. */
  lost?: string
  readonly expiresAt: number
  /** Lets go of the connection's pin (idempotent). */
  unpin: () => void
  /** Woken when the task's status changes (tasks/result waits on it). */
  readonly changed: Set<() => void>
}

export interface NewTask {
  sid: string
  tenant: string | null
  subject: string | null
  server: string
  connectionId: string
  stream: string
  task: Record<string, unknown>
  pin: () => (() => void) | undefined
}

export class PooledTasks {
  readonly #byId = new Map<string, PooledTask>()
  /** By connection id, then backend task id. */
  readonly #byConnection = new Map<string, Map<string, PooledTask>>()
  readonly #bySession = new Map<string, Set<PooledTask>>()
  readonly #sweep: NodeJS.Timeout

  /** Told when a task's status changes (the task store follows). */
  readonly #changed: (task: PooledTask) => void

  constructor (changed: (task: PooledTask) => void = () => {}) {
    this.#changed = changed
    this.#sweep = setInterval(() => { this.#forgetExpired(Date.now()) }, SWEEP_MS)
    this.#sweep.unref()
  }

  /** A CreateTaskResult's task, run on `connectionId`: recorded, with the id the client will see. */
  record (created: NewTask): PooledTask | undefined {
    const backendId = created.task.taskId
    if (typeof backendId !== 'string') return undefined
    const ttl = typeof created.task.ttl === 'number' && created.task.ttl > 0 ? Math.min(created.task.ttl, MAX_TTL_MS) : MAX_TTL_MS
    const terminal = isTerminal(created.task.status)
    const task: PooledTask = {
      id: randomBytes(18).toString('base64url'),
      sid: created.sid,
      tenant: created.tenant,
      subject: created.subject,
      server: created.server,
      connectionId: created.connectionId,
      backendId,
      stream: created.stream,
      task: created.task,
      expiresAt: Date.now() + ttl,
      unpin: (terminal ? undefined : created.pin()) ?? (() => {}),
      changed: new Set()
    }
    this.#byId.set(task.id, task)
    let onConnection = this.#byConnection.get(task.connectionId)
    if (onConnection === undefined) this.#byConnection.set(task.connectionId, onConnection = new Map())
    onConnection.set(backendId, task)
    let ofSession = this.#bySession.get(task.sid)
    if (ofSession === undefined) this.#bySession.set(task.sid, ofSession = new Set())
    ofSession.add(task)
    return task
  }

  /** The session's task by the id the client sees (undefined: unknown, expired, or another session's). */
  of (sid: string, id: unknown): PooledTask | undefined {
    if (typeof id !== 'string') return undefined
    const task = this.#byId.get(id)
    if (task === undefined || task.sid !== sid) return undefined
    if (task.expiresAt <= Date.now()) { this.#forget(task); return undefined }
    return task
  }

  /** The session's tasks, oldest first. */
  ofSession (sid: string): PooledTask[] {
    const now = Date.now()
    return [...this.#bySession.get(sid) ?? []].filter(task => task.expiresAt > now)
  }

  /** The task a backend id names on a connection. */
  onConnection (connectionId: string, backendId: unknown): PooledTask | undefined {
    return typeof backendId === 'string' ? this.#byConnection.get(connectionId)?.get(backendId) : undefined
  }

  /** The backend described the task again (tasks/get, tasks/cancel, a status notification). */
  update (task: PooledTask, described: Record<string, unknown>): void {
    if (task.lost !== undefined || described.taskId !== task.backendId) return
    const before = task.task
    task.task = described
    if (isTerminal(described.status)) task.unpin()
    if (before.status !== described.status || before.statusMessage !== described.statusMessage) this.#changed(task)
    if (before.status !== described.status || isTerminal(described.status)) this.#wake(task)
  }

  /** The connection lost its backend: its live tasks fail, saying why. */
  lost (connectionId: string, reason: string): void {
    for (const task of this.#byConnection.get(connectionId)?.values() ?? []) {
      if (task.lost !== undefined || isTerminal(task.task.status)) continue
      task.lost = `The gateway lost the backend connection that ran this task: ${reason}`
      task.unpin()
      this.#changed(task)
      this.#wake(task)
    }
  }

  /**
   * This replica stops: every live task here fails, saying why (its connection stops with the
   * pool). Returns them, for their records to follow before the store closes.
   */
  shutdown (reason: string): PooledTask[] {
    const failed: PooledTask[] = []
    for (const task of this.#byId.values()) {
      if (task.lost !== undefined || isTerminal(task.task.status)) continue
      task.lost = reason
      task.unpin()
      this.#wake(task)
      failed.push(task)
    }
    return failed
  }

  /** The task as the client sees it: its id, and `failed` if the gateway failed it. */
  view (task: PooledTask): Record<string, unknown> {
    const view: Record<string, unknown> = { ...task.task, taskId: task.id }
    if (task.lost !== undefined) {
      view.status = 'failed'
      view.statusMessage = task.lost
    }
    return view
  }

  /** The sessions that hold tasks here. */
  sessions (): IterableIterator<string> {
    return this.#bySession.keys()
  }

  /** Forgets one task (its record could not be written: the client never sees it). */
  forget (task: PooledTask): void {
    this.#forget(task)
  }

  /** The session ended: its tasks can no longer be reached, and their connections are let go. */
  forgetSession (sid: string): void {
    for (const task of this.#bySession.get(sid) ?? []) this.#forget(task)
  }

  stop (): void {
    clearInterval(this.#sweep)
    for (const task of this.#byId.values()) task.unpin()
  }

  #wake (task: PooledTask): void {
    for (const wake of [...task.changed]) wake()
  }

  #forget (task: PooledTask): void {
    task.unpin()
    this.#wake(task)
    this.#byId.delete(task.id)
    const onConnection = this.#byConnection.get(task.connectionId)
    onConnection?.delete(task.backendId)
    if (onConnection?.size === 0) this.#byConnection.delete(task.connectionId)
    const ofSession = this.#bySession.get(task.sid)
    ofSession?.delete(task)
    if (ofSession?.size === 0) this.#bySession.delete(task.sid)
  }

  #forgetExpired (now: number): void {
    for (const task of this.#byId.values()) if (task.expiresAt <= now) this.#forget(task)
  }
}

/**
 * A message with the task ids it carries mapped by `map` (backend to session for what reaches a
 * client, session to backend for a client's answer): related-task `_meta` in params or result, a
 * status notification's taskId. An id `map` does not know is never passed on: its `_meta` goes,
 * and a status notification about it is dropped (undefined).
 */
export function withTaskIds (message: JsonRpcMessage, map: (taskId: unknown) => string | undefined): JsonRpcMessage | undefined {
  if ('method' in message && message.method === 'notifications/tasks/status') {
    const params = isRecord(message.params) ? message.params : {}
    const id = map(params.taskId)
    if (id === undefined) return undefined
    return { ...message, params: { ...withRelated(params, map), taskId: id } }
  }
  if ('result' in message && isRecord(message.result)) {
    const result = withRelated(message.result, map)
    return result === message.result ? message : { ...message, result }
  }
  if ('method' in message && isRecord(message.params)) {
    const params = withRelated(message.params, map)
    return params === message.params ? message : { ...message, params } as JsonRpcMessage
  }
  return message
}

/** `holder` with its related-task `_meta` mapped (or without it). */
function withRelated (holder: Record<string, unknown>, map: (taskId: unknown) => string | undefined): Record<string, unknown> {
  const meta = holder._meta
  if (!isRecord(meta) || !(RELATED_TASK in meta)) return holder
  const related = meta[RELATED_TASK]
  const id = isRecord(related) ? map(related.taskId) : undefined
  const { [RELATED_TASK]: _dropped, ...rest } = meta
  return { ...holder, _meta: id === undefined ? rest : { ...rest, [RELATED_TASK]: { ...(isRecord(related) ? related : {}), taskId: id } } }
}

/** The backend task id a related-task `_meta` of a notification names, if any. */
export function relatedTaskOf (message: JsonRpcMessage): unknown {
  // Progress carries the request's token, which only its request's sink maps back.
  if (!('method' in message) || !isRecord(message.params) || message.method === 'notifications/progress') return undefined
  if (message.method === 'notifications/tasks/status') return message.params.taskId
  const meta = message.params._meta
  const related = isRecord(meta) ? meta[RELATED_TASK] : undefined
  return isRecord(related) ? related.taskId : undefined
}
