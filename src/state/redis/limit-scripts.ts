// Lua scripts of the tenant limits (rate buckets and session quotas; keys
// `P:rl:{tenant}:…`, `P:q:{tenant}:…`). Kept apart from scripts.ts (session state) because they
// serve a different module; same habits: every key in KEYS, one tenant's keys share `{tenant}`,
// Redis `TIME` is the one clock, every key gets a TTL.
import type { RedisKey, Result } from 'ioredis'
import type { Redis } from './client.js'

const scripts = {
  /*
   * chargeRate: GCRA over every bucket of one request; all are charged or none (the request is
   * refused when any bucket is empty). A bucket holds its theoretical arrival time (TAT) in
   * microseconds of Redis TIME; it expires when the TAT is reached (a full bucket needs no key).
   *   KEYS[1..n] buckets
   *   ARGV[2i-1] emission interval of bucket i (µs per request)
   *   ARGV[2i]   burst tolerance of bucket i (µs: burst × interval)
   *   returns 0 charged, or the µs to wait before bucket(s) would admit the request
   */
  chargeRate: {
    lua: `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tats = {}
local wait = 0
for i = 1, #KEYS do
  local interval = tonumber(ARGV[2 * i - 1])
  local tolerance = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0') or 0
  if tat < now then tat = now end
  local nextTat = tat + interval
  local allowAt = nextTat - tolerance
  if allowAt > now and allowAt - now > wait then wait = allowAt - now end
  tats[i] = nextTat
end
if wait > 0 then return math.ceil(wait) end
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], string.format('%.0f', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000) + 1)
end
return 0`
  },

  /*
   * takeSessionSlot: adds a session to the tenant's and the subject's quota sets unless either is
   * full. A limit of 0 means none (that set is left alone). Members are session ids scored by
   * the Redis time they joined; dead ones are removed by dropSessionSlots after the caller has
   * checked them against the session store (which lives under other hash tags).
   *   KEYS[1] tenant set   KEYS[2] subject set
   *   ARGV[1] session id   ARGV[2] tenant limit   ARGV[3] subject limit   ARGV[4] set ttl ms
   *   returns {1} taken (or already held); {2, members…} tenant full; {3, members…} subject full
   */
  takeSessionSlot: {
    lua: `
local sid = ARGV[1]
local limits = { tonumber(ARGV[2]), tonumber(ARGV[3]) }
for i = 1, 2 do
  local limit = limits[i]
  if limit > 0 and not redis.call('ZSCORE', KEYS[i], sid) and redis.call('ZCARD', KEYS[i]) >= limit then
    local members = redis.call('ZRANGE', KEYS[i], 0, -1)
    table.insert(members, 1, i + 1)
    return members
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, 2 do
  if limits[i] > 0 then
    redis.call('ZADD', KEYS[i], now, sid)
    redis.call('PEXPIRE', KEYS[i], ARGV[4])
  end
end
return { 1 }`
  },

  /*
   * dropSessionSlots: removes sessions from both quota sets.
   *   KEYS[1] tenant set   KEYS[2] subject set
   *   ARGV[1..] session ids
   *   returns how many memberships were removed
   */
  dropSessionSlots: {
    lua: `
local n = 0
for i = 1, 2 do n = n + redis.call('ZREM', KEYS[i], unpack(ARGV)) end
return n`
  }
} as const

declare module 'ioredis' {
  interface RedisCommander<Context> {
    chargeRate (numberOfKeys: number, ...keysThenArgs: Array<RedisKey | number>): Result<number, Context>
    takeSessionSlot (tenantSet: RedisKey, subjectSet: RedisKey, sid: string, tenantLimit: number, subjectLimit: number, ttlMs: number): Result<Array<number | string>, Context>
    dropSessionSlots (tenantSet: RedisKey, subjectSet: RedisKey, ...sids: string[]): Result<number, Context>
  }
}

const defined = new WeakSet<Redis>()

/** Registers the limit scripts on a client (idempotent); ioredis runs them with EVALSHA. */
export function defineLimitScripts (redis: Redis): void {
  if (defined.has(redis)) return
  // chargeRate takes a variable number of keys: its first argument says how many.
  redis.defineCommand('chargeRate', { lua: scripts.chargeRate.lua })
  redis.defineCommand('takeSessionSlot', { numberOfKeys: 2, lua: scripts.takeSessionSlot.lua })
  redis.defineCommand('dropSessionSlots', { numberOfKeys: 2, lua: scripts.dropSessionSlots.lua })
  defined.add(redis)
}
