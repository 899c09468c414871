// Memory twin of the session store (docs/architecture.md): single-process mode, the
// default when no Redis is configured. It keeps the Redis twin's semantics, TTLs included, so the
// shared contract suite (test/state/contract-session-store.ts) holds for both.
import { GW_ERR_CONFLICT } from '../core/errors.js'
import type { HeldStream, IndexedSession, OwnerKeep, SessionRecord, SessionStore, StreamKeep } from './session-store.js'
import { deepFreeze } from '../core/freeze.js'

interface Expiring<T> {
  value: T
  expiresAt: number
}

/** Per-session state other than the record; dropped with the session. */
interface SessionSide {
  owner: Expiring<string> | null
  holders: Map<string, Expiring<string>>
  /** Made on first use: only a GET or legacy stream that ends records one. */
  cursors: Map<string, Expiring<string>> | undefined
}

/**
 * Something that keeps per-session data next to the store (the memory event log) and must
 * forget it when the store deletes or sweeps; the Redis twin gets this from one delete script.
 */
export interface MemorySessionPart {
  deleteSession (sid: string): void
  sweep (now: number): void
}

export interface MemorySessionStoreOptions {
  /** How often expired entries are swept; reads check expiry lazily either way. */
  sweepIntervalMs?: number
}

/**
 * The stored form of a record: a copy nobody else can change, whose nested values are frozen. A
 * nested value frozen already (the initialize params: Sessions.create freezes them) is shared,
 * not copied: nobody can change it either, and a second copy per session was heap for nothing.
 */
const frozenCopy = (record: SessionRecord): SessionRecord => {
  const copy: Record<string, unknown> = {}
  for (const [field, value] of Object.entries(record)) {
    copy[field] = typeof value === 'object' && value !== null && !Object.isFrozen(value) ? deepFreeze(structuredClone(value)) : value
  }
  return copy as unknown as SessionRecord
}

const live = <T>(entry: Expiring<T> | null | undefined, now: number): entry is Expiring<T> =>
  entry != null && entry.expiresAt > now

export class MemorySessionStore implements SessionStore {
  readonly #records = new Map<string, Expiring<SessionRecord>>()
  readonly #sides = new Map<string, SessionSide>()
  readonly #replicas = new Map<string, number>()
  /** Listen topics: replica -> until (ms since the epoch). */
  readonly #listeners = new Map<string, Map<string, number>>()
  readonly #parts: MemorySessionPart[] = []
  /** Admin summaries by replica (the Redis twin's summary keys). */
  readonly #summaries = new Map<string, Expiring<string>>()
  #sweeper: NodeJS.Timeout | null

  constructor (opts: MemorySessionStoreOptions = {}) {
    // unref'd: the sweeper alone must never keep the process alive.
    this.#sweeper = setInterval(() => this.sweep(), opts.sweepIntervalMs ?? 30_000)
    this.#sweeper.unref()
  }

  /** Registers a part (the memory event log) that lives and dies with the sessions. */
  attach (part: MemorySessionPart): void {
    this.#parts.push(part)
  }

  async create (record: SessionRecord, ttlMs: number): Promise<void> {
    const now = Date.now()
    if (live(this.#records.get(record.id), now)) throw new GW_ERR_CONFLICT(`session id ${record.id} already exists`)
    this.#records.set(record.id, { value: frozenCopy(record), expiresAt: now + ttlMs })
  }

  /** Synchronous existence check, for the memory event log's answer rule. */
  isLive (sid: string): boolean {
    return live(this.#records.get(sid), Date.now())
  }

  async get (sid: string): Promise<SessionRecord | null> {
    const entry = this.#records.get(sid)
    // A shallow copy of a deep-frozen record: what a caller changes on it stays its own, and a
    // nested value it tried to change would throw, never reach the store. structuredClone per
    // request cost more than the rest of the lookup.
    return live(entry, Date.now()) ? { ...entry.value } : null
  }

  async exists (sid: string): Promise<boolean> {
    return live(this.#records.get(sid), Date.now())
  }

  async update (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<boolean> {
    const entry = this.#records.get(sid)
    // Never resurrect: an expired record stays gone, as the Redis twin's script guarantees.
    if (!live(entry, Date.now())) return false
    for (const [field, value] of Object.entries(patch)) {
      if (value === undefined || field === 'id') continue
      ;(entry.value as unknown as Record<string, unknown>)[field] = deepFreeze(structuredClone(value))
    }
    return true
  }

  async touch (sid: string, ttlMs: number): Promise<boolean> {
    const now = Date.now()
    const entry = this.#records.get(sid)
    if (!live(entry, now)) return false
    entry.expiresAt = now + ttlMs
    return true
  }

  async delete (sid: string): Promise<boolean> {
    const existed = live(this.#records.get(sid), Date.now())
    this.#records.delete(sid)
    this.#sides.delete(sid)
    for (const part of this.#parts) part.deleteSession(sid)
    return existed
  }

  async claimOwner (sid: string, replicaId: string, ttlMs: number): Promise<string> {
    const now = Date.now()
    const side = this.#side(sid)
    if (live(side.owner, now)) {
      // Claiming a lease one already holds extends it, as the Redis script does.
      if (side.owner.value === replicaId) side.owner.expiresAt = now + ttlMs
      return side.owner.value
    }
    side.owner = { value: replicaId, expiresAt: now + ttlMs }
    return replicaId
  }

  async takeOwner (sid: string, replicaId: string, from: string | null, ttlMs: number): Promise<string> {
    const now = Date.now()
    const side = this.#side(sid)
    if (!live(side.owner, now) || side.owner.value === from || side.owner.value === replicaId) {
      side.owner = { value: replicaId, expiresAt: now + ttlMs }
      return replicaId
    }
    return side.owner.value
  }

  async renewOwner (sid: string, replicaId: string, ttlMs: number): Promise<boolean> {
    const now = Date.now()
    const owner = this.#sides.get(sid)?.owner
    if (!live(owner, now) || owner.value !== replicaId) return false
    owner.expiresAt = now + ttlMs
    return true
  }

  async releaseOwner (sid: string, replicaId: string): Promise<void> {
    const side = this.#sides.get(sid)
    if (side !== undefined && live(side.owner, Date.now()) && side.owner.value === replicaId) side.owner = null
  }

  async getOwner (sid: string): Promise<string | null> {
    const owner = this.#sides.get(sid)?.owner
    return live(owner, Date.now()) ? owner.value : null
  }

  async claimHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<string | null> {
    const previous = this.holderOf(sid, streamId)
    this.setHolder(sid, streamId, replicaId, ttlMs)
    return previous === replicaId ? null : previous
  }

  /** claimHolder's write, for the event log twin's markPending (a new stream has no previous holder). */
  setHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): void {
    this.#side(sid).holders.set(streamId, { value: replicaId, expiresAt: Date.now() + ttlMs })
  }

  async renewHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<boolean> {
    const now = Date.now()
    const holder = this.#sides.get(sid)?.holders.get(streamId)
    if (!live(holder, now) || holder.value !== replicaId) return false
    holder.expiresAt = now + ttlMs
    return true
  }

  async releaseHolder (sid: string, streamId: string, replicaId: string): Promise<void> {
    if (this.holderOf(sid, streamId) === replicaId) this.#sides.get(sid)?.holders.delete(streamId)
  }

  async getHolder (sid: string, streamId: string): Promise<string | null> {
    return this.holderOf(sid, streamId)
  }

  /** Synchronous holder read, for the memory event log's append(). */
  holderOf (sid: string, streamId: string): string | null {
    const holder = this.#sides.get(sid)?.holders.get(streamId)
    return live(holder, Date.now()) ? holder.value : null
  }

  async keepStreams (streams: readonly HeldStream[], replicaId: string, leaseMs: number, idleMs: number): Promise<StreamKeep[]> {
    const now = Date.now()
    return streams.map(({ sid, streamId, leased }) => {
      const record = this.#records.get(sid)
      if (!live(record, now)) return 'gone'
      record.expiresAt = now + idleMs
      if (!leased) return 'held'
      const holder = this.#sides.get(sid)?.holders.get(streamId)
      if (live(holder, now)) {
        if (holder.value !== replicaId) return 'taken'
        holder.expiresAt = now + leaseMs
        return 'held'
      }
      this.setHolder(sid, streamId, replicaId, leaseMs)
      return 'reclaimed'
    })
  }

  async keepOwners (sids: readonly string[], replicaId: string, leaseMs: number): Promise<OwnerKeep[]> {
    const now = Date.now()
    return sids.map(sid => {
      if (!live(this.#records.get(sid), now)) return 'gone'
      const side = this.#side(sid)
      if (live(side.owner, now)) {
        if (side.owner.value !== replicaId) return 'taken'
        side.owner.expiresAt = now + leaseMs
        return 'held'
      }
      side.owner = { value: replicaId, expiresAt: now + leaseMs }
      return 'claimed'
    })
  }

  async setCursor (sid: string, streamId: string, entryId: string, ttlMs: number): Promise<void> {
    const side = this.#side(sid)
    ;(side.cursors ??= new Map()).set(streamId, { value: entryId, expiresAt: Date.now() + ttlMs })
  }

  async getCursor (sid: string, streamId: string): Promise<string | null> {
    const cursor = this.#sides.get(sid)?.cursors?.get(streamId)
    return live(cursor, Date.now()) ? cursor.value : null
  }

  async addListener (topic: string, replicaId: string, ttlMs: number): Promise<void> {
    let replicas = this.#listeners.get(topic)
    if (replicas === undefined) this.#listeners.set(topic, replicas = new Map())
    replicas.set(replicaId, Date.now() + ttlMs)
  }

  async listeners (topic: string): Promise<string[]> {
    const replicas = this.#listeners.get(topic)
    if (replicas === undefined) return []
    const now = Date.now()
    for (const [replica, until] of replicas) if (until <= now) replicas.delete(replica)
    if (replicas.size === 0) this.#listeners.delete(topic)
    return [...replicas.keys()]
  }

  async sessionIndex (limit: number): Promise<IndexedSession[]> {
    // The records are the index here: the same answer as the Redis twin's sorted set.
    const now = Date.now()
    const out: IndexedSession[] = []
    for (const [id, entry] of this.#records) if (live(entry, now)) out.push({ id, expiresAt: entry.expiresAt })
    return out.sort((a, b) => b.expiresAt - a.expiresAt).slice(0, Math.max(0, limit))
  }

  async publishSummary (replicaId: string, summary: string, ttlMs: number): Promise<void> {
    this.#summaries.set(replicaId, { value: summary, expiresAt: Date.now() + ttlMs })
  }

  async summaries (): Promise<string[]> {
    const now = Date.now()
    const out: string[] = []
    for (const [id, entry] of this.#summaries) {
      if (live(entry, now)) out.push(entry.value)
      else this.#summaries.delete(id)
    }
    return out
  }

  async heartbeat (replicaId: string, ttlMs: number): Promise<void> {
    this.#replicas.set(replicaId, Date.now() + ttlMs)
  }

  async isAlive (replicaId: string): Promise<boolean> {
    return (this.#replicas.get(replicaId) ?? 0) > Date.now()
  }

  isReady (): boolean {
    return true
  }

  async close (): Promise<void> {
    if (this.#sweeper !== null) clearInterval(this.#sweeper)
    this.#sweeper = null
  }

  /** Drops everything expired; reads never depend on it having run. */
  sweep (now = Date.now()): void {
    for (const [sid, entry] of this.#records) if (!live(entry, now)) this.#records.delete(sid)
    for (const [sid, side] of this.#sides) {
      if (side.owner !== null && !live(side.owner, now)) side.owner = null
      for (const [streamId, holder] of side.holders) if (!live(holder, now)) side.holders.delete(streamId)
      for (const [streamId, cursor] of side.cursors ?? []) if (!live(cursor, now)) side.cursors?.delete(streamId)
      if (side.owner === null && side.holders.size === 0 && (side.cursors?.size ?? 0) === 0) this.#sides.delete(sid)
    }
    for (const [id, expiresAt] of this.#replicas) if (expiresAt <= now) this.#replicas.delete(id)
    for (const part of this.#parts) part.sweep(now)
  }

  #side (sid: string): SessionSide {
    let side = this.#sides.get(sid)
    if (side === undefined) {
      side = { owner: null, holders: new Map(), cursors: undefined }
      this.#sides.set(sid, side)
    }
    return side
  }
}
