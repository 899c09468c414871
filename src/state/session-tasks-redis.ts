// Redis twin of the sessions' task view (session-tasks.ts): one hash per session, task id -> JSON,
// in the session's hash slot. put() is one script: read the status before, keep an ended one,
// write, renew the TTL and drop one entry past the bound (the same choice as the memory twin's).
import { sessionTaskViewKey } from './redis/keys.js'
import { storeCall, type Redis } from './redis/client.js'
import { byCreation, MAX_SESSION_TASKS, type SessionTask, type SessionTasks } from './session-tasks.js'

/**
 * KEYS: the hash. ARGV: task id, its JSON, ttl ms, the bound, its status.
 * Returns the status before ('' when new).
 */
const PUT = `
local terminal = { completed = true, failed = true, cancelled = true }
local old = redis.call('HGET', KEYS[1], ARGV[1])
local prev = ''
if old then prev = cjson.decode(old).status or '' end
if not (old and terminal[prev] and prev ~= ARGV[5]) then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if not old and redis.call('HLEN', KEYS[1]) > tonumber(ARGV[4]) then
  local all = redis.call('HGETALL', KEYS[1])
  local pick, pickEnded, pickSeen = nil, false, 0
  for i = 1, #all, 2 do
    local t = cjson.decode(all[i + 1])
    local ended = terminal[t.status] == true
    local seen = tonumber(t.seenAt) or 0
    if pick == nil or (ended and not pickEnded) or (ended == pickEnded and seen < pickSeen) then
      pick, pickEnded, pickSeen = all[i], ended, seen
    end
  end
  if pick then redis.call('HDEL', KEYS[1], pick) end
end
return prev
`

export class RedisSessionTasks implements SessionTasks {
  readonly #redis: Redis
  readonly #prefix: string

  /** The client is shared: whoever made it closes it. */
  constructor (redis: Redis, prefix: string) {
    this.#redis = redis
    this.#prefix = prefix
  }

  async put (sid: string, task: SessionTask, ttlMs: number): Promise<string | null> {
    const key = sessionTaskViewKey(this.#prefix, sid)
    const prev = await storeCall(this.#redis.eval(PUT, 1, key, task.taskId, JSON.stringify(task), ttlMs, MAX_SESSION_TASKS, task.status))
    return typeof prev === 'string' && prev !== '' ? prev : null
  }

  async list (sid: string): Promise<SessionTask[]> {
    const hash = await storeCall(this.#redis.hgetall(sessionTaskViewKey(this.#prefix, sid)))
    const tasks: SessionTask[] = []
    for (const json of Object.values(hash)) {
      try {
        tasks.push(JSON.parse(json) as SessionTask)
      } catch {
        // Written only by put(): a field that does not parse is skipped, not fatal to the view.
      }
    }
    return tasks.sort(byCreation)
  }

  async forget (sid: string): Promise<void> {
    await storeCall(this.#redis.del(sessionTaskViewKey(this.#prefix, sid)))
  }
}
