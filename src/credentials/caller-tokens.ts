// The newest verified JWT of each caller, in this replica's memory only: a token exchange needs the
// client's token when a backend request is made, and that request may be sent from a connection
// opened by an earlier POST (a session's backend connection outlives the request that opened it).
// The auth hook hands each verified JWT in (for servers with a token-exchange source only); it is
// kept until it expires, never written to Redis, a session record or a log. A backend request made
// without any client request (the backend's GET stream, a resumed stream) on a replica that never
// saw the caller's token finds none here, and uses the exchanged token the vault holds, if any.
import { decodeJwt } from 'jose'

/** Callers kept at most: the oldest go first past it. */
const MAX_CALLERS = 50_000
/** How long a token without `exp` is kept. */
const NO_EXP_KEEP_MS = 300_000

export class CallerTokens {
  readonly #tokens = new Map<string, { token: string, until: number }>()
  readonly #now: () => number

  constructor (now: () => number = Date.now) {
    this.#now = now
  }

  /** The caller's newest verified JWT. */
  remember (tenant: string | null, subjectDigest: string, token: string): void {
    let until = this.#now() + NO_EXP_KEEP_MS
    try {
      const exp = decodeJwt(token).exp
      if (typeof exp === 'number') until = exp * 1000
    } catch {
      return
    }
    const key = keyOf(tenant, subjectDigest)
    // Re-inserted, so the Map's order is the order of last use.
    this.#tokens.delete(key)
    this.#tokens.set(key, { token, until })
    if (this.#tokens.size > MAX_CALLERS) this.#tokens.delete(this.#tokens.keys().next().value as string)
  }

  tokenOf (tenant: string | null, subjectDigest: string): string | undefined {
    const key = keyOf(tenant, subjectDigest)
    const held = this.#tokens.get(key)
    if (held === undefined) return undefined
    if (held.until <= this.#now()) {
      this.#tokens.delete(key)
      return undefined
    }
    return held.token
  }

  clear (): void {
    this.#tokens.clear()
  }
}

const keyOf = (tenant: string | null, subjectDigest: string): string => `${tenant ?? ''}\0${subjectDigest}`
