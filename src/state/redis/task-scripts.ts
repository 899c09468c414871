// Lua scripts of the task store (task-store-redis.ts; keys `P:task:<id>` and its indexes). Kept
// apart from scripts.ts (session state) because they serve a different module; same habits: every
// key in KEYS, every key gets a TTL. A record is a hash of JSON fields plus `status`, the task's
// status as a plain string, so a script can keep a terminal status without decoding JSON.
import type { RedisKey, Result } from 'ioredis'
import type { Redis } from './client.js'

const scripts = {
  /*
   * createTask: writes a new record, expiring at its task's end.
   *   KEYS[1] record
   *   ARGV[1] expiry (ms since the epoch)   ARGV[2..] field, value pairs
   *   returns 1 written, 0 the id exists
   */
  createTask: {
    numberOfKeys: 1,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return 1`
  },

  /*
   * updateTask: changes a live record; a terminal status is kept (the task and status given are
   * then ignored), an outcome once set is kept.
   *   KEYS[1] record
   *   ARGV[1] task JSON or ''   ARGV[2] its status   ARGV[3] outcome JSON or ''
   *   ARGV[4] connection id JSON or ''   ARGV[5] replica JSON or ''
   *   returns the record's fields (HGETALL), or an empty list when it is gone
   */
  updateTask: {
    numberOfKeys: 1,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
if ARGV[1] ~= '' then
  local status = redis.call('HGET', KEYS[1], 'status')
  if status ~= 'completed' and status ~= 'failed' and status ~= 'cancelled' then
    redis.call('HSET', KEYS[1], 'task', ARGV[1], 'status', ARGV[2])
  end
end
if ARGV[3] ~= '' then redis.call('HSETNX', KEYS[1], 'outcome', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'connectionId', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'replica', ARGV[5]) end
return redis.call('HGETALL', KEYS[1])`
  },

  /*
   * indexTask: adds an id to an index (a sorted set scored by the record's expiry), drops the
   * entries past their score, and keeps the index as long as its last entry.
   *   KEYS[1] index
   *   ARGV[1] id   ARGV[2] its expiry (ms since the epoch)   ARGV[3] now (ms)
   *   returns 1
   */
  indexTask: {
    numberOfKeys: 1,
    lua: `
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return 1`
  }
} as const

declare module 'ioredis' {
  interface RedisCommander<Context> {
    createTask (record: RedisKey, expiresAt: number, ...fieldValues: string[]): Result<0 | 1, Context>
    updateTask (record: RedisKey, task: string, status: string, outcome: string, connectionId: string, replica: string): Result<string[], Context>
    indexTask (index: RedisKey, id: string, expiresAt: number, now: number): Result<1, Context>
  }
}

const defined = new WeakSet<Redis>()

/** Registers the task scripts on a client (idempotent); ioredis runs them with EVALSHA. */
export function defineTaskScripts (redis: Redis): void {
  if (defined.has(redis)) return
  for (const [name, script] of Object.entries(scripts)) redis.defineCommand(name, { numberOfKeys: script.numberOfKeys, lua: script.lua })
  defined.add(redis)
}
