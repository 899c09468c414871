// Failed authentication costs a budget per client address, so guessing keys and floods of tokens to
// verify are throttled: 429 with Retry-After once an address has spent its burst. Only failures are
// charged, and only the address that failed. A valid credential is never refused because of it,
// from that address either (clients behind one proxy or NAT share an address): the callers
// (http/authenticate.ts, http/admin/plugin.ts) still accept what verifies from what the gateway
// holds, and answer everything else 429 without a charge or a key-set fetch. The address is the
// client's as http/client-address.ts tells it (trusted proxies). The budget is a GCRA bucket in the
// rate limiter (auth/rate-limit.ts): with Redis, one budget for every replica. Once an address is
// refused, this replica knows it until its Retry-After has passed, so a flood costs no limiter
// round trip: a digest, or one signature check with a key already held.
import type { Bucket, RateLimiter } from './rate-limit.js'
import { retryAfterSeconds } from './rate-limit.js'

/** The limiter's "tenant" for these buckets: no tenant can have this name (schema pattern). */
export const AUTH_BUDGET_SCOPE = '!auth'

/** Addresses refused at once (locally) at most; beyond that, the oldest go first. */
const MAX_BLOCKED = 100_000

export interface FailureBudgetSettings {
  /** Failures an address may make at once; 0 turns the budget off. */
  burst: number
  /** Failures per second sustained. */
  ratePerSecond: number
}

export class AuthFailureBudget {
  readonly #limiter: RateLimiter
  readonly #settings: FailureBudgetSettings
  readonly #now: () => number
  /** Address -> when (ms) it may try again; refused without a check until then. */
  readonly #blocked = new Map<string, number>()

  constructor (limiter: RateLimiter, settings: FailureBudgetSettings, now: () => number = Date.now) {
    this.#limiter = limiter
    this.#settings = settings
    this.#now = now
  }

  get enabled (): boolean { return this.#settings.burst > 0 }

  /** Seconds this address must wait before its credentials are checked again; 0: check them. */
  blocked (address: string): number {
    const until = this.#blocked.get(address)
    if (until === undefined) return 0
    const left = until - this.#now()
    if (left > 0) return retryAfterSeconds(left)
    this.#blocked.delete(address)
    return 0
  }

  /**
   * Charges one failed authentication to the address. Returns 0 when the budget took it, or the
   * seconds to wait when it is spent (the address is then refused at once until then). A limiter
   * that cannot be reached charges nothing: the failure is answered as it would be without a budget.
   */
  async charge (address: string): Promise<number> {
    if (!this.enabled) return 0
    const bucket: Bucket = { id: `a:${address}`, ratePerSecond: this.#settings.ratePerSecond, burst: this.#settings.burst }
    let decision
    try {
      decision = await this.#limiter.consume(AUTH_BUDGET_SCOPE, [bucket])
    } catch {
      return 0
    }
    if (decision.allowed) return 0
    if (this.#blocked.size >= MAX_BLOCKED) {
      for (const [key, until] of this.#blocked) if (until <= this.#now() || this.#blocked.size >= MAX_BLOCKED) this.#blocked.delete(key)
    }
    this.#blocked.set(address, this.#now() + decision.retryAfterMs)
    return retryAfterSeconds(decision.retryAfterMs)
  }
}
