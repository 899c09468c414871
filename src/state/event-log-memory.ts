// Memory twin of the event log: bounded per-stream logs kept next to the memory session store,
// which reports the stream's holder on append and drops the logs with the session.
// Entry ids are decimal sequence numbers per stream (event-log.ts ENTRY_ID). Like Redis stream ids
// they never go backwards, even when a silent stream expires and is created again while a writer
// still holds a cursor into it: a new stream starts at Date.now() * 1000, above any id an earlier
// stream of that name can have reached (it would need 1000 appends per millisecond).
import { GW_ERR_BAD_REQUEST } from '../core/errors.js'
import { isEntryId, parsePendingField, pendingField, type AppendResult, type EventLog, type LogEntry, type PendingRequest, type StreamHolder } from './event-log.js'
import { isResponse, type JsonRpcMessage, type RequestId } from '../core/jsonrpc.js'
import type { MemorySessionStore } from './session-store-memory.js'

interface Stream {
  /** Sequence number of entries[0]; entries are contiguous from there. */
  first: number
  /** Sequence number of this stream's first entry ever: LogEntry.seq counts from it. */
  base: number
  /** Messages as JSON ('' for a priming entry), so a reader never shares objects with a writer. */
  entries: string[]
  expiresAt: number
}

export class MemoryEventLog implements EventLog {
  readonly #streams = new Map<string, Map<string, Stream>>()
  /** Pending markers per session: field -> when and by which replica recorded, or 'done' (settled). */
  readonly #pending = new Map<string, Map<string, { at: number, by: string } | 'done'>>()
  readonly #store: MemorySessionStore
  readonly #maxLen: number

  constructor (store: MemorySessionStore, maxLen: number) {
    if (!Number.isInteger(maxLen) || maxLen < 1) throw new RangeError(`maxLen must be a positive integer, got ${maxLen}`)
    this.#store = store
    this.#maxLen = maxLen
    store.attach({
      deleteSession: sid => { this.#streams.delete(sid); this.#pending.delete(sid) },
      sweep: now => this.#sweep(now)
    })
  }

  async append (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, answers?: RequestId, text?: string): Promise<AppendResult> {
    if (answers !== undefined && !this.#mayAnswer(sid, streamId, answers)) return { entryId: '', holder: null }
    return this.#append(sid, streamId, message, ttlMs, text)
  }

  /** The Redis twin's appendEvent rule (event-log.ts append): exactly one answer per request. */
  #mayAnswer (sid: string, streamId: string, id: RequestId): boolean {
    const field = pendingField(streamId, id)
    const pending = this.#pending.get(sid)
    const marker = pending?.get(field)
    if (marker === 'done') return false
    if (marker !== undefined) {
      pending?.delete(field)
      // An idle session keeps no empty map (heap per idle session: docs/performance.md).
      if (pending?.size === 0) this.#pending.delete(sid)
      return true
    }
    if (!this.#store.isLive(sid)) return false
    const stream = this.#live(sid, streamId)
    return !(stream?.entries ?? []).some(json => {
      if (json === '') return false
      const message = JSON.parse(json) as JsonRpcMessage
      return isResponse(message) && message.id === id
    })
  }

  async markPending (sid: string, streamId: string, ids: RequestId[], ttlMs: number, priming: boolean, servedBy: string, holder?: StreamHolder): Promise<string | null> {
    let pending = this.#pending.get(sid)
    if (pending === undefined) {
      pending = new Map()
      this.#pending.set(sid, pending)
    }
    const now = Date.now()
    for (const id of ids) pending.set(pendingField(streamId, id), { at: now, by: servedBy })
    if (holder !== undefined) this.#store.setHolder(sid, streamId, holder.replicaId, holder.leaseMs)
    return priming ? this.#append(sid, streamId, null, ttlMs).entryId : null
  }

  async claimOrphans (sid: string, of?: string, except?: string, minAgeMs = 0): Promise<PendingRequest[]> {
    const pending = this.#pending.get(sid)
    const claimed: PendingRequest[] = []
    if (pending === undefined) return claimed
    const now = Date.now()
    for (const [field, marker] of [...pending]) {
      if (marker === 'done' || marker.at > now - minAgeMs || (of === undefined ? marker.by === except : marker.by !== of)) continue
      pending.set(field, 'done')
      const request = parsePendingField(field)
      if (request !== null) claimed.push(request)
    }
    return claimed
  }

  async pendingReplicas (sid: string): Promise<string[]> {
    return [...new Set([...this.#pending.get(sid)?.values() ?? []].flatMap(p => p === 'done' ? [] : [p.by]))]
  }

  async claim (sid: string, streamId: string, id: RequestId): Promise<boolean> {
    let pending = this.#pending.get(sid)
    if (pending === undefined) {
      pending = new Map()
      this.#pending.set(sid, pending)
    }
    const field = pendingField(streamId, id)
    const marker = pending.get(field)
    pending.set(field, 'done')
    return marker !== undefined && marker !== 'done'
  }

  #append (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, text?: string): AppendResult {
    const now = Date.now()
    let streams = this.#streams.get(sid)
    if (streams === undefined) {
      streams = new Map()
      this.#streams.set(sid, streams)
    }
    let stream = streams.get(streamId)
    if (stream === undefined || stream.expiresAt <= now) {
      const after = stream === undefined ? 0 : stream.first + stream.entries.length
      const first = Math.max(now * 1000, after)
      stream = { first, base: first, entries: [], expiresAt: 0 }
      streams.set(streamId, stream)
    }
    const json = text ?? (message === null ? '' : JSON.stringify(message))
    stream.entries.push(json)
    if (stream.entries.length > this.#maxLen) {
      stream.entries.shift()
      stream.first++
    }
    stream.expiresAt = now + ttlMs
    const id = stream.first + stream.entries.length - 1
    const entryId = String(id)
    // The hand-off to a local holder gets the appender's object (nobody changes a message once it
    // is appended); the log keeps only the text, so what it retains is as small as it can be.
    return { entryId, holder: this.#store.holderOf(sid, streamId), entry: { entryId, message, json, seq: id - stream.base + 1 } }
  }

  async readAfter (sid: string, streamId: string, cursor: string | null, limit: number): Promise<LogEntry[]> {
    let after = 0
    if (cursor !== null) {
      if (!isEntryId(cursor)) throw new GW_ERR_BAD_REQUEST(`invalid event log cursor '${cursor}'`)
      // `<n>-<m>` (a Redis-style id) sorts after n-0, and all our ids are n-0: after it means after n.
      after = Number(cursor.split('-')[0])
    }
    const stream = this.#live(sid, streamId)
    if (stream === null || limit < 1) return []
    const start = Math.max(0, after - stream.first + 1)
    return stream.entries.slice(start, start + limit).map((json, i) => ({
      entryId: String(stream.first + start + i),
      message: json === '' ? null : JSON.parse(json) as JsonRpcMessage,
      json,
      seq: stream.first + start + i - stream.base + 1
    }))
  }

  async seqOf (sid: string, streamId: string, entryId: string): Promise<number | null> {
    const stream = this.#live(sid, streamId)
    if (stream === null || !isEntryId(entryId)) return null
    // Ids are contiguous in a stream's lifetime, so even a trimmed entry's ordinal is known.
    const id = Number(entryId.split('-')[0])
    return id >= stream.base && id < stream.first + stream.entries.length ? id - stream.base + 1 : null
  }

  async hasStream (sid: string, streamId: string): Promise<boolean> {
    return this.#live(sid, streamId) !== null
  }

  async expire (sid: string, streamId: string, ttlMs: number): Promise<void> {
    const stream = this.#live(sid, streamId)
    if (stream === null) return
    if (ttlMs > 0) {
      stream.expiresAt = Date.now() + ttlMs
      return
    }
    // Gone now, as PEXPIRE 0 deletes the Redis twin's key: not left for the sweep.
    const streams = this.#streams.get(sid)
    streams?.delete(streamId)
    if (streams?.size === 0) this.#streams.delete(sid)
  }

  async discard (sid: string, streamId: string, holder: string, answered: RequestId[]): Promise<void> {
    await this.expire(sid, streamId, 0)
    await this.#store.releaseHolder(sid, streamId, holder)
    const pending = this.#pending.get(sid)
    if (pending === undefined) return
    for (const id of answered) {
      const field = pendingField(streamId, id)
      if (pending.get(field) !== 'done') pending.delete(field)
    }
    if (pending.size === 0) this.#pending.delete(sid)
  }

  async prune (sid: string, sample: number): Promise<number> {
    const streams = this.#streams.get(sid)
    if (streams === undefined) return 0
    // Holders and cursors live in the store, apart from the logs: a lapsed log is all there is
    // here. The oldest `sample` streams (a Map keeps insertion order), not all: a busy session has
    // thousands alive, and the store's sweep gets the rest.
    return this.#dropLapsed(sid, streams, Date.now(), sample)
  }

  /** Drops the lapsed logs among a session's first `limit` streams (and the session's map once empty). */
  #dropLapsed (sid: string, streams: Map<string, Stream>, now: number, limit = Infinity): number {
    let dropped = 0
    let looked = 0
    for (const [streamId, stream] of streams) {
      if (looked++ >= limit) break
      if (stream.expiresAt > now) continue
      streams.delete(streamId)
      dropped++
    }
    if (streams.size === 0) this.#streams.delete(sid)
    return dropped
  }

  async deleteSession (sid: string): Promise<void> {
    this.#streams.delete(sid)
    this.#pending.delete(sid)
  }

  #live (sid: string, streamId: string): Stream | null {
    const stream = this.#streams.get(sid)?.get(streamId)
    return stream !== undefined && stream.expiresAt > Date.now() ? stream : null
  }

  #sweep (now: number): void {
    for (const [sid, streams] of this.#streams) this.#dropLapsed(sid, streams, now)
    // Markers of a session that no longer exists (it expired in the store) go with it.
    for (const sid of this.#pending.keys()) if (!this.#streams.has(sid)) this.#pending.delete(sid)
  }
}
