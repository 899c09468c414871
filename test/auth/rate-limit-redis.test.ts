import t from 'tap'
import { RedisRateLimiter } from '../../src/auth/rate-limit.js'
import { isGatewayError } from '../../src/core/errors.js'
import { rateLimiterContract } from './contract-rate-limit.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

rateLimiterContract(t, async (t, n) => {
  const prefix = randomPrefix()
  return await Promise.all(Array.from({ length: n }, async () => new RedisRateLimiter(await testRedis(t, server.url), prefix)))
})

t.test('buckets live under the tenant hash tag, each with a TTL of its refill', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const limiter = new RedisRateLimiter(redis, prefix)
  await limiter.consume('acme', [{ id: 't', ratePerSecond: 1, burst: 10 }, { id: 's:abc', ratePerSecond: 1, burst: 10 }])
  t.same((await redis.keys(`${prefix}:*`)).sort(), [`${prefix}:rl:{acme}:s:abc`, `${prefix}:rl:{acme}:t`])
  for (const key of await redis.keys(`${prefix}:*`)) {
    const ttl = await redis.pttl(key)
    t.ok(ttl > 0 && ttl <= 1001, `${key} expires once refilled (${ttl} ms)`)
  }
})

t.test('Redis down: the call fails with a 503 store error, and works again after a restart', async t => {
  const own = await startRedis(t)
  const limiter = new RedisRateLimiter(await testRedis(t, own.url), randomPrefix())
  const buckets = [{ id: 't', ratePerSecond: 1, burst: 1 }]
  t.equal((await limiter.consume('acme', buckets)).allowed, true)
  await own.stop()
  const err = await limiter.consume('acme', buckets).then(() => null, (e: unknown) => e)
  t.ok(isGatewayError(err) && err.code === 'GW_ERR_STORE_UNAVAILABLE' && err.statusCode === 503, 'GW_ERR_STORE_UNAVAILABLE')
})
