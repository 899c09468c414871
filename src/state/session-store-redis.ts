// Redis twin of the session store (docs/architecture.md). Every change that checks then
// writes runs as one Lua script (redis/scripts.ts); every key gets a TTL passed in by the caller.
import { GW_ERR_CONFLICT } from '../core/errors.js'
import { listenKey, replicaKey, sessionIndexKey, sessionKeys, summaryIndexKey, summaryKey } from './redis/keys.js'
import { isRedisReady, storeCall, type Redis } from './redis/client.js'
import { defineScripts } from './redis/scripts.js'
import type { HeldStream, IndexedSession, OwnerKeep, SessionRecord, SessionStore, StreamKeep } from './session-store.js'

/** Hash fields hold JSON, so null, numbers and objects come back as they went in. */
function encode (fields: Partial<SessionRecord>): string[] {
  const out: string[] = []
  for (const [field, value] of Object.entries(fields)) {
    if (value !== undefined) out.push(field, JSON.stringify(value))
  }
  return out
}

function decode (hash: Record<string, string>): SessionRecord | null {
  if (hash.id === undefined) return null
  const record: Record<string, unknown> = {}
  for (const [field, json] of Object.entries(hash)) record[field] = JSON.parse(json)
  return record as unknown as SessionRecord
}

/** keepStream's and keepOwner's answers, by the code the script returns. */
const STREAM_KEEPS = ['gone', 'held', 'reclaimed', 'taken'] as const satisfies readonly StreamKeep[]
const OWNER_KEEPS = ['gone', 'held', 'claimed', 'taken'] as const satisfies readonly OwnerKeep[]

export class RedisSessionStore implements SessionStore {
  readonly #redis: Redis
  /**
   * The connection heartbeats are written on. Its own when the app gives one: on the shared one, a
   * beat waits behind whatever is pipelined there (10,000 holder-lease renewals at once), and a
   * beat late past its TTL reads as this replica's death to the others.
   */
  readonly #beatRedis: Redis
  readonly #prefix: string
  /** This replica's heartbeat, as last written: rewritten at once when the connection comes back. */
  #beat: { replicaId: string, ttlMs: number } | null = null
  /** Whether the client has been ready before: a later 'ready' is a reconnect. */
  #wasReady: boolean
  /** When the connection last came back after a break (0: it never broke). */
  #reconnectedAt = 0

  /** The clients are shared: close() leaves them to whoever made them (app.ts closes them last). */
  constructor (redis: Redis, prefix: string, beatRedis: Redis = redis) {
    this.#redis = redis
    this.#beatRedis = beatRedis
    this.#prefix = prefix
    this.#wasReady = isRedisReady(redis)
    defineScripts(redis)
    redis.on('ready', () => { this.#onReady() })
    if (beatRedis !== redis) beatRedis.on('ready', () => { this.#rebeat() })
  }

  /**
   * The connection is back. If the server restarted or a replica was promoted, whatever was not
   * yet persisted or replicated is gone, short-lived heartbeats first: every replica's may be
   * missing until its next beat. This replica writes its own at once, and for one heartbeat TTL a
   * missing heartbeat does not mean death (isAlive), or replicas would take sessions over from
   * owners that are alive and still serving them: two backends for one session until the old
   * owner's next lease renewal.
   */
  #onReady (): void {
    if (!this.#wasReady) {
      this.#wasReady = true
      return
    }
    this.#reconnectedAt = Date.now()
    this.#rebeat()
  }

  /** Writes this replica's heartbeat again at once (its connection is back). */
  #rebeat (): void {
    const beat = this.#beat
    if (beat !== null) this.heartbeat(beat.replicaId, beat.ttlMs).catch(() => {})
  }

  async create (record: SessionRecord, ttlMs: number): Promise<void> {
    // Written at once: the index entry adds no round trip (ids are random: a conflict never really comes).
    const [created] = await Promise.all([storeCall(this.#redis.createSession(this.#keys(record.id).meta, ttlMs, ...encode(record))), this.#index(record.id, ttlMs)])
    if (created === 0) throw new GW_ERR_CONFLICT(`session id ${record.id} already exists`)
  }

  /**
   * The session's entry in the index, scored by its record's expiry; the index key lives as long
   * as its newest entry. A separate key (another cluster slot than the session's): sent alongside
   * the record's own command, never awaited before it, so it adds no round trip to a request.
   */
  async #index (sid: string, ttlMs: number): Promise<void> {
    const key = sessionIndexKey(this.#prefix)
    await storeCall(this.#redis.multi().zadd(key, Date.now() + ttlMs, sid).pexpire(key, ttlMs).exec())
  }

  async get (sid: string): Promise<SessionRecord | null> {
    return decode(await storeCall(this.#redis.hgetall(this.#keys(sid).meta)))
  }

  async exists (sid: string): Promise<boolean> {
    return await storeCall(this.#redis.exists(this.#keys(sid).meta)) === 1
  }

  async update (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<boolean> {
    const { id: _id, ...rest } = patch as Partial<SessionRecord>
    const fields = encode(rest)
    if (fields.length === 0) return await this.exists(sid)
    return await storeCall(this.#redis.updateSession(this.#keys(sid).meta, ...fields)) === 1
  }

  async touch (sid: string, ttlMs: number): Promise<boolean> {
    // Touch runs at most every tenth of the idle timeout per session (Sessions.touch): the index
    // entry is refreshed with it, both commands written at once.
    const [touched] = await Promise.all([storeCall(this.#redis.pexpire(this.#keys(sid).meta, ttlMs)), this.#index(sid, ttlMs).catch(() => {})])
    if (touched !== 1) await storeCall(this.#redis.zrem(sessionIndexKey(this.#prefix), sid)).catch(() => {})
    return touched === 1
  }

  async delete (sid: string): Promise<boolean> {
    const keys = this.#keys(sid)
    // Every key named (Redis Cluster): read the stream set, then delete. The record goes in the
    // first call; streams added meanwhile are deleted by the next ones (bounded: their keys
    // expire by themselves if a client keeps adding more).
    let existed = false
    for (let attempt = 0; ; attempt++) {
      const streams = await storeCall(this.#redis.smembers(keys.streams))
      const perStream = streams.flatMap(s => [keys.events(s), keys.holder(s), keys.cursor(s)])
      // The index entry goes with the script, in the same write.
      const [result] = await Promise.all([
        storeCall(this.#redis.deleteSession(5 + perStream.length, keys.meta, keys.owner, keys.streams, keys.pending, ...perStream, keys.seq, ...streams)),
        attempt === 0 ? storeCall(this.#redis.zrem(sessionIndexKey(this.#prefix), sid)).catch(() => 0) : 0
      ])
      existed ||= (result & 1) === 1
      if (result < 2 || attempt >= 10) return existed
    }
  }

  async claimOwner (sid: string, replicaId: string, ttlMs: number): Promise<string> {
    return await storeCall(this.#redis.claimOwner(this.#keys(sid).owner, replicaId, ttlMs))
  }

  async takeOwner (sid: string, replicaId: string, from: string | null, ttlMs: number): Promise<string> {
    return await storeCall(this.#redis.takeOwner(this.#keys(sid).owner, replicaId, from ?? '', ttlMs))
  }

  async renewOwner (sid: string, replicaId: string, ttlMs: number): Promise<boolean> {
    return await storeCall(this.#redis.renewLease(this.#keys(sid).owner, replicaId, ttlMs)) === 1
  }

  async releaseOwner (sid: string, replicaId: string): Promise<void> {
    await storeCall(this.#redis.releaseLease(this.#keys(sid).owner, replicaId))
  }

  async getOwner (sid: string): Promise<string | null> {
    return await storeCall(this.#redis.get(this.#keys(sid).owner))
  }

  async claimHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<string | null> {
    const keys = this.#keys(sid)
    return await storeCall(this.#redis.claimHolder(keys.holder(streamId), keys.streams, replicaId, ttlMs, streamId))
  }

  async renewHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<boolean> {
    const keys = this.#keys(sid)
    return await storeCall(this.#redis.renewHolder(keys.holder(streamId), keys.streams, replicaId, ttlMs)) === 1
  }

  async releaseHolder (sid: string, streamId: string, replicaId: string): Promise<void> {
    await storeCall(this.#redis.releaseLease(this.#keys(sid).holder(streamId), replicaId))
  }

  async getHolder (sid: string, streamId: string): Promise<string | null> {
    return await storeCall(this.#redis.get(this.#keys(sid).holder(streamId)))
  }

  async keepStreams (streams: readonly HeldStream[], replicaId: string, leaseMs: number, idleMs: number): Promise<StreamKeep[]> {
    if (streams.length === 0) return []
    // One script per stream (the batch spans sessions, so hash slots: Cluster-safe), all written
    // at once: the batch costs one round trip, not one per stream.
    const codes = await Promise.all(streams.map(async ({ sid, streamId, leased }) => {
      const keys = this.#keys(sid)
      return await storeCall(this.#redis.keepStream(keys.meta, keys.holder(streamId), keys.streams, replicaId, leaseMs, idleMs, streamId, leased ? '1' : '0'))
    }))
    // The index entries of the sessions kept alive, refreshed as touch does, in one command.
    const live = new Set<string>()
    const gone = new Set<string>()
    codes.forEach((code, i) => { const sid = streams[i]?.sid ?? ''; (code === 0 ? gone : live).add(sid) })
    const index = sessionIndexKey(this.#prefix)
    const expiresAt = Date.now() + idleMs
    const multi = this.#redis.multi()
    if (live.size > 0) multi.zadd(index, ...[...live].flatMap(sid => [expiresAt, sid])).pexpire(index, idleMs)
    if (gone.size > 0) multi.zrem(index, ...gone)
    await storeCall(multi.exec()).catch(() => {})
    return codes.map(code => STREAM_KEEPS[code])
  }

  async keepOwners (sids: readonly string[], replicaId: string, leaseMs: number): Promise<OwnerKeep[]> {
    const codes = await Promise.all(sids.map(async sid => {
      const keys = this.#keys(sid)
      return await storeCall(this.#redis.keepOwner(keys.meta, keys.owner, replicaId, leaseMs))
    }))
    return codes.map(code => OWNER_KEEPS[code])
  }

  async setCursor (sid: string, streamId: string, entryId: string, ttlMs: number): Promise<void> {
    const keys = this.#keys(sid)
    await storeCall(this.#redis.setCursor(keys.cursor(streamId), keys.streams, entryId, ttlMs, streamId))
  }

  async getCursor (sid: string, streamId: string): Promise<string | null> {
    return await storeCall(this.#redis.get(this.#keys(sid).cursor(streamId)))
  }

  async addListener (topic: string, replicaId: string, ttlMs: number): Promise<void> {
    const key = listenKey(this.#prefix, topic)
    // A sorted set scored by expiry: stale members are dropped on read; the key outlives its newest.
    await storeCall(this.#redis.multi().zadd(key, Date.now() + ttlMs, replicaId).pexpire(key, ttlMs).exec())
  }

  async listeners (topic: string): Promise<string[]> {
    const key = listenKey(this.#prefix, topic)
    return await storeCall(this.#redis.zrangebyscore(key, Date.now(), '+inf'))
  }

  async sessionIndex (limit: number): Promise<IndexedSession[]> {
    const key = sessionIndexKey(this.#prefix)
    const now = Date.now()
    // Entries of records that expired without a delete (idle timeout) go here, on read.
    const [, range] = await storeCall(this.#redis.multi().zremrangebyscore(key, '-inf', now).zrevrange(key, 0, Math.max(0, limit - 1), 'WITHSCORES').exec()) ?? []
    const flat = (range?.[1] ?? []) as string[]
    const out: IndexedSession[] = []
    for (let i = 0; i + 1 < flat.length; i += 2) out.push({ id: flat[i] ?? '', expiresAt: Number(flat[i + 1]) })
    return out
  }

  async publishSummary (replicaId: string, summary: string, ttlMs: number): Promise<void> {
    const index = summaryIndexKey(this.#prefix)
    await Promise.all([
      storeCall(this.#redis.set(summaryKey(this.#prefix, replicaId), summary, 'PX', ttlMs)),
      storeCall(this.#redis.multi().zadd(index, Date.now() + ttlMs, replicaId).pexpire(index, ttlMs).exec())
    ])
  }

  async summaries (): Promise<string[]> {
    const index = summaryIndexKey(this.#prefix)
    const now = Date.now()
    await storeCall(this.#redis.zremrangebyscore(index, '-inf', now))
    const ids = await storeCall(this.#redis.zrangebyscore(index, now, '+inf'))
    // One GET each (the keys may sit on several cluster nodes), written at once.
    const texts = await Promise.all(ids.map(async id => await storeCall(this.#redis.get(summaryKey(this.#prefix, id)))))
    return texts.filter((text): text is string => text !== null)
  }

  async heartbeat (replicaId: string, ttlMs: number): Promise<void> {
    this.#beat = { replicaId, ttlMs }
    await storeCall(this.#beatRedis.set(replicaKey(this.#prefix, replicaId), String(Date.now()), 'PX', ttlMs))
  }

  /** A replica is alive while its heartbeat is there, and, for a heartbeat TTL after a reconnect, also when it is not (#onReady). */
  async isAlive (replicaId: string): Promise<boolean> {
    if (await storeCall(this.#redis.exists(replicaKey(this.#prefix, replicaId))) === 1) return true
    return Date.now() - this.#reconnectedAt < (this.#beat?.ttlMs ?? 0)
  }

  isReady (): boolean {
    return isRedisReady(this.#redis)
  }

  async close (): Promise<void> {
    // Nothing of its own to stop; the shared client is closed by its maker.
  }

  #keys (sid: string): ReturnType<typeof sessionKeys> {
    return sessionKeys(this.#prefix, sid)
  }
}
