// The rate limiter contract: every test runs against the memory twin and the
// Redis twin. Budgets are chosen so that refill during a test cannot change the count (rates of
// 0.001/s), except where a test waits for a refill on purpose; nothing asserts a duration.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import type { Bucket, RateLimiter } from '../../src/auth/rate-limit.js'

/**
 * Makes `n` limiters over one shared budget store for a subtest (the memory twin: one instance n
 * times; the Redis twin: n instances on n connections to one Redis). Closed in t.teardown.
 */
export type MakeLimiters = (t: Test, n: number) => Promise<RateLimiter[]>

const SLOW = 0.001

const tenantBucket = (burst: number, ratePerSecond = SLOW): Bucket => ({ id: 't', ratePerSecond, burst })
const subjectBucket = (subject: string, burst: number, ratePerSecond = SLOW): Bucket => ({ id: `s:${subject}`, ratePerSecond, burst })

async function count (limiter: RateLimiter, tenant: string, buckets: Bucket[], tries: number): Promise<number> {
  let admitted = 0
  for (let i = 0; i < tries; i++) if ((await limiter.consume(tenant, buckets)).allowed) admitted++
  return admitted
}

export function rateLimiterContract (t: Test, make: MakeLimiters): void {
  t.test('a burst is admitted, then requests are refused with a wait', async t => {
    const [limiter] = await make(t, 1)
    const tenant = randomUUID()
    t.equal(await count(limiter!, tenant, [tenantBucket(5, 1)], 5), 5, 'the whole burst')
    const refused = await limiter!.consume(tenant, [tenantBucket(5, 1)])
    t.equal(refused.allowed, false)
    t.ok(refused.retryAfterMs > 0 && refused.retryAfterMs <= 1000, `waits at most one interval (${refused.retryAfterMs} ms)`)
  })

  t.test('the wait of a fractional rate spans its whole interval', async t => {
    const [limiter] = await make(t, 1)
    const tenant = randomUUID()
    t.equal((await limiter!.consume(tenant, [tenantBucket(1, 0.5)])).allowed, true)
    const refused = await limiter!.consume(tenant, [tenantBucket(1, 0.5)])
    t.equal(refused.allowed, false)
    t.ok(refused.retryAfterMs > 1000 && refused.retryAfterMs <= 2000, `about two seconds (${refused.retryAfterMs} ms)`)
  })

  t.test('a cost of n takes n from every bucket, or nothing', async t => {
    const [limiter] = await make(t, 1)
    const tenant = randomUUID()
    const buckets = [tenantBucket(10), subjectBucket('a', 8)]
    t.equal((await limiter!.consume(tenant, buckets, 5)).allowed, true, '5 of 8')
    t.equal((await limiter!.consume(tenant, buckets, 4)).allowed, false, '4 more do not fit the subject\'s 8')
    t.equal((await limiter!.consume(tenant, buckets, 3)).allowed, true, 'the refusal cost nothing: 3 more fit')
    t.equal((await limiter!.consume(tenant, buckets)).allowed, false, 'the subject\'s 8 are spent')
    t.equal(await count(limiter!, tenant, [tenantBucket(10)], 5), 2, 'the tenant\'s 10 lost 8: 2 left')
  })

  t.test('a spent budget refills at its rate', async t => {
    const [limiter] = await make(t, 1)
    const tenant = randomUUID()
    const buckets = [tenantBucket(2, 20)]
    t.equal(await count(limiter!, tenant, buckets, 3), 2)
    await sleep(250) // several intervals of 50 ms
    t.equal((await limiter!.consume(tenant, buckets)).allowed, true, 'admitted again after the refill')
  })

  t.test('tenants and subjects have budgets of their own', async t => {
    const [limiter] = await make(t, 1)
    const a = randomUUID()
    const b = randomUUID()
    t.equal(await count(limiter!, a, [tenantBucket(3)], 5), 3)
    t.equal(await count(limiter!, b, [tenantBucket(3)], 5), 3, 'another tenant is not affected')
    t.equal(await count(limiter!, a, [subjectBucket('alice', 2)], 4), 2)
    t.equal(await count(limiter!, a, [subjectBucket('bob', 2)], 4), 2, 'another subject is not affected')
  })

  t.test('all buckets or none: a refusal charges no bucket', async t => {
    const [limiter] = await make(t, 1)
    const tenant = randomUUID()
    // alice may send 2, the tenant 5: alice's third request must not cost the tenant anything.
    const alice = [tenantBucket(5), subjectBucket('alice', 2)]
    t.equal(await count(limiter!, tenant, alice, 10), 2, 'alice gets her own budget')
    const bob = [tenantBucket(5), subjectBucket('bob', 10)]
    t.equal(await count(limiter!, tenant, bob, 10), 3, 'the tenant budget lost only what alice was admitted')
    t.equal(await count(limiter!, tenant, [tenantBucket(5), subjectBucket('carol', 10)], 2), 0, 'the tenant budget is spent for everyone')
  })

  t.test('no buckets: always admitted', async t => {
    const [limiter] = await make(t, 1)
    t.equal(await count(limiter!, randomUUID(), [], 20), 20)
  })

  t.test('concurrent requests through several limiters share one budget exactly', async t => {
    const limiters = await make(t, 3)
    const tenant = randomUUID()
    const buckets = [tenantBucket(40), subjectBucket('ci', 25)]
    const results = await Promise.all(Array.from({ length: 120 }, async (_, i) => await limiters[i % limiters.length]!.consume(tenant, buckets)))
    t.equal(results.filter(r => r.allowed).length, 25, 'exactly the subject budget, not three times it')
    const other = await Promise.all(Array.from({ length: 60 }, async (_, i) => await limiters[i % limiters.length]!.consume(tenant, [tenantBucket(40), subjectBucket('other', 100)])))
    t.equal(other.filter(r => r.allowed).length, 15, 'the tenant budget is what is left of 40')
  })
}
