// The task store: the records of tasks the gateway mints ids for (MCP "Tasks": a pooled session's
// tasks, a 2026-07-28 request's task on a pooled or bridged backend, and tasks the gateway hosts
// itself), so that any replica can answer a task request: it reads who owns the task (tenant,
// subject, session), which replica runs it, and the last status known. A record is written before
// the client sees the task's id, and lives for the task's ttl. Two twins implement it:
// task-store-memory.ts (single process) and the Redis twin.

/** Who may name a task: a request naming it under another owner gets "unknown task". */
export interface TaskOwner {
  /** The tenant (null without tenants). */
  tenant: string | null
  /** The subject digest (null: anonymous), never the subject itself. */
  subjectDigest: string | null
  /** The 2025-era session that created it; null for a 2026-07-28 request (no session). */
  sessionId: string | null
}

/** The final answer of a task the gateway holds itself (hosted, or failed by the gateway). */
export type TaskOutcome = { result: Record<string, unknown> } | { error: { code: number, message: string, data?: unknown } }

export interface TaskRecord extends TaskOwner {
  /** The id the client sees: random (unguessable), minted by the gateway. */
  id: string
  /** The configured server the task runs on. */
  server: string
  /** The replica that runs it (holds the backend connection or the call). */
  replica: string
  /** On that replica: the connection that holds it (a pool connection's id); null when none. */
  connectionId: string | null
  /** The backend's own id for the task; null when the gateway hosts it (the backend knows no task). */
  backendTaskId: string | null
  /** The task as last known (MCP `Task`: status, statusMessage, createdAt, lastUpdatedAt, ttl, pollInterval), under the client's id. */
  task: Record<string, unknown>
  /** Set once a task the gateway holds has ended: what tasks/result (or tasks/get's result) answers. */
  outcome?: TaskOutcome
  /** ms since the epoch. */
  createdAt: number
  /** When the record is forgotten (ms since the epoch): creation + the task's ttl. */
  expiresAt: number
}

/** What update() may change. */
export interface TaskPatch {
  task?: Record<string, unknown>
  outcome?: TaskOutcome
  /** A replica took the task over (or it was failed in the dead replica's name). */
  replica?: string
  connectionId?: string | null
}

export interface TaskStore {
  /** Writes a new record (ids are random: an existing id is an error); it expires at `expiresAt`. */
  create (record: TaskRecord): Promise<void>
  /** The record, or null when unknown or expired. */
  get (id: string): Promise<TaskRecord | null>
  /**
   * Changes a live record; null (and no write) when it has expired or was deleted. A record whose
   * task is terminal (completed, failed, cancelled) keeps its status: a later patch's task is ignored.
   */
  update (id: string, patch: TaskPatch): Promise<TaskRecord | null>
  /** The session's live records, oldest first (at most `limit`). */
  ofSession (sessionId: string, limit: number): Promise<TaskRecord[]>
  /** The live records run by a replica (owner loss: they are failed or taken over), at most `limit`. */
  ofReplica (replica: string, limit: number): Promise<TaskRecord[]>
  /** The replicas that run live records (a sweep finds the ones that are gone among them). */
  replicas (): Promise<string[]>
  /** Forgets a record; true when it existed. */
  delete (id: string): Promise<boolean>
  close (): Promise<void>
}

const TERMINAL: ReadonlySet<unknown> = new Set(['completed', 'failed', 'cancelled'])

/** Whether a task status is final (MCP "Tasks": completed, failed, cancelled). */
export const isTerminalStatus = (status: unknown): boolean => TERMINAL.has(status)

/** Whether `record` belongs to `owner`: same tenant, subject and session. */
export const ownsTask = (record: TaskRecord, owner: TaskOwner): boolean =>
  record.tenant === owner.tenant && record.subjectDigest === owner.subjectDigest && record.sessionId === owner.sessionId
