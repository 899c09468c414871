// A source whose credentials an authorization server grants (token exchange, client credentials):
// the cache in front of it. A credential is used until `refreshBeforeMs` before it expires; one
// grant at a time per entry (callers that ask meanwhile share it); a refused grant is remembered
// for `refusalCacheMs` per entry, so a caller the server refuses cannot make the gateway hammer it;
// granted tokens rest in the vault, where every replica finds them. What a grant asks is the
// strategy's business (token-exchange.ts, client-credentials.ts).
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import { audit } from '../telemetry/audit.js'
import type { GatewayMetrics } from '../telemetry/metrics.js'
import { isGatewayError, type GatewayError } from '../core/errors.js'
import { Issuer, type Grant } from './issuer.js'
import { entryName } from './vault.js'
import { credentialOf, headerValueOf } from './credential.js'
import type { Credential, CredentialCaller, CredentialOutcome, CredentialSource, CredentialSourceKind, CredentialTarget, CredentialsConfig, Vault, VaultKey } from './types.js'

/** What every source is made with. */
export interface SourceDeps {
  vault: Vault
  log: Logger
  metrics: Pick<GatewayMetrics, 'credentialLookup'>
  now?: () => number
}

/** What one kind of grant decides: where its token is filed and what it asks. */
export interface GrantStrategy {
  readonly kind: CredentialSourceKind
  readonly grantType: string
  /** The vault entry for this caller (per subject, or per tenant). */
  keyOf (who: CredentialCaller, target: CredentialTarget): VaultKey
  /** The grant's form parameters; throws a typed error when the caller brings nothing to grant on. */
  parameters (who: CredentialCaller, target: CredentialTarget): Record<string, string>
  /** The latest a granted token may be used (token exchange: not past the client's own token). */
  capExpiry? (who: CredentialCaller, expiresAt: number): number
}

interface Hot { credential: Credential, usableUntil: number }
interface Refusal { err: GatewayError, until: number }

/** Hot entries kept before expired ones are swept. */
const SWEEP_AT = 10_000

export class GrantingSource implements CredentialSource {
  readonly kind: CredentialSourceKind
  readonly #strategy: GrantStrategy
  readonly #deps: SourceDeps
  readonly #issuer: Issuer
  readonly #config: CredentialsConfig
  readonly #now: () => number
  readonly #hot = new Map<string, Hot>()
  readonly #inFlight = new Map<string, Promise<Credential>>()
  readonly #refused = new Map<string, Refusal>()

  constructor (server: string, config: CredentialsConfig, strategy: GrantStrategy, deps: SourceDeps) {
    this.kind = strategy.kind
    this.#strategy = strategy
    this.#deps = deps
    this.#config = config
    this.#issuer = new Issuer(server, config)
    this.#now = deps.now ?? Date.now
  }

  async credentialFor (who: CredentialCaller, target: CredentialTarget, signal?: AbortSignal): Promise<Credential> {
    const key = this.#strategy.keyOf(who, target)
    const name = entryName(key)
    const now = this.#now()
    const hot = this.#hot.get(name)
    if (hot !== undefined && hot.usableUntil > now) {
      this.#count(target, 'cached')
      return hot.credential
    }
    const refusal = this.#refused.get(name)
    if (refusal !== undefined) {
      if (refusal.until > now) {
        this.#count(target, 'refused_cached')
        throw refusal.err
      }
      this.#refused.delete(name)
    }
    let pending = this.#inFlight.get(name)
    if (pending === undefined) {
      // Not tied to this caller's signal: others may share it; the issuer's own deadline ends it.
      pending = this.#obtain(who, target, key, name).finally(() => { this.#inFlight.delete(name) })
      this.#inFlight.set(name, pending)
    }
    return await abortable(pending, signal)
  }

  async invalidate (who: CredentialCaller, target: CredentialTarget, rejected: Credential): Promise<void> {
    const key = this.#strategy.keyOf(who, target)
    const name = entryName(key)
    // Only the credential the backend refused: a newer one another request already got stays.
    if (this.#hot.get(name)?.credential.value === rejected.value) this.#hot.delete(name)
    try {
      const stored = await this.#deps.vault.get(key)
      if (stored !== undefined && this.#valueOf(stored.accessToken) === rejected.value) await this.#deps.vault.delete(key)
    } catch (err) {
      this.#deps.log.warn({ err: errorSummary(err), server: target.server }, 'credential vault unavailable: a rejected credential may be tried again')
    }
  }

  close (): void {
    this.#hot.clear()
    this.#refused.clear()
  }

  async #obtain (who: CredentialCaller, target: CredentialTarget, key: VaultKey, name: string): Promise<Credential> {
    const stored = await this.#fromVault(key, target)
    if (stored !== undefined && this.#usableUntil(stored.expiresAt) > this.#now()) {
      const credential = this.#credential(stored.accessToken, stored.expiresAt)
      this.#remember(name, credential)
      this.#count(target, 'cached')
      return credential
    }
    let parameters: Record<string, string>
    try {
      parameters = this.#strategy.parameters(who, target)
    } catch (err) {
      this.#fail(who, target, 'missing', err)
      throw err
    }
    const started = performance.now()
    let grant: Grant
    try {
      grant = await this.#issuer.grant(this.#strategy.grantType, parameters)
    } catch (err) {
      const seconds = (performance.now() - started) / 1000
      if (isGatewayError(err) && err.code === 'GW_ERR_CREDENTIAL_REFUSED') {
        if (this.#config.refusalCacheMs > 0) this.#refused.set(name, { err, until: this.#now() + this.#config.refusalCacheMs })
        this.#fail(who, target, 'refused', err, seconds)
      } else {
        this.#fail(who, target, 'unavailable', err, seconds)
      }
      throw err
    }
    const now = this.#now()
    let expiresAt = grant.expiresAt ?? now + this.#config.defaultLifetimeMs
    if (this.#strategy.capExpiry !== undefined) expiresAt = this.#strategy.capExpiry(who, expiresAt)
    const credential = this.#credential(grant.accessToken, expiresAt)
    this.#remember(name, credential)
    try {
      await this.#deps.vault.put(key, { accessToken: grant.accessToken, expiresAt, ...(grant.scope === undefined ? {} : { scope: grant.scope }) })
    } catch (err) {
      // The token still serves this replica; others will ask for their own.
      this.#deps.log.warn({ err: errorSummary(err), server: target.server }, 'credential vault unavailable: a granted token was not stored')
    }
    this.#deps.metrics.credentialLookup(target.server, this.kind, 'issued', (performance.now() - started) / 1000)
    audit(this.#deps.log, 'credential.issued', { tenant: who.tenant, subject: key.subjectDigest ?? undefined, server: target.server, source: this.kind, expiresAt })
    return credential
  }

  async #fromVault (key: VaultKey, target: CredentialTarget): Promise<{ accessToken: string, expiresAt: number | null } | undefined> {
    try {
      return await this.#deps.vault.get(key)
    } catch (err) {
      this.#deps.log.warn({ err: errorSummary(err), server: target.server }, 'credential vault unavailable: asking the authorization server')
      return undefined
    }
  }

  #usableUntil (expiresAt: number | null): number {
    return expiresAt === null ? Infinity : expiresAt - this.#config.refreshBeforeMs
  }

  #remember (name: string, credential: Credential): void {
    if (this.#hot.size >= SWEEP_AT) {
      const now = this.#now()
      for (const [n, h] of this.#hot) if (h.usableUntil <= now) this.#hot.delete(n)
    }
    this.#hot.set(name, { credential, usableUntil: this.#usableUntil(credential.expiresAt) })
  }

  #valueOf (token: string): string {
    return headerValueOf(this.#config, token)
  }

  #credential (token: string, expiresAt: number | null): Credential {
    return credentialOf(this.#config, token, expiresAt)
  }

  #count (target: CredentialTarget, outcome: CredentialOutcome): void {
    this.#deps.metrics.credentialLookup(target.server, this.kind, outcome)
  }

  #fail (who: CredentialCaller, target: CredentialTarget, outcome: CredentialOutcome, err: unknown, seconds?: number): void {
    this.#deps.metrics.credentialLookup(target.server, this.kind, outcome, seconds)
    const data = isGatewayError(err) ? err.data : undefined
    audit(this.#deps.log, 'credential.failed', {
      tenant: who.tenant,
      subject: this.#strategy.keyOf(who, target).subjectDigest ?? undefined,
      server: target.server,
      source: this.kind,
      outcome,
      code: isGatewayError(err) ? err.code : 'GW_ERR_INTERNAL',
      ...(typeof data?.oauthError === 'string' ? { oauthError: data.oauthError } : {})
    })
  }
}

/** An error as a log may carry it: its code and message, never a cause that could hold a request. */
function errorSummary (err: unknown): { code?: string, message: string } {
  const e = err as { code?: unknown, message?: unknown } | undefined
  return { ...(typeof e?.code === 'string' ? { code: e.code } : {}), message: typeof e?.message === 'string' ? e.message : String(err) }
}

/** `pending`, or this caller's abort (the shared work goes on for the others). */
async function abortable<T> (pending: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (signal === undefined) return await pending
  signal.throwIfAborted()
  let onAbort: (() => void) | undefined
  try {
    return await Promise.race([pending, new Promise<never>((_resolve, reject) => {
      onAbort = () => { reject(signal.reason) }
      signal.addEventListener('abort', onAbort, { once: true })
    })])
  } finally {
    if (onAbort !== undefined) signal.removeEventListener('abort', onAbort)
  }
}
