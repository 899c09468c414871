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

t.test('delete removes the record in its first call, even while streams keep being added', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix)
  const record = sampleRecord()
  await store.create(record, 60_000)
  await store.claimHolder(record.id, 'get', 'replica-a', 60_000)
  const streamsKey = `${prefix}:{${record.id}}:streams`
  // A client that opens a new stream every time delete has read the stream set (a POST flood on
  // the session): a delete that refused and retried then could give up with the record still there.
  const smembers = redis.smembers.bind(redis)
  let added = 0
  ;(redis as unknown as { smembers: typeof smembers }).smembers = (async (key: string) => {
    const members = await smembers(key)
    if (key === streamsKey) await redis.sadd(streamsKey, `r1_flood${++added}`)
    return members
  }) as typeof smembers
  t.equal(await store.delete(record.id), true, 'the record existed')
  t.equal(await redis.exists(`${prefix}:{${record.id}}:meta`), 0, 'the record is gone')
  t.equal(await store.get(record.id), null, 'nobody finds the session any more')
  t.equal(await store.getHolder(record.id, 'get'), null, 'its holder lease is gone')
  t.ok(added > 1, `delete went on for the streams added meanwhile (${added} calls)`)
})

t.test('a heartbeat on its own connection is written while the command connection is busy', async t => {
  const redis = await testRedis(t, server.url)
  const beatRedis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const store = new RedisSessionStore(redis, prefix, beatRedis)
  // A command that holds the command connection for 3 s: everything pipelined behind it waits.
  const blocked = redis.blpop(`${prefix}:nothing`, 3)
  const started = Date.now()
  await store.heartbeat('replica-a', 10_000)
  const took = Date.now() - started
  t.ok(took < 1_500, `the beat did not wait behind the busy connection (${took} ms)`)
  t.equal(await beatRedis.exists(`${prefix}:replica:replica-a`), 1, 'the heartbeat key is there')
  await blocked
  t.equal(await store.isAlive('replica-a'), true)
})
