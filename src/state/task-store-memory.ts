// Memory twin of the task store (single-process mode). It keeps the Redis twin's semantics
// (expiry, terminal status kept, indexes by session and replica), so one contract suite holds
// for both.
import { GW_ERR_CONFLICT } from '../core/errors.js'
import { isTerminalStatus, type TaskPatch, type TaskRecord, type TaskStore } from './task-store.js'

/** How often expired records are swept; reads check expiry either way. */
const SWEEP_MS = 30_000

export class MemoryTaskStore implements TaskStore {
  readonly #records = new Map<string, TaskRecord>()
  readonly #bySession = new Map<string, Set<string>>()
  readonly #byReplica = new Map<string, Set<string>>()
  readonly #sweep: NodeJS.Timeout

  constructor () {
    this.#sweep = setInterval(() => { this.#sweepExpired(Date.now()) }, SWEEP_MS)
    this.#sweep.unref()
  }

  async create (record: TaskRecord): Promise<void> {
    if (this.#live(record.id) !== undefined) throw GW_ERR_CONFLICT(`task ${record.id} exists`)
    const copy = structuredClone(record)
    this.#records.set(copy.id, copy)
    this.#index(copy)
  }

  async get (id: string): Promise<TaskRecord | null> {
    const record = this.#live(id)
    return record === undefined ? null : structuredClone(record)
  }

  async update (id: string, patch: TaskPatch): Promise<TaskRecord | null> {
    const record = this.#live(id)
    if (record === undefined) return null
    if (patch.task !== undefined && !isTerminalStatus(record.task.status)) record.task = structuredClone(patch.task)
    if (patch.outcome !== undefined && record.outcome === undefined) record.outcome = structuredClone(patch.outcome)
    if (patch.connectionId !== undefined) record.connectionId = patch.connectionId
    if (patch.replica !== undefined && patch.replica !== record.replica) {
      this.#unindex(record)
      record.replica = patch.replica
      this.#index(record)
    }
    return structuredClone(record)
  }

  async ofSession (sessionId: string, limit: number): Promise<TaskRecord[]> {
    return this.#listed(this.#bySession.get(sessionId), limit)
  }

  async ofReplica (replica: string, limit: number): Promise<TaskRecord[]> {
    return this.#listed(this.#byReplica.get(replica), limit)
  }

  async replicas (): Promise<string[]> {
    return [...this.#byReplica.keys()].filter(replica => this.#listed(this.#byReplica.get(replica), 1).length > 0)
  }

  async delete (id: string): Promise<boolean> {
    const record = this.#records.get(id)
    if (record === undefined) return false
    this.#forget(record)
    return record.expiresAt > Date.now()
  }

  async close (): Promise<void> {
    clearInterval(this.#sweep)
  }

  #live (id: string): TaskRecord | undefined {
    const record = this.#records.get(id)
    if (record === undefined) return undefined
    if (record.expiresAt <= Date.now()) { this.#forget(record); return undefined }
    return record
  }

  #listed (ids: Set<string> | undefined, limit: number): TaskRecord[] {
    const out: TaskRecord[] = []
    for (const id of [...ids ?? []]) {
      const record = this.#live(id)
      if (record !== undefined) out.push(record)
    }
    return out.sort((a, b) => a.createdAt - b.createdAt).slice(0, limit).map(record => structuredClone(record))
  }

  #index (record: TaskRecord): void {
    if (record.sessionId !== null) addTo(this.#bySession, record.sessionId, record.id)
    addTo(this.#byReplica, record.replica, record.id)
  }

  #unindex (record: TaskRecord): void {
    if (record.sessionId !== null) removeFrom(this.#bySession, record.sessionId, record.id)
    removeFrom(this.#byReplica, record.replica, record.id)
  }

  #forget (record: TaskRecord): void {
    this.#records.delete(record.id)
    this.#unindex(record)
  }

  #sweepExpired (now: number): void {
    for (const record of this.#records.values()) if (record.expiresAt <= now) this.#forget(record)
  }
}

function addTo (index: Map<string, Set<string>>, key: string, id: string): void {
  let ids = index.get(key)
  if (ids === undefined) index.set(key, ids = new Set())
  ids.add(id)
}

function removeFrom (index: Map<string, Set<string>>, key: string, id: string): void {
  const ids = index.get(key)
  ids?.delete(id)
  if (ids?.size === 0) index.delete(key)
}
