// Both consent store twins (memory, Redis) keep the same contract: records readable until they
// expire, `take` hands a record to one caller only, a lock held by one is refused to the others.
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { MemoryConsentStore, type ConsentRecord, type ConsentStore } from '../../src/credentials/consent-store.js'
import { RedisConsentStore } from '../../src/credentials/consent-store-redis.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const redisServer = await startRedis(t)

const link: ConsentRecord = { kind: 'link', link: { tenant: 'acme', subjectDigest: 'd', server: 'api', expiresAt: Date.now() + 60_000 } }

function contract (name: string, make: (t: Test) => Promise<ConsentStore>): void {
  t.test(`${name}: records live until their ttl; take gives a record to one caller`, async t => {
    const store = await make(t)
    await store.put('a', link, 60_000)
    t.same(await store.get('a'), link)
    t.same(await store.get('a'), link, 'get leaves it')
    const taken = await Promise.all([store.take('a'), store.take('a'), store.take('a')])
    t.equal(taken.filter(r => r !== undefined).length, 1, 'one taker')
    t.equal(await store.get('a'), undefined)
    await store.put('short', link, 30)
    await sleep(80)
    t.equal(await store.get('short'), undefined, 'expired')
    t.equal(await store.take('missing'), undefined)
  })
  t.test(`${name}: a lock is held by one until released or expired`, async t => {
    const store = await make(t)
    const claims = await Promise.all([store.lock('k', 60_000), store.lock('k', 60_000)])
    t.same(claims.sort(), [false, true])
    await store.unlock('k')
    t.equal(await store.lock('k', 30), true)
    await sleep(80)
    t.equal(await store.lock('k', 30), true, 'an expired lock is free')
  })
}

contract('memory', async () => new MemoryConsentStore())
contract('redis', async t => new RedisConsentStore(await testRedis(t, redisServer.url), randomPrefix()))
