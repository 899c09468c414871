// Redis twin of the event log: one Redis stream per client stream, `<prefix>:{<sid>}:ev:<stream>`.
// The entry id is Redis's own (`<ms>-<seq>`, minted by XADD *), so replicas never race on ids.
import { GW_ERR_BAD_REQUEST, GW_ERR_SESSION_NOT_FOUND } from '../core/errors.js'
import { isEntryId, parsePendingField, pendingField, type AppendResult, type EventLog, type LogEntry, type PendingRequest, type StreamHolder } from './event-log.js'
import type { JsonRpcMessage, RequestId } from '../core/jsonrpc.js'
import type { PreparedWake } from './bus.js'
import { storeCall, type Redis } from './redis/client.js'
import { sessionKeys } from './redis/keys.js'
import { defineScripts } from './redis/scripts.js'

/** The field holding the message JSON; '' is a priming entry (null message). */
const FIELD = 'm'
/** The field holding the entry's ordinal (LogEntry.seq), minted by appendEvent. */
const SEQ = 'n'

function fieldOf (fields: string[], name: string): string | undefined {
  for (let i = 0; i + 1 < fields.length; i += 2) if (fields[i] === name) return fields[i + 1]
  return undefined
}

export class RedisEventLog implements EventLog {
  readonly #redis: Redis
  readonly #prefix: string
  readonly #maxLen: number

  /** maxLen is approximate (XADD MAXLEN ~): Redis trims whole nodes, keeping at least maxLen. */
  constructor (redis: Redis, prefix: string, maxLen: number) {
    if (!Number.isInteger(maxLen) || maxLen < 1) throw new RangeError(`maxLen must be a positive integer, got ${maxLen}`)
    this.#redis = redis
    this.#prefix = prefix
    this.#maxLen = maxLen
    defineScripts(redis)
  }

  async append (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number, answers?: RequestId, text?: string, wake?: PreparedWake): Promise<AppendResult> {
    const keys = sessionKeys(this.#prefix, sid)
    const json = text ?? (message === null ? '' : JSON.stringify(message))
    const field = answers === undefined ? '' : pendingField(streamId, answers)
    const kind = typeof answers === 'number' ? 'n' : 's'
    const [entryId, holder, seq, woken] = await storeCall(wake === undefined
      ? this.#redis.appendEvent(keys.events(streamId), keys.holder(streamId), keys.streams, keys.pending, keys.meta, keys.seq, this.#maxLen, ttlMs, json, streamId, field, kind, String(answers ?? ''))
      : this.#redis.appendEventAndWake(keys.events(streamId), keys.holder(streamId), keys.streams, keys.pending, keys.meta, keys.seq, wake.inbox, this.#maxLen, ttlMs, json, streamId, field, kind, String(answers ?? ''), wake.replicaId, wake.maxLen, wake.ttlMs, wake.head, wake.mid, wake.tail))
    if (entryId === '') return { entryId, holder: null }
    if (woken === 1) wake?.sent()
    return { entryId, holder, ...(woken === 1 ? { woken: true } : {}), ...(typeof seq === 'number' ? { entry: { entryId, message, json, seq } } : {}) }
  }

  async markPending (sid: string, streamId: string, ids: RequestId[], ttlMs: number, priming: boolean, servedBy: string, holder?: StreamHolder): Promise<string | null> {
    const keys = sessionKeys(this.#prefix, sid)
    const fields = ids.map(id => pendingField(streamId, id))
    const entryId = await storeCall(this.#redis.markPending(keys.events(streamId), keys.streams, keys.pending, keys.seq, keys.holder(streamId), keys.meta, this.#maxLen, ttlMs, priming ? '1' : '0', streamId, servedBy, holder?.leaseMs ?? 0, holder?.replicaId ?? '', ...fields))
    if (entryId === null) throw new GW_ERR_SESSION_NOT_FOUND()
    return entryId === '' ? null : entryId
  }

  async claimOrphans (sid: string, of?: string, except?: string, minAgeMs = 0): Promise<PendingRequest[]> {
    const fields = await storeCall(this.#redis.claimOrphans(sessionKeys(this.#prefix, sid).pending, of ?? '', except ?? '', minAgeMs))
    return fields.map(parsePendingField).filter((p): p is PendingRequest => p !== null)
  }

  async pendingReplicas (sid: string): Promise<string[]> {
    const values = await storeCall(this.#redis.hvals(sessionKeys(this.#prefix, sid).pending))
    return [...new Set(values.filter(v => v.includes('|')).map(v => v.slice(v.indexOf('|') + 1)))]
  }

  async claim (sid: string, streamId: string, id: RequestId, ttlMs: number): Promise<boolean> {
    return await storeCall(this.#redis.settlePending(sessionKeys(this.#prefix, sid).pending, pendingField(streamId, id), ttlMs)) === 1
  }

  async readAfter (sid: string, streamId: string, cursor: string | null, limit: number): Promise<LogEntry[]> {
    if (cursor !== null && !isEntryId(cursor)) throw new GW_ERR_BAD_REQUEST(`invalid event log cursor '${cursor}'`)
    if (limit < 1) return []
    // `(id` is an exclusive start (Redis >= 6.2).
    const start = cursor === null ? '-' : `(${cursor}`
    const entries = await storeCall(this.#redis.xrange(sessionKeys(this.#prefix, sid).events(streamId), start, '+', 'COUNT', limit))
    return entries.map(([entryId, fields]) => {
      const json = fieldOf(fields, FIELD) ?? ''
      return { entryId, message: json === '' ? null : JSON.parse(json) as JsonRpcMessage, json, seq: Number(fieldOf(fields, SEQ) ?? 0) }
    })
  }

  async seqOf (sid: string, streamId: string, entryId: string): Promise<number | null> {
    if (!isEntryId(entryId)) return null
    const [entry] = await storeCall(this.#redis.xrange(sessionKeys(this.#prefix, sid).events(streamId), entryId, entryId))
    const seq = entry === undefined ? undefined : fieldOf(entry[1], SEQ)
    return seq === undefined ? null : Number(seq)
  }

  async hasStream (sid: string, streamId: string): Promise<boolean> {
    return await storeCall(this.#redis.exists(sessionKeys(this.#prefix, sid).events(streamId))) === 1
  }

  async expire (sid: string, streamId: string, ttlMs: number): Promise<void> {
    await storeCall(this.#redis.pexpire(sessionKeys(this.#prefix, sid).events(streamId), ttlMs))
  }

  async discard (sid: string, streamId: string, holder: string, answered: RequestId[]): Promise<void> {
    const keys = sessionKeys(this.#prefix, sid)
    const fields = answered.map(id => pendingField(streamId, id))
    await storeCall(this.#redis.discardStream(keys.events(streamId), keys.holder(streamId), keys.streams, keys.seq, keys.pending, streamId, holder, ...fields))
  }

  async prune (sid: string, sample: number): Promise<number> {
    const keys = sessionKeys(this.#prefix, sid)
    // A read, then a script naming every key it checks (Redis Cluster): an id listed meanwhile
    // was not sampled, one whose keys came back meanwhile is checked again in the script.
    const ids = sample < 1 ? [] : await storeCall(this.#redis.srandmember(keys.streams, sample))
    if (ids.length === 0) return 0
    const checked = ids.flatMap(id => [keys.events(id), keys.holder(id), keys.cursor(id)])
    return await storeCall(this.#redis.forgetStreams(2 + checked.length, keys.streams, keys.seq, ...checked, ...ids))
  }

  async deleteSession (sid: string): Promise<void> {
    const keys = sessionKeys(this.#prefix, sid)
    for (let attempt = 0; attempt < 10; attempt++) {
      const streams = await storeCall(this.#redis.smembers(keys.streams))
      const result = await storeCall(this.#redis.deleteEvents(2 + streams.length, keys.streams, ...streams.map(s => keys.events(s)), keys.seq, ...streams))
      if (result !== -1) return
    }
  }
}
