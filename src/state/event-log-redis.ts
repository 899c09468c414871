// Redis twin of the event log: one Redis stream per client stream, `<prefix>:{<sid>}:ev:<stream>`.
// The entry id is Redis's own (`<ms>-<seq>`, minted by XADD *), so replicas never race on ids.
import { GW_ERR_BAD_REQUEST } from '../core/errors.js'
import { isEntryId, type AppendResult, type EventLog, type LogEntry } from './event-log.js'
import type { JsonRpcMessage } from '../core/jsonrpc.js'
import { storeCall, type Redis } from './redis/client.js'
import { sessionKeys } from './redis/keys.js'
import { defineScripts } from './redis/scripts.js'

/** The field holding the message JSON; '' is a priming entry (null message). */
const FIELD = 'm'

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

  async append (sid: string, streamId: string, message: JsonRpcMessage | null, ttlMs: number): Promise<AppendResult> {
    const keys = sessionKeys(this.#prefix, sid)
    const json = message === null ? '' : JSON.stringify(message)
    const [entryId, holder] = await storeCall(this.#redis.appendEvent(keys.events(streamId), keys.holder(streamId), keys.streams, this.#maxLen, ttlMs, json, streamId))
    return { entryId, holder }
  }

  async readAfter (sid: string, streamId: string, cursor: string | null, limit: number): Promise<LogEntry[]> {
    if (cursor !== null && !isEntryId(cursor)) throw new GW_ERR_BAD_REQUEST(`invalid event log cursor '${cursor}'`)
    if (limit < 1) return []
    // `(id` is an exclusive start (Redis >= 6.2).
    const start = cursor === null ? '-' : `(${cursor}`
    const entries = await storeCall(this.#redis.xrange(sessionKeys(this.#prefix, sid).events(streamId), start, '+', 'COUNT', limit))
    return entries.map(([entryId, fields]) => {
      const at = fields.indexOf(FIELD)
      const json = at >= 0 && at % 2 === 0 ? fields[at + 1] ?? '' : ''
      return { entryId, message: json === '' ? null : JSON.parse(json) as JsonRpcMessage, json }
    })
  }

  async hasStream (sid: string, streamId: string): Promise<boolean> {
    return await storeCall(this.#redis.exists(sessionKeys(this.#prefix, sid).events(streamId))) === 1
  }

  async expire (sid: string, streamId: string, ttlMs: number): Promise<void> {
    await storeCall(this.#redis.pexpire(sessionKeys(this.#prefix, sid).events(streamId), ttlMs))
  }

  async deleteSession (sid: string): Promise<void> {
    const keys = sessionKeys(this.#prefix, sid)
    await storeCall(this.#redis.deleteEvents(keys.streams, keys.base))
  }
}
