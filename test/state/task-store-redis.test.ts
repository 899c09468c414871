import t from 'tap'
import { RedisTaskStore } from '../../src/state/task-store-redis.js'
import { sampleTask, taskStoreContract } from './contract-task-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

taskStoreContract(t, async t => {
  const store = new RedisTaskStore(await testRedis(t, server.url), randomPrefix())
  t.teardown(() => store.close())
  return store
})

t.test('a record and its indexes expire in Redis itself', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisTaskStore(redis, prefix)
  const record = sampleTask({ expiresAt: Date.now() + 60_000 })
  await store.create(record)
  const ttl = await redis.pttl(`${prefix}:task:${record.id}`)
  t.ok(ttl > 55_000 && ttl <= 60_000, `the record expires with its task (${ttl} ms)`)
  t.equal(await redis.hget(`${prefix}:task:${record.id}`, 'status'), 'working', 'the status is kept as plain text for the update script')
  for (const key of [`${prefix}:{${record.sessionId!}}:tasks`, `${prefix}:tasks:replica:${record.replica}`, `${prefix}:tasks:replicas`]) {
    const left = await redis.pttl(key)
    t.ok(left > 55_000 && left <= 60_000, `${key} expires with its last record (${left} ms)`)
  }
})
