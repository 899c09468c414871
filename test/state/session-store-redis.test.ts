import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { RedisSessionStore } from '../../src/state/session-store-redis.js'
import { sampleRecord, sessionStoreContract } from './contract-session-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

sessionStoreContract(t, async t => {
  const store = new RedisSessionStore(await testRedis(t, server.url), randomPrefix())
  t.teardown(() => store.close())
  return store
})

t.test('the record is a hash of JSON fields under the session hash tag', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix)
  const record = sampleRecord({ backendSessionId: null })
  await store.create(record, 60_000)
  const hash = await redis.hgetall(`${prefix}:{${record.id}}:meta`)
  t.equal(hash.server, '"files"')
  t.equal(hash.backendSessionId, 'null')
  t.equal(hash.createdAt, String(record.createdAt))
  t.same(JSON.parse(hash.initializeParams!), record.initializeParams)
})

t.test('update of an expired record does not leave a key behind', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix)
  const record = sampleRecord()
  await store.create(record, 50)
  await sleep(150)
  t.equal(await store.update(record.id, { backendSessionId: 'x' }), false)
  t.equal(await redis.exists(`${prefix}:{${record.id}}:meta`), 0, 'no TTL-less key resurrected')
})
