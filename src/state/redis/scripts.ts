// Lua scripts for every Redis change that checks then writes or touches more than one key:
// one round trip each, atomic, so nothing can resurrect an expired key or
// leave a key without a TTL. Headers follow BullMQ: KEYS, ARGV, returns.
//
// Every script names every key it touches in KEYS (Redis Cluster routes a script by its keys, and
// a key it was not given is outside the contract even in the same slot). One session's keys share
// the `{sid}` hash tag, so a script over several of them runs in one slot. The delete scripts,
// which must find a session's per-stream keys, get them from the caller (who read the stream
// set) and refuse when the set changed in between.
import type { RedisKey, Result } from 'ioredis'
import type { Redis } from './client.js'

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

/**
 * appendEvent's work up to its reply (see there), shared with appendEventAndWake: leaves the
 * entry's id and ordinal in `id` and `n`, or returns { '', false } when nothing is written.
 */
const APPEND_EVENT = `${REMEMBER_STREAM}
if ARGV[5] ~= '' then
  local marker = redis.call('HGET', KEYS[4], ARGV[5])
  if marker == 'done' then return { '', false } end
  if marker then
    redis.call('HDEL', KEYS[4], ARGV[5])
  else
    if redis.call('EXISTS', KEYS[5]) == 0 then return { '', false } end
    for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
      local json = entry[2][2]
      if json ~= nil and json ~= '' then
        local ok, msg = pcall(cjson.decode, json)
        if ok and type(msg) == 'table' and msg.method == nil and msg.id ~= nil then
          local kind = type(msg.id) == 'number' and 'n' or 's'
          if kind == ARGV[6] and tostring(msg.id) == ARGV[7] then return { '', false } end
        end
      end
    end
  end
end
local n = redis.call('HINCRBY', KEYS[6], ARGV[4], 1)
bump(KEYS[6], ARGV[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'm', ARGV[3], 'n', n)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
remember(KEYS[3], ARGV[4], ARGV[2])
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
   * deleteSession: drops the record, the owner lease, the pending markers and, for every stream
   * of the session, its events, holder and cursor keys; then the stream set. Every key is named
   * in KEYS (Redis Cluster): the caller reads the stream set first and passes each stream's
   * three keys. The record goes whatever else happens, in the first call: once a DELETE is
   * answered, no replica may find the session (refusing whenever a stream was added meanwhile
   * could, ten refusals in a row, leave the record in place). A stream added since the caller
   * read the set keeps the set (and its own keys) for the caller's next call, which names it.
   *   KEYS[1] meta   KEYS[2] owner   KEYS[3] stream set   KEYS[4] pending
   *   KEYS[5..] events, holder, cursor of ARGV[1], then of ARGV[2] …, then the seq hash
   *   ARGV[1..] the stream ids
   *   returns 1 the record existed, 0 it did not; plus 2 when streams were added meanwhile (call again)
   */
  deleteSession: {
    numberOfKeys: 4,
    variadicKeys: true,
    lua: `
local existed = redis.call('DEL', KEYS[1])
for i = 2, #KEYS do
  if i ~= 3 then redis.call('DEL', KEYS[i]) end
end
local given = {}
for _, s in ipairs(ARGV) do given[s] = true end
for _, s in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if not given[s] then return existed + 2 end
end
redis.call('DEL', KEYS[3])
return existed`
  },

  /*
   * deleteEvents: drops the event logs of every stream of a session (not holders or cursors).
   * As deleteSession, the caller names every log in KEYS.
   *   KEYS[1] stream set   KEYS[2..] the events key of ARGV[1], ARGV[2] …, then the seq hash
   *   ARGV[1..] the stream ids
   *   returns the number of logs deleted, -1 the stream set changed (retry)
   */
  deleteEvents: {
    numberOfKeys: 1,
    variadicKeys: true,
    lua: `
local given = {}
for _, s in ipairs(ARGV) do given[s] = true end
for _, s in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if not given[s] then return -1 end
end
local n = 0
for i = 2, #KEYS do n = n + redis.call('DEL', KEYS[i]) end
return n`
  },

  /*
   * takeOwner: takes the owner lease from a replica that is gone, or when free.
   *   KEYS[1] owner
   *   ARGV[1] replica id   ARGV[2] the gone owner ('' none)   ARGV[3] ttl ms
   *   returns the owner after the call
   */
  takeOwner: {
    numberOfKeys: 1,
    lua: `
local current = redis.call('GET', KEYS[1])
if (not current) or current == ARGV[2] or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return ARGV[1]
end
return current`
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
   * keepStream: the upkeep of one client stream its holder keeps (SessionStore.keepStreams):
   * refreshes the session's idle TTL, then renews the holder lease, or takes it again when it
   * lapsed and nobody took it meanwhile.
   *   KEYS[1] meta   KEYS[2] holder   KEYS[3] stream set
   *   ARGV[1] replica id   ARGV[2] lease ms   ARGV[3] idle ms   ARGV[4] stream id   ARGV[5] '1' leased, '0' session only
   *   returns 0 the session is gone, 1 held, 2 re-claimed, 3 another replica holds it
   */
  keepStream: {
    numberOfKeys: 3,
    lua: `${REMEMBER_STREAM}
if redis.call('PEXPIRE', KEYS[1], ARGV[3]) == 0 then return 0 end
if ARGV[5] ~= '1' then return 1 end
local holder = redis.call('GET', KEYS[2])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  bump(KEYS[3], ARGV[2])
  return 1
end
if holder then return 3 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
remember(KEYS[3], ARGV[4], ARGV[2])
return 2`
  },

  /*
   * keepOwner: the upkeep of one owner lease (SessionStore.keepOwners): renewed while the
   * caller's, taken when free; nothing when the session is gone.
   *   KEYS[1] meta   KEYS[2] owner
   *   ARGV[1] replica id   ARGV[2] lease ms
   *   returns 0 the session is gone, 1 held, 2 claimed, 3 another replica owns it
   */
  keepOwner: {
    numberOfKeys: 2,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local owner = redis.call('GET', KEYS[2])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
if owner then return 3 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 2`
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
   * holds the stream, in one round trip (docs/architecture.md).
   * An answer to a request names its pending marker, so every request gets exactly one answer:
   * a marker present is taken and the answer written; a tombstone ('done': answered elsewhere)
   * means no write; no marker at all means answered already (its answer is in this log) or lost
   * with a primary that failed over before replicating it: written unless the log has an answer
   * to that id, or the session is gone. Each entry carries its ordinal in the stream (field n,
   * from the session's seq hash), so a reader can count entries trimmed before it delivered them.
   *   KEYS[1] events   KEYS[2] holder   KEYS[3] stream set   KEYS[4] pending   KEYS[5] meta
   *   KEYS[6] seq hash
   *   ARGV[1] max length (approximate, MAXLEN ~)   ARGV[2] ttl ms   ARGV[3] message json ('' priming)
   *   ARGV[4] stream id   ARGV[5] pending field of the request answered ('' none)
   *   ARGV[6] 'n' or 's': the type of the answered id   ARGV[7] the id as a string
   *   returns { entry id ('' not written: answered already), holder replica or false, the entry's ordinal }
   */
  appendEvent: {
    numberOfKeys: 6,
    lua: `${APPEND_EVENT}
return { id, redis.call('GET', KEYS[2]), n }`
  },

  /*
   * appendEventAndWake: appendEvent, then, if the stream's holder is the replica a wake was
   * prepared for, that wake in its inbox (as sendEnvelope puts it there), in the same step: the
   * holder reads the entry without the appender's second round trip. Its inbox is
   * another slot, so never on a Cluster (Bus.prepareWake).
   *   KEYS[1..6] as appendEvent   KEYS[7] the holder's inbox
   *   ARGV[1..7] as appendEvent   ARGV[8] the replica the wake is for   ARGV[9] inbox max length
   *   ARGV[10] inbox ttl ms   ARGV[11..13] the envelope JSON around the entry's ordinal and id
   *   returns appendEvent's reply, then 1 when the wake was written (else 0)
   */
  appendEventAndWake: {
    numberOfKeys: 7,
    lua: `${APPEND_EVENT}
local holder = redis.call('GET', KEYS[2])
if holder ~= ARGV[8] then return { id, holder, n, 0 } end
redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[9], '*', 'e', ARGV[11] .. n .. ARGV[12] .. id .. ARGV[13])
redis.call('PEXPIRE', KEYS[7], ARGV[10])
return { id, holder, n, 1 }`
  },

  /*
   * markPending: records the requests of a POST as waiting for an answer, each with the server's
   * time (every replica compares one clock) and the replica that serves it, makes the replica that
   * took the POST the holder of its new stream (ARGV[6] > 0: the one round trip a stream's open
   * would otherwise add), and appends the stream's priming entry; nothing when the session's
   * record is gone (deleted or expired), so a POST need not read the record first (Sessions.get).
   *   KEYS[1] events   KEYS[2] stream set   KEYS[3] pending   KEYS[4] seq hash (the priming entry's ordinal)
   *   KEYS[5] holder   KEYS[6] meta
   *   ARGV[1] max length   ARGV[2] ttl ms   ARGV[3] '1' append a priming entry   ARGV[4] stream id
   *   ARGV[5] serving replica id   ARGV[6] holder lease ms (0: no holder)   ARGV[7] holder replica id
   *   ARGV[8..] pending fields
   *   returns the priming entry id, '' without priming, or nil when the session is gone
   */
  markPending: {
    numberOfKeys: 6,
    lua: `${REMEMBER_STREAM}
if redis.call('EXISTS', KEYS[6]) == 0 then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 8, #ARGV do redis.call('HSET', KEYS[3], ARGV[i], now .. '|' .. ARGV[5]) end
bump(KEYS[3], ARGV[2])
if tonumber(ARGV[6]) > 0 then
  redis.call('SET', KEYS[5], ARGV[7], 'PX', ARGV[6])
  remember(KEYS[2], ARGV[4], ARGV[6])
end
if ARGV[3] ~= '1' then return '' end
local n = redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
bump(KEYS[4], ARGV[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'm', '', 'n', n)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
remember(KEYS[2], ARGV[4], ARGV[2])
return id`
  },

  /*
   * claimOrphans: takes the pending markers of requests whose answers can no longer come (each
   * becomes a tombstone; the caller answers it): those naming ARGV[1], or with ARGV[1] '' every
   * one recorded up to now except those naming ARGV[2] (requests a takeover re-delivers).
   *   KEYS[1] pending
   *   ARGV[1] serving replica or ''   ARGV[2] replica whose markers stay, or ''
   *   ARGV[3] markers younger than this many ms stay (absent: 0)
   *   returns the fields taken
   */
  claimOrphans: {
    numberOfKeys: 1,
    lua: `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cutoff = now - (tonumber(ARGV[3]) or 0)
local all = redis.call('HGETALL', KEYS[1])
local taken = {}
for i = 1, #all, 2 do
  local at, by = string.match(all[i + 1], '^(%d+)|(.*)$')
  if at and tonumber(at) <= cutoff and ((ARGV[1] == '' and by ~= ARGV[2]) or (ARGV[1] ~= '' and by == ARGV[1])) then
    redis.call('HSET', KEYS[1], all[i], 'done')
    taken[#taken + 1] = all[i]
  end
end
return taken`
  },

  /*
   * settlePending: marks one request answered (a tombstone), e.g. one answered directly while
   * the store was unreachable, so no later answer is written.
   *   KEYS[1] pending
   *   ARGV[1] field   ARGV[2] ttl ms
   *   returns 1 the request was still pending, 0 it was not
   */
  settlePending: {
    numberOfKeys: 1,
    lua: `${BUMP}
local marker = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], 'done')
bump(KEYS[1], ARGV[2])
if marker and marker ~= 'done' then return 1 end
return 0`
  },

  /*
   * discardStream: a completed POST stream no client can resume (answered as one JSON body, so no
   * event id of it was ever sent) goes at once, in one step: its log, its ordinal, its holder
   * lease while the caller holds it, its place in the stream set (when no lease of another
   * replica is left on it), and the pending markers of requests its writer answered directly
   * (tombstones stay: a request settled elsewhere keeps refusing late answers).
   *   KEYS[1] events   KEYS[2] holder   KEYS[3] stream set   KEYS[4] seq hash   KEYS[5] pending
   *   ARGV[1] stream id   ARGV[2] the caller's replica id   ARGV[3..] pending fields to take
   *   returns the number of markers taken
   */
  discardStream: {
    numberOfKeys: 5,
    lua: `
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SREM', KEYS[3], ARGV[1]) end
local taken = 0
for i = 3, #ARGV do
  local marker = redis.call('HGET', KEYS[5], ARGV[i])
  if marker and marker ~= 'done' then
    redis.call('HDEL', KEYS[5], ARGV[i])
    taken = taken + 1
  end
end
return taken`
  },

  /*
   * forgetStreams: drops the stream-set entries and ordinals of streams whose keys have all
   * lapsed (their logs, holder leases and cursors expired one by one, which the set cannot see).
   * Each sampled id is checked here, atomically, so an entry made again meanwhile stays: the set
   * lists every stream that still has a key (deleteSession relies on it), and nothing else.
   *   KEYS[1] stream set   KEYS[2] seq hash
   *   KEYS[3..] events, holder, cursor of ARGV[1], then of ARGV[2] …
   *   ARGV[1..] the sampled stream ids
   *   returns the number of entries dropped
   */
  forgetStreams: {
    numberOfKeys: 2,
    variadicKeys: true,
    lua: `
local dropped = 0
for i, s in ipairs(ARGV) do
  local k = 3 + (i - 1) * 3
  if redis.call('EXISTS', KEYS[k], KEYS[k + 1], KEYS[k + 2]) == 0 then
    dropped = dropped + redis.call('SREM', KEYS[1], s)
    redis.call('HDEL', KEYS[2], s)
  end
end
return dropped`
  },

  /*
   * sendEnvelope: puts an envelope in a replica's inbox and refreshes the inbox TTL, so the
   * inbox of a replica that died expires.
   *   KEYS[1] inbox
   *   ARGV[1] max length (approximate)   ARGV[2] ttl ms   ARGV[3] envelope json
   *   returns the entry id
   */
  /*
   * openInbox: makes the two consumer groups of a replica's inbox: the one it is read through
   * (ARGV[1], XREADGROUP NOACK) and one that only records how far the reader has handed client
   * messages on to its backends (ARGV[2], moved with XGROUP SETID after each batch): what lies
   * past the second was never handed on (takeUnread). Both start at ARGV[3], or at the inbox's
   * last entry when '' (what an earlier life of the replica id left is stale); existing groups
   * are moved there. A stream made for the groups alone gets the inbox TTL.
   *   KEYS[1] inbox
   *   ARGV[1] read group   ARGV[2] handed group   ARGV[3] start id or ''   ARGV[4] ttl ms
   *   returns the id the groups start after
   */
  openInbox: {
    numberOfKeys: 1,
    lua: `
local start = ARGV[3]
if start == '' then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  start = last[1] and last[1][1] or '0-0'
end
for g = 1, 2 do
  local made = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[g], start, 'MKSTREAM')
  if type(made) == 'table' and made.err then redis.call('XGROUP', 'SETID', KEYS[1], ARGV[g], start) end
end
if redis.call('PTTL', KEYS[1]) == -1 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return start`
  },

  /*
   * takeUnread: the client messages of one session that a dead replica never handed on to a
   * backend (its inbox's entries past the last delivered id of its `handed` group, openInbox; all
   * of them when the group is gone with the key). They leave the inbox (a reader that was
   * only frozen can no longer get them, so each is delivered once), and the pending marker of
   * each request names ARGV[3] from now on, the replica that will serve it. A request already
   * answered (a tombstone) is dropped; responses to server requests stay (they die with it).
   *   KEYS[1] inbox   KEYS[2] pending
   *   ARGV[1] group   ARGV[2] session id   ARGV[3] new serving replica
   *   returns the envelopes' JSON, oldest first
   */
  takeUnread: {
    numberOfKeys: 2,
    lua: `
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local from = '-'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  if name == ARGV[1] and last then from = '(' .. last end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local taken = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], from, '+')) do
  local json = entry[2][2]
  if json and string.find(json, ARGV[2], 1, true) then
    local ok, env = pcall(cjson.decode, json)
    if ok and type(env) == 'table' and env.kind == 'deliver' and env.sid == ARGV[2] and type(env.message) == 'table' and env.message.method ~= nil then
      redis.call('XDEL', KEYS[1], entry[1])
      local id = env.message.id
      if id ~= nil and id ~= cjson.null and type(env.streamId) == 'string' then
        local field = env.streamId .. ' ' .. (type(id) == 'number' and 'n' or 's') .. tostring(id)
        local marker = redis.call('HGET', KEYS[2], field)
        if marker ~= 'done' then
          if marker then redis.call('HSET', KEYS[2], field, now .. '|' .. ARGV[3]) end
          taken[#taken + 1] = json
        end
      else
        taken[#taken + 1] = json
      end
    end
  end
end
return taken`
  },

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
    deleteSession (numberOfKeys: number, ...keysThenStreamIds: string[]): Result<0 | 1 | 2 | 3, Context>
    keepStream (meta: RedisKey, holder: RedisKey, streams: RedisKey, replicaId: string, leaseMs: number, idleMs: number, streamId: string, leased: '0' | '1'): Result<0 | 1 | 2 | 3, Context>
    keepOwner (meta: RedisKey, owner: RedisKey, replicaId: string, leaseMs: number): Result<0 | 1 | 2 | 3, Context>
    deleteEvents (numberOfKeys: number, ...keysThenStreamIds: string[]): Result<number, Context>
    takeOwner (owner: RedisKey, replicaId: string, from: string, ttlMs: number): Result<string, Context>
    markPending (events: RedisKey, streams: RedisKey, pending: RedisKey, seq: RedisKey, holder: RedisKey, meta: RedisKey, maxLen: number, ttlMs: number, priming: string, streamId: string, servedBy: string, holderMs: number, holderReplica: string, ...fields: string[]): Result<string | null, Context>
    claimOrphans (pending: RedisKey, replicaId: string, except: string, minAgeMs?: number): Result<string[], Context>
    openInbox (inbox: RedisKey, readGroup: string, handedGroup: string, start: string, ttlMs: number): Result<string, Context>
    takeUnread (inbox: RedisKey, pending: RedisKey, group: string, sid: string, servedBy: string): Result<string[], Context>
    claimOwner (owner: RedisKey, replicaId: string, ttlMs: number): Result<string, Context>
    renewLease (lease: RedisKey, replicaId: string, ttlMs: number): Result<0 | 1, Context>
    renewHolder (holder: RedisKey, streams: RedisKey, replicaId: string, ttlMs: number): Result<0 | 1, Context>
    releaseLease (lease: RedisKey, replicaId: string): Result<0 | 1, Context>
    claimHolder (holder: RedisKey, streams: RedisKey, replicaId: string, ttlMs: number, streamId: string): Result<string | null, Context>
    setCursor (cursor: RedisKey, streams: RedisKey, entryId: string, ttlMs: number, streamId: string): Result<1, Context>
    appendEvent (events: RedisKey, holder: RedisKey, streams: RedisKey, pending: RedisKey, meta: RedisKey, seq: RedisKey, maxLen: number, ttlMs: number, json: string, streamId: string, answers: string, idKind: string, id: string): Result<[string, string | null, number | undefined], Context>
    appendEventAndWake (events: RedisKey, holder: RedisKey, streams: RedisKey, pending: RedisKey, meta: RedisKey, seq: RedisKey, inbox: RedisKey, maxLen: number, ttlMs: number, json: string, streamId: string, answers: string, idKind: string, id: string, wakeFor: string, inboxMaxLen: number, inboxTtlMs: number, head: string, mid: string, tail: string): Result<[string, string | null, number | undefined, (0 | 1)?], Context>
    settlePending (pending: RedisKey, field: string, ttlMs: number): Result<0 | 1, Context>
    discardStream (events: RedisKey, holder: RedisKey, streams: RedisKey, seq: RedisKey, pending: RedisKey, streamId: string, replicaId: string, ...fields: string[]): Result<number, Context>
    forgetStreams (numberOfKeys: number, ...keysThenStreamIds: string[]): Result<number, Context>
    sendEnvelope (inbox: RedisKey, maxLen: number, ttlMs: number, json: string): Result<string, Context>
  }
}

const defined = new WeakSet<Redis>()

/** Registers every script on a client (idempotent); ioredis runs them with EVALSHA. */
export function defineScripts (redis: Redis): void {
  if (defined.has(redis)) return
  for (const [name, script] of Object.entries(scripts)) {
    // A variadic script takes its key count as its first argument (ioredis: numberOfKeys omitted).
    redis.defineCommand(name, 'variadicKeys' in script ? { lua: script.lua } : { numberOfKeys: script.numberOfKeys, lua: script.lua })
  }
  defined.add(redis)
}
