// What the console shows of a session's tasks (MCP 2025-11-25 "Tasks"): the last state of each
// task a client was told about, kept beside the session, bounded, so any replica's admin API can
// read it. It is a view, never an authority: task requests are answered by the backend (or by the
// task store for tasks the gateway mints ids for), never from here. Two twins implement it:
// session-tasks-memory.ts (single process) and session-tasks-redis.ts.

/** How many tasks a session keeps: past it, the one seen longest ago goes (ended ones first). */
export const MAX_SESSION_TASKS = 32

/** One task as the client last saw it (MCP `Task`, under the id the client sees). */
export interface SessionTask {
  taskId: string
  status: string
  statusMessage?: string
  /** ISO 8601, as the server wrote it. */
  createdAt?: string
  lastUpdatedAt?: string
  /** ms, or null for unlimited. */
  ttl?: number | null
  pollInterval?: number
  /** When the gateway last saw it (ms since the epoch). */
  seenAt: number
}

export interface SessionTasks {
  /**
   * Records a task's state and returns the status it had before (null: new to the session). A
   * task already ended keeps its status: a late, older message cannot bring it back to life. The
   * whole set lives `ttlMs` from this write (the session's idle timeout).
   */
  put (sid: string, task: SessionTask, ttlMs: number): Promise<string | null>
  /** The session's tasks, oldest first (byCreation). */
  list (sid: string): Promise<SessionTask[]>
  /** The session ended. */
  forget (sid: string): Promise<void>
}

const TERMINAL: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled'])

/** What put() keeps when `before` is what the session had: a terminal status stays. */
export function merged (before: SessionTask | undefined, task: SessionTask): SessionTask {
  if (before === undefined || !TERMINAL.has(before.status) || before.status === task.status) return task
  return before
}

/** The entry to drop when a session holds too many: ended before live, then seen longest ago. */
export function evictee (tasks: Iterable<SessionTask>): SessionTask | undefined {
  let pick: SessionTask | undefined
  for (const task of tasks) {
    if (pick === undefined) { pick = task; continue }
    const [a, b] = [TERMINAL.has(task.status), TERMINAL.has(pick.status)]
    if ((a && !b) || (a === b && task.seenAt < pick.seenAt)) pick = task
  }
  return pick
}

/** Oldest first: by the server's createdAt, then by when the gateway first saw it. */
export const byCreation = (a: SessionTask, b: SessionTask): number => (a.createdAt ?? '').localeCompare(b.createdAt ?? '') || a.seenAt - b.seenAt
