// Lua scripts for every Redis change that checks then writes or touches more than one key
// (STYLE.md habit 5): one round trip each, atomic, so nothing can resurrect an expired key or
// leave a key without a TTL. Headers follow BullMQ: KEYS, ARGV, returns.
//
// Scripts that must find a session's per-stream keys (delete) build their names from the
// session's base key and the suffixes in keys.ts. Every such key carries the session's
// `{sid}` hash tag, so it lives in the same cluster slot as the keys the script was given.
import type { Redis, RedisKey, Result } from 'ioredis'
import { SESSION_SUFFIX } from './keys.js'

/** Raises a key's TTL to at least ttl ms (a key without a TTL gets one); never shortens it. */
const BUMP = `
local function bump (key, ttl)
  local left = redis.call('PTTL', key)
  if left == -1 or left < tonumber(ttl) then redis.call('PEXPIRE', key, ttl) end
end
`

/** Adds a stream id to the session's stream set, which must outlive every key listed in it. */
const REMEMBER_STREAM = `${BUMP}
local function remember (streams, streamId, ttl)
  redis.call('SADD', streams, streamId)
  bump(streams, ttl)
end
`

const scripts = {
  /*
   * createSession: writes a new session record, refusing an id that exists.
   *   KEYS[1] meta
   *   ARGV[1] ttl ms   ARGV[2..] field, value, field, value …
   *   returns 1 created, 0 the id exists
   */
  createSession: {
    numberOfKeys: 1,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`
  },

  /*
   * updateSession: changes fields of a live record; an expired or deleted record stays gone
   * (a separate EXISTS then HSET could recreate it without a TTL). HSET keeps the key's TTL.
   *   KEYS[1] meta
   *   ARGV[1..] field, value, field, value …
   *   returns 1 updated, 0 no such record
   */
  updateSession: {
    numberOfKeys: 1,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1`
  },

  /*
   * deleteSession: drops the record, the owner lease and, for every stream id in the stream
   * set, its events, holder and cursor keys; then the set.
   *   KEYS[1] meta   KEYS[2] owner   KEYS[3] stream set
   *   ARGV[1] session base key (`<prefix>:{<sid>}`)
   *   returns 1 the record existed, 0 it did not
   */
  deleteSession: {
    numberOfKeys: 3,
    lua: `
local existed = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
local base = ARGV[1] .. ':'
for _, s in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('DEL', base .. '${SESSION_SUFFIX.events}' .. s, base .. '${SESSION_SUFFIX.holder}' .. s, base .. '${SESSION_SUFFIX.cursor}' .. s)
end
redis.call('DEL', KEYS[3])
return existed`
  },

  /*
   * deleteEvents: drops the event logs of every stream of a session (not holders or cursors).
   *   KEYS[1] stream set
   *   ARGV[1] session base key
   *   returns the number of logs deleted
   */
  deleteEvents: {
    numberOfKeys: 1,
    lua: `
local base = ARGV[1] .. ':'
local n = 0
for _, s in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  n = n + redis.call('DEL', base .. '${SESSION_SUFFIX.events}' .. s)
end
return n`
  },

  /*
   * claimOwner: takes the owner lease when free; the current owner claiming again extends it.
   *   KEYS[1] owner
   *   ARGV[1] replica id   ARGV[2] ttl ms
   *   returns the owner after the call
   */
  claimOwner: {
    numberOfKeys: 1,
    lua: `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return ARGV[1] end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return current`
  },

  /*
   * renewLease: extends a lease only while it still holds the caller's value.
   *   KEYS[1] lease
   *   ARGV[1] replica id   ARGV[2] ttl ms
   *   returns 1 renewed, 0 not held by the caller
   */
  renewLease: {
    numberOfKeys: 1,
    lua: `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])`
  },

  /*
   * renewHolder: renewLease for a holder, keeping the stream set alive as long as the lease.
   *   KEYS[1] holder   KEYS[2] stream set
   *   ARGV[1] replica id   ARGV[2] ttl ms
   *   returns 1 renewed, 0 not held by the caller
   */
  renewHolder: {
    numberOfKeys: 2,
    lua: `${BUMP}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
bump(KEYS[2], ARGV[2])
return 1`
  },

  /*
   * releaseLease: deletes a lease only while it holds the caller's value.
   *   KEYS[1] lease
   *   ARGV[1] replica id
   *   returns 1 released, 0 not held by the caller
   */
  releaseLease: {
    numberOfKeys: 1,
    lua: `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])`
  },

  /*
   * claimHolder: makes the caller the holder of a client stream (a resume takes it over).
   *   KEYS[1] holder   KEYS[2] stream set
   *   ARGV[1] replica id   ARGV[2] ttl ms   ARGV[3] stream id
   *   returns the previous holder when it was another replica, else nil
   */
  claimHolder: {
    numberOfKeys: 2,
    lua: `${REMEMBER_STREAM}
local previous = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
remember(KEYS[2], ARGV[3], ARGV[2])
if previous == ARGV[1] then return false end
return previous`
  },

  /*
   * setCursor: records the last entry id written on a stream.
   *   KEYS[1] cursor   KEYS[2] stream set
   *   ARGV[1] entry id   ARGV[2] ttl ms   ARGV[3] stream id
   *   returns 1
   */
  setCursor: {
    numberOfKeys: 2,
    lua: `${REMEMBER_STREAM}
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
remember(KEYS[2], ARGV[3], ARGV[2])
return 1`
  },

  /*
   * appendEvent: adds one message to a stream's bounded log, refreshes its TTL, and reports who
   * holds the stream, in one round trip (ARCHITECTURE.md flow 1: append, then wake the holder).
   *   KEYS[1] events   KEYS[2] holder   KEYS[3] stream set
   *   ARGV[1] max length (approximate, MAXLEN ~)   ARGV[2] ttl ms   ARGV[3] message json ('' priming)
   *   ARGV[4] stream id
   *   returns { entry id, holder replica or nil }
   */
  appendEvent: {
    numberOfKeys: 3,
    lua: `${REMEMBER_STREAM}
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'm', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
remember(KEYS[3], ARGV[4], ARGV[2])
return { id, redis.call('GET', KEYS[2]) }`
  },

  /*
   * sendEnvelope: puts an envelope in a replica's inbox and refreshes the inbox TTL, so the
   * inbox of a replica that died expires.
   *   KEYS[1] inbox
   *   ARGV[1] max length (approximate)   ARGV[2] ttl ms   ARGV[3] envelope json
   *   returns the entry id
   */
  sendEnvelope: {
    numberOfKeys: 1,
    lua: `
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'e', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id`
  }
} as const

declare module 'ioredis' {
  interface RedisCommander<Context> {
    createSession (meta: RedisKey, ttlMs: number, ...fieldValues: string[]): Result<0 | 1, Context>
    updateSession (meta: RedisKey, ...fieldValues: string[]): Result<0 | 1, Context>
    deleteSession (meta: RedisKey, owner: RedisKey, streams: RedisKey, base: string): Result<0 | 1, Context>
    deleteEvents (streams: RedisKey, base: string): Result<number, Context>
    claimOwner (owner: RedisKey, replicaId: string, ttlMs: number): Result<string, Context>
    renewLease (lease: RedisKey, replicaId: string, ttlMs: number): Result<0 | 1, Context>
    renewHolder (holder: RedisKey, streams: RedisKey, replicaId: string, ttlMs: number): Result<0 | 1, Context>
    releaseLease (lease: RedisKey, replicaId: string): Result<0 | 1, Context>
    claimHolder (holder: RedisKey, streams: RedisKey, replicaId: string, ttlMs: number, streamId: string): Result<string | null, Context>
    setCursor (cursor: RedisKey, streams: RedisKey, entryId: string, ttlMs: number, streamId: string): Result<1, Context>
    appendEvent (events: RedisKey, holder: RedisKey, streams: RedisKey, maxLen: number, ttlMs: number, json: string, streamId: string): Result<[string, string | null], Context>
    sendEnvelope (inbox: RedisKey, maxLen: number, ttlMs: number, json: string): Result<string, Context>
  }
}

const defined = new WeakSet<Redis>()

/** Registers every script on a client (idempotent); ioredis runs them with EVALSHA. */
export function defineScripts (redis: Redis): void {
  if (defined.has(redis)) return
  for (const [name, { numberOfKeys, lua }] of Object.entries(scripts)) redis.defineCommand(name, { numberOfKeys, lua })
  defined.add(redis)
}
