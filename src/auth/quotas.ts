// Open-session quotas of tenants and subjects (docs/authentication.md; keys
// `P:q:{tenant}:…`).
// One interface, two twins (memory, Redis), and one rule on top of both (QuotaGate):
//
// - A slot is taken after the session record is written and before the backend starts, so every
//   member of a quota set is a session whose record existed.
// - Slots are freed lazily: a set that looks full is checked against the session store, and the
//   sessions that are gone (DELETE, end, idle expiry, a failed start) leave it; then the take is
//   tried again. The store is the truth; nothing has to remember to release a slot, and a replica
//   that dies mid-session leaks nothing. The take itself is atomic (one script), so replicas
//   racing for the last slot cannot both win.
import type { TenantLimitsConfig } from '../config/schema.js'
import { GW_ERR_SESSION_QUOTA, withRetryAfter } from '../core/errors.js'
import { quotaKey } from '../state/redis/keys.js'
import { storeCall, type Redis } from '../state/redis/client.js'
import { defineLimitScripts } from '../state/redis/limit-scripts.js'

export interface SlotRequest {
  tenant: string
  subject: string
  sid: string
  /** Sessions the tenant may hold; undefined: no limit. */
  perTenant?: number | undefined
  /** Sessions one subject may hold; undefined: no limit. */
  perSubject?: number | undefined
}

export type TakeResult =
  | { taken: true }
  /** The set that is full, and its members (for the liveness check). */
  | { taken: false, scope: 'tenant' | 'subject', members: string[] }

/** The quota sets of one backing store. */
export interface SessionQuotas {
  /** Adds the session to its tenant's and subject's sets unless one is full (atomic). */
  take (request: SlotRequest): Promise<TakeResult>
  /** Removes sessions from a tenant's and a subject's sets. */
  drop (tenant: string, subject: string, sids: readonly string[]): Promise<void>
  close (): Promise<void>
}

/** Memory twin: sets in a Map; only limited scopes are tracked. */
export class MemorySessionQuotas implements SessionQuotas {
  readonly #sets = new Map<string, Set<string>>()

  async take (request: SlotRequest): Promise<TakeResult> {
    const scopes = [
      ['tenant', `${request.tenant}\0t`, request.perTenant],
      ['subject', `${request.tenant}\0s:${request.subject}`, request.perSubject]
    ] as const
    for (const [scope, key, limit] of scopes) {
      const set = this.#sets.get(key)
      if (limit !== undefined && set !== undefined && !set.has(request.sid) && set.size >= limit) {
        return { taken: false, scope, members: [...set] }
      }
    }
    for (const [, key, limit] of scopes) {
      if (limit === undefined) continue
      let set = this.#sets.get(key)
      if (set === undefined) this.#sets.set(key, set = new Set())
      set.add(request.sid)
    }
    return { taken: true }
  }

  async drop (tenant: string, subject: string, sids: readonly string[]): Promise<void> {
    for (const key of [`${tenant}\0t`, `${tenant}\0s:${subject}`]) {
      const set = this.#sets.get(key)
      if (set === undefined) continue
      for (const sid of sids) set.delete(sid)
      if (set.size === 0) this.#sets.delete(key)
    }
  }

  async close (): Promise<void> {
    this.#sets.clear()
  }
}

/**
 * Redis twin: two sorted sets per request under the tenant's hash tag (`P:q:{tenant}:t` and
 * `P:q:{tenant}:s:<digest>`), session ids scored by when they joined. Their TTL is renewed on
 * every take; it only bounds how long an idle tenant's sets linger.
 */
export class RedisSessionQuotas implements SessionQuotas {
  readonly #redis: Redis
  readonly #prefix: string
  readonly #ttlMs: number

  /** The client is shared: close() leaves it to whoever made it. */
  constructor (redis: Redis, prefix: string, ttlMs: number) {
    this.#redis = redis
    this.#prefix = prefix
    this.#ttlMs = ttlMs
    defineLimitScripts(redis)
  }

  #keys (tenant: string, subject: string): [string, string] {
    return [quotaKey(this.#prefix, tenant, 't'), quotaKey(this.#prefix, tenant, `s:${subject}`)]
  }

  async take (request: SlotRequest): Promise<TakeResult> {
    const [tenantSet, subjectSet] = this.#keys(request.tenant, request.subject)
    const reply = await storeCall(this.#redis.takeSessionSlot(
      tenantSet, subjectSet, request.sid, request.perTenant ?? 0, request.perSubject ?? 0, this.#ttlMs))
    const [status, ...members] = reply
    if (status === 1) return { taken: true }
    return { taken: false, scope: status === 2 ? 'tenant' : 'subject', members: members.map(String) }
  }

  async drop (tenant: string, subject: string, sids: readonly string[]): Promise<void> {
    if (sids.length === 0) return
    const [tenantSet, subjectSet] = this.#keys(tenant, subject)
    await storeCall(this.#redis.dropSessionSlots(tenantSet, subjectSet, ...sids))
  }

  async close (): Promise<void> {}
}

/** The limits that apply to sessions of a tenant: none (undefined) when it sets neither. */
export function sessionLimitsOf (limits: TenantLimitsConfig | undefined): { perTenant?: number, perSubject?: number } | undefined {
  if (limits === undefined || (limits.sessions === undefined && limits.sessionsPerSubject === undefined)) return undefined
  return {
    ...(limits.sessions !== undefined ? { perTenant: limits.sessions } : {}),
    ...(limits.sessionsPerSubject !== undefined ? { perSubject: limits.sessionsPerSubject } : {})
  }
}

/** A tenant's limits (TenantDirectory.limits); undefined for none. */
export type LimitsLookup = (tenant: string) => TenantLimitsConfig | undefined

/** Whether a session still exists (the session store's word; an error counts as alive). */
export type IsLive = (sid: string) => Promise<boolean>

/** How many times a full set is pruned and the take retried before the answer is 429. */
const ATTEMPTS = 3
/**
 * Retry-After of a quota refusal. A slot frees when one of the sessions ends (a DELETE, or its idle
 * expiry), which no one can foretell: this only spaces the retries, as every 429 names a wait.
 */
const QUOTA_RETRY_AFTER_S = 30

/** The quota rule over a SessionQuotas twin: what session creation calls. */
export class QuotaGate {
  readonly #limitsOf: LimitsLookup
  readonly #quotas: SessionQuotas
  readonly #isLive: IsLive

  /** `limitsOf` is read at every admission, so a replaced tenant table (reload) applies at once. */
  constructor (limitsOf: LimitsLookup, quotas: SessionQuotas, isLive: IsLive) {
    this.#limitsOf = limitsOf
    this.#quotas = quotas
    this.#isLive = isLive
  }

  /**
   * Takes a slot for a new session, or throws GW_ERR_SESSION_QUOTA (429). Anonymous sessions and
   * tenants without session limits pass untouched.
   */
  async admit (sid: string, tenant: string | null | undefined, subject: string | undefined): Promise<void> {
    if (tenant === null || tenant === undefined || subject === undefined) return
    const limits = sessionLimitsOf(this.#limitsOf(tenant))
    if (limits === undefined) return
    const request: SlotRequest = { tenant, subject, sid, ...limits }
    for (let attempt = 1; ; attempt++) {
      const result = await this.#quotas.take(request)
      if (result.taken) return
      const dead = await this.#deadOf(result.members.filter(m => m !== sid))
      if (dead.length === 0 || attempt === ATTEMPTS) {
        const limit = result.scope === 'tenant' ? limits.perTenant : limits.perSubject
        throw withRetryAfter(new GW_ERR_SESSION_QUOTA(result.scope === 'tenant' ? `tenant '${tenant}'` : 'subject', limit ?? 0), QUOTA_RETRY_AFTER_S)
      }
      await this.#quotas.drop(tenant, subject, dead)
    }
  }

  async #deadOf (sids: string[]): Promise<string[]> {
    const live = await Promise.all(sids.map(async sid => await this.#isLive(sid).catch(() => true)))
    return sids.filter((_, i) => live[i] === false)
  }
}
