import t from 'tap'
import { RedisSessionTasks } from '../../src/state/session-tasks-redis.js'
import { sessionTasksContract } from './contract-session-tasks.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

sessionTasksContract(t, async t => new RedisSessionTasks(await testRedis(t, server.url), randomPrefix()))

t.test('one hash under the session\'s hash tag, with a TTL', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const view = new RedisSessionTasks(redis, prefix)
  await view.put('sid1', { taskId: 'a', status: 'working', seenAt: 1 }, 60_000)
  const key = `${prefix}:{sid1}:taskview`
  t.same(JSON.parse((await redis.hget(key, 'a'))!), { taskId: 'a', status: 'working', seenAt: 1 })
  const ttl = await redis.pttl(key)
  t.ok(ttl > 0 && ttl <= 60_000, 'expires')
})
