// Redis twin of the task store (task-store.ts). A record is a hash of JSON fields (plus `status`,
// the task's status as a plain string) that expires when its task does; changes that check then
// write (create, update keeping a terminal status) are one Lua script each
// (redis/task-scripts.ts). Two indexes find records: the session's and the replica's, sorted sets
// scored by each record's expiry, plus the set of replicas that run tasks. They live in other
// cluster slots than the records, so they are written beside them and read tolerantly: an id whose
// record is gone is skipped (and dropped once its score passes).
import { GW_ERR_CONFLICT } from '../core/errors.js'
import { replicaTasksKey, sessionTasksKey, taskKey, taskReplicasKey } from './redis/keys.js'
import { storeCall, type Redis } from './redis/client.js'
import { defineTaskScripts } from './redis/task-scripts.js'
import type { TaskPatch, TaskRecord, TaskStore } from './task-store.js'

/** How many records one read of an index fetches at once. */
const FETCH_BATCH = 200

function encode (record: TaskRecord): string[] {
  const out: string[] = ['status', String(record.task.status ?? '')]
  for (const [field, value] of Object.entries(record)) {
    if (value !== undefined) out.push(field, JSON.stringify(value))
  }
  return out
}

function decode (hash: Record<string, string>, now: number): TaskRecord | null {
  if (hash.id === undefined) return null
  const record: Record<string, unknown> = {}
  for (const [field, json] of Object.entries(hash)) if (field !== 'status') record[field] = JSON.parse(json)
  const decoded = record as unknown as TaskRecord
  // A key past its expiry may be read in the millisecond before Redis drops it.
  return decoded.expiresAt > now ? decoded : null
}

/** A flat HGETALL reply (from a script) as a hash. */
function pairs (flat: string[]): Record<string, string> {
  const hash: Record<string, string> = {}
  for (let i = 0; i + 1 < flat.length; i += 2) hash[flat[i]!] = flat[i + 1]!
  return hash
}

export class RedisTaskStore implements TaskStore {
  readonly #redis: Redis
  readonly #prefix: string

  /** The client is shared: close() leaves it to whoever made it (app.ts closes it last). */
  constructor (redis: Redis, prefix: string) {
    this.#redis = redis
    this.#prefix = prefix
    defineTaskScripts(redis)
  }

  async create (record: TaskRecord): Promise<void> {
    const created = await storeCall(this.#redis.createTask(taskKey(this.#prefix, record.id), record.expiresAt, ...encode(record)))
    if (created === 0) throw new GW_ERR_CONFLICT(`task ${record.id} exists`)
    await this.#index(record.id, record.sessionId, record.replica, record.expiresAt)
  }

  async get (id: string): Promise<TaskRecord | null> {
    return decode(await storeCall(this.#redis.hgetall(taskKey(this.#prefix, id))), Date.now())
  }

  async update (id: string, patch: TaskPatch): Promise<TaskRecord | null> {
    const json = (value: unknown): string => value === undefined ? '' : JSON.stringify(value)
    const flat = await storeCall(this.#redis.updateTask(
      taskKey(this.#prefix, id),
      json(patch.task),
      String(patch.task?.status ?? ''),
      json(patch.outcome),
      json(patch.connectionId),
      json(patch.replica)
    ))
    const record = decode(pairs(flat), Date.now())
    if (record !== null && patch.replica !== undefined) await this.#index(id, null, patch.replica, record.expiresAt)
    return record
  }

  async ofSession (sessionId: string, limit: number): Promise<TaskRecord[]> {
    return await this.#listed(sessionTasksKey(this.#prefix, sessionId), limit, record => record.sessionId === sessionId)
  }

  async ofReplica (replica: string, limit: number): Promise<TaskRecord[]> {
    // The index keeps a record's old replica until it is read: a record taken over is left out.
    return await this.#listed(replicaTasksKey(this.#prefix, replica), limit, record => record.replica === replica)
  }

  async replicas (): Promise<string[]> {
    const key = taskReplicasKey(this.#prefix)
    const now = Date.now()
    await storeCall(this.#redis.zremrangebyscore(key, '-inf', now))
    return await storeCall(this.#redis.zrangebyscore(key, now, '+inf'))
  }

  async delete (id: string): Promise<boolean> {
    const key = taskKey(this.#prefix, id)
    const record = decode(await storeCall(this.#redis.hgetall(key)), Date.now())
    const deleted = await storeCall(this.#redis.del(key))
    if (record !== null) {
      const removals = [this.#redis.zrem(replicaTasksKey(this.#prefix, record.replica), id)]
      if (record.sessionId !== null) removals.push(this.#redis.zrem(sessionTasksKey(this.#prefix, record.sessionId), id))
      await storeCall(Promise.all(removals))
    }
    return deleted === 1 && record !== null
  }

  async close (): Promise<void> {}

  /** The record's entries in the indexes (each key on its own: they may sit in different slots). */
  async #index (id: string, sessionId: string | null, replica: string, expiresAt: number): Promise<void> {
    const now = Date.now()
    const writes: Array<Promise<unknown>> = [
      this.#redis.indexTask(replicaTasksKey(this.#prefix, replica), id, expiresAt, now),
      this.#redis.indexTask(taskReplicasKey(this.#prefix), replica, expiresAt, now)
    ]
    if (sessionId !== null) writes.push(this.#redis.indexTask(sessionTasksKey(this.#prefix, sessionId), id, expiresAt, now))
    await storeCall(Promise.all(writes))
  }

  /** The live records an index names (those `belongs` accepts), oldest first, at most `limit`. */
  async #listed (index: string, limit: number, belongs: (record: TaskRecord) => boolean): Promise<TaskRecord[]> {
    const now = Date.now()
    const ids = await storeCall(this.#redis.zrangebyscore(index, now, '+inf'))
    const out: TaskRecord[] = []
    for (let i = 0; i < ids.length; i += FETCH_BATCH) {
      // One command per record, sent together (a pipeline would need one slot under Cluster).
      const hashes = await storeCall(Promise.all(ids.slice(i, i + FETCH_BATCH).map(async id => await this.#redis.hgetall(taskKey(this.#prefix, id)))))
      for (const hash of hashes) {
        const record = decode(hash, now)
        if (record !== null && belongs(record)) out.push(record)
      }
    }
    return out.sort((a, b) => a.createdAt - b.createdAt).slice(0, limit)
  }
}
