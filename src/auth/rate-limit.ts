// Request rate limits of tenants (docs/authentication.md; keys `P:rl:{tenant}:…`).
// One interface, two twins: memory (one process) and Redis (one shared budget for every replica).
// Both run GCRA, the "generic cell rate algorithm": a bucket is one number, its theoretical
// arrival time (TAT); a request is admitted when TAT + interval - burst × interval <= now. Every
// bucket a request touches (the tenant's, the subject's) is checked and charged in one step, all
// or none, so a refused request costs no bucket anything and N replicas never hand out N budgets.
import type { TenantLimitsConfig } from '../config/schema.js'
import { rateKey } from '../state/redis/keys.js'
import { storeCall, type Redis } from '../state/redis/client.js'
import { defineLimitScripts } from '../state/redis/limit-scripts.js'

/** One budget: `ratePerSecond` sustained, `burst` at once. */
export interface Bucket {
  /** `t` for the tenant's bucket, `s:<subject digest>` for a subject's (see bucketsFor). */
  id: string
  ratePerSecond: number
  burst: number
}

export interface RateDecision {
  allowed: boolean
  /** When refused: how long until every bucket would admit the request (ms, > 0). */
  retryAfterMs: number
}

/** The rate limiter: the tenant's buckets of one request, charged together. */
export interface RateLimiter {
  /**
   * Charges `cost` requests (default 1; a JSON-RPC batch costs one per message) to every bucket,
   * or nothing when any of them cannot take them all.
   */
  consume (tenant: string, buckets: readonly Bucket[], cost?: number): Promise<RateDecision>
  close (): Promise<void>
}

const US_PER_SECOND = 1_000_000

/** The buckets of a request of `subjectDigest` in a tenant with these limits (may be none). */
export function bucketsFor (limits: TenantLimitsConfig, subjectDigest: string): Bucket[] {
  const buckets: Bucket[] = []
  const { requestsPerSecond: rate, requestsPerSecondPerSubject: subjectRate } = limits
  if (rate !== undefined) buckets.push({ id: 't', ratePerSecond: rate, burst: limits.burst ?? Math.max(1, Math.ceil(rate)) })
  if (subjectRate !== undefined) {
    buckets.push({ id: `s:${subjectDigest}`, ratePerSecond: subjectRate, burst: limits.burstPerSubject ?? Math.max(1, Math.ceil(subjectRate)) })
  }
  return buckets
}

/** Retry-After (RFC 9110): whole seconds, at least 1, rounded up so an early retry is never invited. */
export function retryAfterSeconds (ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000))
}

function intervalUs (bucket: Bucket): number {
  return US_PER_SECOND / bucket.ratePerSecond
}

/** Memory twin: the same GCRA over a Map, on a monotonic clock. */
export class MemoryRateLimiter implements RateLimiter {
  /** Key -> TAT in µs; a key whose TAT has passed is as good as absent, and swept. */
  readonly #tats = new Map<string, number>()
  readonly #now: () => number
  #lastSweep = 0

  /** `nowUs` is for the tests that need a clock they control. */
  constructor (nowUs: () => number = () => Number(process.hrtime.bigint() / 1000n)) {
    this.#now = nowUs
  }

  async consume (tenant: string, buckets: readonly Bucket[], cost = 1): Promise<RateDecision> {
    const now = this.#now()
    this.#sweep(now)
    let waitUs = 0
    const next: Array<[string, number]> = []
    for (const bucket of buckets) {
      const key = `${tenant}\0${bucket.id}`
      const interval = intervalUs(bucket)
      const tat = Math.max(this.#tats.get(key) ?? 0, now) + interval * cost
      const allowAt = tat - bucket.burst * interval
      if (allowAt > now) waitUs = Math.max(waitUs, allowAt - now)
      next.push([key, tat])
    }
    if (waitUs > 0) return { allowed: false, retryAfterMs: Math.ceil(waitUs / 1000) }
    for (const [key, tat] of next) this.#tats.set(key, tat)
    return { allowed: true, retryAfterMs: 0 }
  }

  /** Drops buckets that are full again (TAT passed), at most once a second. */
  #sweep (now: number): void {
    if (now - this.#lastSweep < US_PER_SECOND) return
    this.#lastSweep = now
    for (const [key, tat] of this.#tats) if (tat <= now) this.#tats.delete(key)
  }

  async close (): Promise<void> {
    this.#tats.clear()
  }
}

/**
 * Redis twin: one script call per request (limit-scripts.ts chargeRate), Redis TIME as the clock,
 * so replicas' clocks never matter. A Redis failure surfaces as GW_ERR_STORE_UNAVAILABLE.
 */
export class RedisRateLimiter implements RateLimiter {
  readonly #redis: Redis
  readonly #prefix: string

  /** The client is shared: close() leaves it to whoever made it. */
  constructor (redis: Redis, prefix: string) {
    this.#redis = redis
    this.#prefix = prefix
    defineLimitScripts(redis)
  }

  async consume (tenant: string, buckets: readonly Bucket[], cost = 1): Promise<RateDecision> {
    if (buckets.length === 0) return { allowed: true, retryAfterMs: 0 }
    const keys = buckets.map(b => rateKey(this.#prefix, tenant, b.id))
    // The script adds one "interval" per call: a cost of n is n intervals, the tolerance unchanged.
    const args = buckets.flatMap(b => [intervalUs(b) * cost, b.burst * intervalUs(b)])
    const waitUs = await storeCall(this.#redis.chargeRate(keys.length, ...keys, ...args))
    return waitUs > 0 ? { allowed: false, retryAfterMs: Math.ceil(waitUs / 1000) } : { allowed: true, retryAfterMs: 0 }
  }

  async close (): Promise<void> {}
}
