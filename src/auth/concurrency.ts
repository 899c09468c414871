// Requests in flight at once per tenant and per subject on this replica, so one subject cannot
// hold a whole pool of children, nor a tenant every child of a dedicated server.
// In-process counters: a slot is taken when a POST carrying requests is accepted and given back
// when its response ends (answered, failed or abandoned), so nothing can leak across a crash and
// nothing costs a Redis round trip. The bound is per replica; behind a balancer a tenant's
// overall bound is the replicas' sum.
import { GW_ERR_TOO_MANY_CONCURRENT, withRetryAfter } from '../core/errors.js'
import type { TenantLimitsConfig } from '../config/schema.js'

/** Retry-After of a request refused for concurrency: in-flight requests end within seconds as a rule. */
export const CONCURRENCY_RETRY_AFTER_S = 1

export class ConcurrencyLimiter {
  readonly #inFlight = new Map<string, number>()

  /**
   * Takes `count` slots for the tenant and its subject, or throws GW_ERR_TOO_MANY_CONCURRENT (429).
   * Returns the release (idempotent); null when the tenant sets no such limit.
   */
  acquire (tenant: string, subject: string, limits: TenantLimitsConfig | undefined, count: number): (() => void) | null {
    const perTenant = limits?.concurrentRequests
    const perSubject = limits?.concurrentRequestsPerSubject
    if (perTenant === undefined && perSubject === undefined) return null
    const keys: string[] = []
    if (perTenant !== undefined) {
      if (this.#count(tenant) + count > perTenant) throw withRetryAfter(new GW_ERR_TOO_MANY_CONCURRENT('tenant', perTenant), CONCURRENCY_RETRY_AFTER_S)
      keys.push(tenant)
    }
    if (perSubject !== undefined) {
      const key = `${tenant}\0${subject}`
      if (this.#count(key) + count > perSubject) throw withRetryAfter(new GW_ERR_TOO_MANY_CONCURRENT('subject', perSubject), CONCURRENCY_RETRY_AFTER_S)
      keys.push(key)
    }
    for (const key of keys) this.#inFlight.set(key, this.#count(key) + count)
    let held = true
    return () => {
      if (!held) return
      held = false
      for (const key of keys) {
        const left = this.#count(key) - count
        if (left > 0) this.#inFlight.set(key, left)
        else this.#inFlight.delete(key)
      }
    }
  }

  /** In flight now for a tenant (or `tenant\0subject`). */
  inFlight (key: string): number {
    return this.#count(key)
  }

  #count (key: string): number {
    return this.#inFlight.get(key) ?? 0
  }
}
