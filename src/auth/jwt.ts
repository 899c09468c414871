// JWT access tokens (OAuth 2.1 resource server, A-RS-3, A-RS-4, A-RS-7): signed by a key
// from the issuer's JWKS, with the issuer, an audience naming this endpoint (RFC 8707: by default
// its resource URL), an allowed algorithm (never `none`), a valid exp/nbf and the tenant's extra
// claims. Keys rotate: a token naming an unknown `kid` refetches the key set, at most once per
// `jwksCooldownMs` (jose's cooldown). A key set that cannot be fetched is 503 with Retry-After, not
// 401: the token may well be good. While it cannot be fetched, the keys already held still verify
// tokens, and a token needing a fetch is refused at once until the backoff allows the next attempt:
// no request waits out the fetch deadline behind a failed one. `typ` is checked where the issuer's
// config names one (RFC 9068: `at+jwt`).
import {
  createLocalJWKSet, createRemoteJWKSet, decodeJwt, decodeProtectedHeader, errors, jwtVerify,
  type JSONWebKeySet, type JWTPayload, type JWTVerifyGetKey
} from 'jose'
import { GW_ERR_AUTH_UNAVAILABLE, withRetryAfter } from '../core/errors.js'
import { AuthRefusal, invalidToken, type Endpoint } from './authenticate.js'
import type { TenantDirectory, TenantIssuer } from './tenants.js'

/** Deadline of one key-set fetch. */
export const JWKS_TIMEOUT_MS = 5000
/** After a failed fetch, no other is tried for this long, doubling per failure up to the max. */
export const JWKS_BACKOFF_BASE_MS = 1000
export const JWKS_BACKOFF_MAX_MS = 30_000
/** Clock skew tolerated on exp and nbf. */
export const CLOCK_TOLERANCE_S = 5

/** The key set could not be fetched (network, status, body): not the token's fault. */
class KeysUnavailable extends Error {
  constructor (readonly retryAfterS: number, options?: { cause?: unknown }) {
    super('key set unavailable', options)
  }
}

/** A token's own problem with a key set that was read: no fetch could change the answer. */
const isTokenProblem = (err: unknown): boolean =>
  err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys || err instanceof errors.JOSENotSupported

/**
 * One issuer's remote key set, with what jose leaves to its caller when fetches fail: the keys
 * already held keep verifying (also once jose's cache age has passed), and after a failed fetch
 * the next is not tried before a backoff (1 s, doubling to 30 s) runs out; meanwhile a token that
 * needs a fetch (no keys held yet, or an unknown kid) is refused at once.
 */
export class IssuerKeys {
  readonly #remote: ReturnType<typeof createRemoteJWKSet>
  readonly #now: () => number
  #held: { set: JSONWebKeySet, verify: JWTVerifyGetKey } | undefined
  #retryAt = 0
  #backoffMs = 0

  constructor (uri: string, cooldownMs: number, now: () => number = Date.now) {
    this.#remote = createRemoteJWKSet(new URL(uri), { cooldownDuration: cooldownMs, timeoutDuration: JWKS_TIMEOUT_MS })
    this.#now = now
  }

  readonly getKey: JWTVerifyGetKey = async (header, token) => {
    const now = this.#now()
    if (now < this.#retryAt) return await this.#fromHeld(header, token, undefined)
    try {
      const key = await this.#remote(header, token)
      this.#backoffMs = 0
      return key
    } catch (err) {
      if (isTokenProblem(err)) throw err
      this.#backoffMs = Math.min(JWKS_BACKOFF_MAX_MS, this.#backoffMs === 0 ? JWKS_BACKOFF_BASE_MS : this.#backoffMs * 2)
      this.#retryAt = this.#now() + this.#backoffMs
      return await this.#fromHeld(header, token, err)
    }
  }

  /**
   * Verifies with the keys already held and never fetches (an address whose failed-authentication
   * budget is spent: a token signed by a known key still passes, one needing a fetch does not).
   */
  readonly getHeldKey: JWTVerifyGetKey = async (header, token) => await this.#fromHeld(header, token, undefined)

  /** Verifies with the keys held from the last good fetch; none fits: KeysUnavailable. */
  async #fromHeld (...[header, token, cause]: [...Parameters<JWTVerifyGetKey>, unknown]): Promise<Awaited<ReturnType<JWTVerifyGetKey>>> {
    const retryAfterS = Math.max(1, Math.ceil((this.#retryAt - this.#now()) / 1000))
    const set = this.#remote.jwks()
    if (set === undefined) throw new KeysUnavailable(retryAfterS, { cause })
    // jose copies the set on every jwks() call: the local verifier is rebuilt only when it changed.
    if (this.#held === undefined || JSON.stringify(this.#held.set) !== JSON.stringify(set)) this.#held = { set, verify: createLocalJWKSet(set) }
    try {
      return await this.#held.verify(header, token)
    } catch (err) {
      if (err instanceof errors.JWKSNoMatchingKey) throw new KeysUnavailable(retryAfterS, { cause })
      throw err
    }
  }
}

/** A URL compared the way RFC 3986 normalises it: scheme and host in lower case, no trailing slash. */
export function canonicalUrl (value: string): string {
  try {
    const url = new URL(value)
    if (url.protocol !== 'http:' && url.protocol !== 'https:') return value
    url.hash = ''
    return url.href.replace(/\/+$/, '')
  } catch {
    return value
  }
}

function reasonOf (err: unknown): string {
  if (err instanceof errors.JWTExpired) return 'token expired'
  if (err instanceof errors.JWTClaimValidationFailed) return `claim ${err.claim} ${err.reason === 'missing' ? 'missing' : 'not accepted'}`
  if (err instanceof errors.JOSEAlgNotAllowed) return 'signing algorithm not accepted'
  if (err instanceof errors.JWKSNoMatchingKey) return 'no key of the issuer matches the token'
  if (err instanceof errors.JWSSignatureVerificationFailed) return 'signature does not verify'
  return 'malformed token'
}

export class JwtVerifier {
  readonly #directory: TenantDirectory
  /**
   * One remote key set per JWKS URL, shared by every tenant naming it (so one fetch serves them
   * all) and kept across reloads; its cooldown is that of the first config that used it.
   */
  readonly #keySets = new Map<string, IssuerKeys>()

  constructor (directory: TenantDirectory) {
    this.#directory = directory
  }

  /**
   * The tenant and subject a token authenticates, or an AuthRefusal (401, or 503 with Retry-After).
   * `heldKeysOnly`: no key set is fetched; a token that would need one is refused.
   */
  readonly check = async (token: string, endpoint: Endpoint, heldKeysOnly = false): Promise<{ tenant: string, subject: string }> => {
    const refuse = (reason: string): AuthRefusal => new AuthRefusal(invalidToken(this.#directory, endpoint, reason), `jwt: ${reason}`, 'jwt')
    let iss: unknown
    try {
      // Unverified: only to pick the issuer whose keys and rules then verify everything.
      if (decodeProtectedHeader(token).alg === 'none') throw refuse('unsigned token')
      iss = decodeJwt(token).iss
    } catch (err) {
      if (err instanceof AuthRefusal) throw err
      throw refuse('malformed token')
    }
    const candidates = typeof iss === 'string' ? this.#directory.issuer(iss) : []
    if (candidates.length === 0) throw refuse('unknown issuer')
    // Several tenants may trust one issuer, told apart by their `claims`: the first that accepts
    // wins. The reason told is the first that is not merely another tenant's claims.
    let reason: string | undefined
    let mismatch: string | undefined
    for (const candidate of candidates) {
      const result = await this.#accept(token, candidate, endpoint, heldKeysOnly)
      if ('tenant' in result) return result
      if ('mismatch' in result) mismatch ??= result.mismatch
      else reason ??= result.reason
    }
    throw refuse(reason ?? mismatch ?? 'token not accepted')
  }

  /** The principal's tenant and subject, or why this tenant's issuer config refuses the token. */
  async #accept (token: string, { tenant, jwt }: TenantIssuer, endpoint: Endpoint, heldKeysOnly: boolean): Promise<{ tenant: string, subject: string } | { reason: string } | { mismatch: string }> {
    let payload: JWTPayload
    try {
      const keys = this.#keySet(jwt.jwksUri, jwt.jwksCooldownMs)
      ;({ payload } = await jwtVerify(token, heldKeysOnly ? keys.getHeldKey : keys.getKey, {
        issuer: jwt.issuer,
        algorithms: jwt.algorithms,
        requiredClaims: ['exp'],
        clockTolerance: CLOCK_TOLERANCE_S,
        // Absent: no check (several providers issue `JWT`; the audience keeps ID tokens out).
        ...(jwt.typ !== undefined ? { typ: jwt.typ } : {})
      }))
    } catch (err) {
      if (err instanceof KeysUnavailable) {
        const unavailable = withRetryAfter(new GW_ERR_AUTH_UNAVAILABLE('the token issuer\'s keys cannot be fetched', { cause: err.cause }), err.retryAfterS)
        throw new AuthRefusal(unavailable, 'jwt: key set unavailable', 'jwt')
      }
      return { reason: reasonOf(err) }
    }
    const expected = (jwt.audience.length > 0 ? jwt.audience : [this.#directory.resourceUrl(endpoint.kind, endpoint.server)]).map(canonicalUrl)
    const audiences = typeof payload.aud === 'string' ? [payload.aud] : Array.isArray(payload.aud) ? payload.aud : []
    if (!audiences.some(aud => expected.includes(canonicalUrl(aud)))) return { reason: 'audience is not this endpoint' }
    for (const [claim, value] of Object.entries(jwt.claims)) {
      if (payload[claim] !== value) return { mismatch: `claim ${claim} not accepted` }
    }
    const subject = payload[jwt.subjectClaim]
    if (typeof subject !== 'string' || subject === '') return { reason: `claim ${jwt.subjectClaim} missing` }
    return { tenant, subject: `jwt:${jwt.issuer}\0${subject}` }
  }

  #keySet (uri: string, cooldownMs: number): IssuerKeys {
    let keys = this.#keySets.get(uri)
    if (keys === undefined) {
      keys = new IssuerKeys(uri, cooldownMs)
      this.#keySets.set(uri, keys)
    }
    return keys
  }
}
