import t from 'tap'
import { bucketsFor, MemoryRateLimiter, retryAfterSeconds } from '../../src/auth/rate-limit.js'
import { rateLimiterContract } from './contract-rate-limit.js'

rateLimiterContract(t, async (t, n) => {
  const limiter = new MemoryRateLimiter()
  t.teardown(() => limiter.close())
  return Array.from({ length: n }, () => limiter)
})

t.test('GCRA on a controlled clock: exact admissions over time', async t => {
  let now = 1_000_000_000
  const limiter = new MemoryRateLimiter(() => now)
  const buckets = [{ id: 't', ratePerSecond: 10, burst: 3 }]
  const admitted = async (): Promise<boolean> => (await limiter.consume('x', buckets)).allowed
  t.same([await admitted(), await admitted(), await admitted(), await admitted()], [true, true, true, false])
  now += 99_000
  t.equal(await admitted(), false, 'not before one interval (100 ms)')
  now += 1_000
  t.equal(await admitted(), true, 'one token after one interval')
  t.equal(await admitted(), false)
  now += 10_000_000
  t.equal((await Promise.all([1, 2, 3, 4].map(admitted))).filter(Boolean).length, 3, 'refills up to the burst only')
  const refused = await limiter.consume('x', buckets)
  t.equal(refused.retryAfterMs, 100)
})

t.test('bucketsFor: the tenant and subject budgets a config asks for', async t => {
  t.same(bucketsFor({}, 'd'), [])
  t.same(bucketsFor({ requestsPerSecond: 20, burst: 40 }, 'd'), [{ id: 't', ratePerSecond: 20, burst: 40 }])
  t.same(bucketsFor({ requestsPerSecond: 0.5 }, 'd'), [{ id: 't', ratePerSecond: 0.5, burst: 1 }], 'burst defaults to the rate, at least 1')
  t.same(bucketsFor({ requestsPerSecondPerSubject: 2.5 }, 'd'), [{ id: 's:d', ratePerSecond: 2.5, burst: 3 }])
  t.same(bucketsFor({ requestsPerSecond: 5, requestsPerSecondPerSubject: 1, burstPerSubject: 4 }, 'd').map(b => b.id), ['t', 's:d'])
})

t.test('Retry-After is whole seconds, rounded up, at least 1', async t => {
  t.equal(retryAfterSeconds(1), 1)
  t.equal(retryAfterSeconds(1000), 1)
  t.equal(retryAfterSeconds(1001), 2)
  t.equal(retryAfterSeconds(0), 1)
})
