import t from 'tap'
import { RedisSessionQuotas } from '../../src/auth/quotas.js'
import { quotasContract } from './contract-quotas.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

quotasContract(t, async (t, n) => {
  const prefix = randomPrefix()
  return await Promise.all(Array.from({ length: n }, async () => new RedisSessionQuotas(await testRedis(t, server.url), prefix, 60_000)))
})

t.test('quota sets are zsets under the tenant hash tag, with a TTL', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const quotas = new RedisSessionQuotas(redis, prefix, 60_000)
  await quotas.take({ tenant: 'acme', subject: 'abc', sid: 's1', perTenant: 5, perSubject: 2 })
  t.same((await redis.keys(`${prefix}:*`)).sort(), [`${prefix}:q:{acme}:s:abc`, `${prefix}:q:{acme}:t`])
  for (const key of await redis.keys(`${prefix}:*`)) {
    t.equal(await redis.type(key), 'zset')
    const ttl = await redis.pttl(key)
    t.ok(ttl > 59_000 && ttl <= 60_000, `${key} has the TTL (${ttl} ms)`)
    t.same(await redis.zrange(key, '0', '-1'), ['s1'])
  }
})
