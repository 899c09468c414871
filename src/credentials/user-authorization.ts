// The user-authorization source: each user's own consent to the gateway at the backend's
// authorization server (authorization code with PKCE), docs/credentials.md. A user with no token
// yet gets GW_ERR_CREDENTIAL_CONSENT_REQUIRED naming a gateway consent link; the link (any replica)
// starts the authorization request, the callback (any replica) files the tokens in the vault under
// (tenant, server, subject digest). Access tokens are renewed with the refresh token before they
// expire, one refresh per entry across replicas (the consent store's lock), the rotated refresh
// token kept; a refused refresh (invalid_grant) forgets the entry and asks for consent again.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import { GW_ERR_CREDENTIAL_CONSENT_REQUIRED, isGatewayError, withData, type GatewayError } from '../core/errors.js'
import { audit } from '../telemetry/audit.js'
import { AuthorizationClient, redirectUriOf } from './authorization-client.js'
import { issuerUnavailable } from './issuer.js'
import type { ConsentLink, ConsentStore, PendingAuthorization } from './consent-store.js'
import type { SourceDeps } from './granting-source.js'
import type { Grant } from './issuer.js'
import type { CredentialSources, CredentialsLive, SourceFactory } from './sources.js'
import type { Credential, CredentialCaller, CredentialSource, CredentialTarget, CredentialsConfig, VaultEntry, VaultKey } from './types.js'
import { entryName } from './vault.js'
import { credentialOf, headerValueOf } from './credential.js'

/** How long a consent link and an authorization request stay usable. */
export const CONSENT_TTL_MS = 600_000
/** Where consent links are served, under the gateway's public base. */
export const CONSENT_PATH = '/oauth/consent/'
/** A link is handed out again only while it has at least this long to live. */
const LINK_REUSE_MARGIN_MS = 120_000
/** Links remembered at most (one per user waiting for consent on this replica). */
const MAX_LINKS = 10_000
/** A refresh another replica holds is awaited this often, up to the config's timeoutMs. */
const LOCK_POLL_MS = 50

export interface ConsentDeps { consents: ConsentStore }

/** The factory CredentialSources.register('user-authorization', …) takes. */
export function userAuthorizationFactory (deps: ConsentDeps): SourceFactory {
  return ({ tenant, server, config, deps: sourceDeps }) => new UserAuthorizationSource(tenant, server, config, sourceDeps, deps.consents)
}

/**
 * The user-authorization source of (tenant, server) under the live config, or undefined when that
 * pair has another source now: what the consent routes and the admin API look sources up with.
 */
export function userAuthorizationOf (sources: Pick<CredentialSources, 'sourceFor'>, live: CredentialsLive): (tenant: string | null, server: string) => UserAuthorizationSource | undefined {
  return (tenant, server) => {
    const bound = sources.sourceFor(live, tenant, server)
    return bound?.source instanceof UserAuthorizationSource ? bound.source : undefined
  }
}

const opaque = (): string => randomBytes(24).toString('base64url')

export class UserAuthorizationSource implements CredentialSource {
  readonly kind = 'user-authorization' as const
  readonly server: string
  readonly tenant: string | null
  readonly #config: CredentialsConfig
  readonly #deps: SourceDeps
  readonly #consents: ConsentStore
  readonly #client: AuthorizationClient
  readonly #now: () => number
  readonly #hot = new Map<string, { credential: Credential, usableUntil: number }>()
  readonly #inFlight = new Map<string, Promise<Credential>>()
  /** The consent link last handed to each user, by entry name. */
  readonly #links = new Map<string, { id: string, expiresAt: number }>()

  constructor (tenant: string | null, server: string, config: CredentialsConfig, deps: SourceDeps, consents: ConsentStore) {
    this.tenant = tenant
    this.server = server
    this.#config = config
    this.#deps = deps
    this.#consents = consents
    this.#client = new AuthorizationClient(server, config)
    this.#now = deps.now ?? Date.now
  }

  keyOf (tenant: string | null, subjectDigest: string): VaultKey {
    return { tenant, server: this.server, subjectDigest, ...(this.#config.resource === undefined ? {} : { audience: this.#config.resource }) }
  }

  async credentialFor (who: CredentialCaller, target: CredentialTarget, signal?: AbortSignal): Promise<Credential> {
    const key = this.keyOf(who.tenant, who.subjectDigest)
    const name = entryName(key)
    const hot = this.#hot.get(name)
    if (hot !== undefined && hot.usableUntil > this.#now()) {
      this.#deps.metrics.credentialLookup(target.server, this.kind, 'cached')
      return hot.credential
    }
    let pending = this.#inFlight.get(name)
    if (pending === undefined) {
      pending = this.#obtain(key, name).finally(() => { this.#inFlight.delete(name) })
      this.#inFlight.set(name, pending)
    }
    signal?.throwIfAborted()
    return await pending
  }

  async invalidate (who: CredentialCaller, _target: CredentialTarget, rejected: Credential): Promise<void> {
    const key = this.keyOf(who.tenant, who.subjectDigest)
    const name = entryName(key)
    if (this.#hot.get(name)?.credential.value === rejected.value) this.#hot.delete(name)
    const stored = await this.#deps.vault.get(key)
    if (stored === undefined || headerValueOf(this.#config, stored.accessToken) !== rejected.value) return
    // The refresh token may still be good: the entry is marked expired, so the next use refreshes.
    if (stored.refreshToken !== undefined) await this.#deps.vault.put(key, { ...stored, expiresAt: 0 })
    else await this.#deps.vault.delete(key)
  }

  close (): void {
    this.#hot.clear()
    this.#links.clear()
  }

  /** A consent link opened: a new authorization request (state, PKCE verifier, the browser's nonce digest). */
  async begin (link: ConsentLink, browserDigest: string): Promise<URL> {
    const state = opaque()
    const verifier = opaque() + opaque()
    const url = await this.#client.authorizationUrl(state, verifier)
    const pending: PendingAuthorization = { ...link, verifier, browserDigest, redirectUri: redirectUriOf(this.#config), expiresAt: Math.min(link.expiresAt + CONSENT_TTL_MS, this.#now() + CONSENT_TTL_MS) }
    await this.#consents.put(`s.${state}`, { kind: 'state', pending }, pending.expiresAt - this.#now())
    return url
  }

  /** The callback of an authorization request: its code exchanged, the tokens filed for the user who asked. */
  async complete (pending: PendingAuthorization, state: string, callbackUrl: URL): Promise<void> {
    const who = { tenant: pending.tenant, subject: pending.subjectDigest, server: this.server, source: this.kind }
    let grant: Grant
    try {
      grant = await this.#client.exchange(callbackUrl, state, pending.verifier)
    } catch (err) {
      audit(this.#deps.log, 'credential.consent', { ...who, outcome: 'refused', code: codeOf(err), ...oauthErrorOf(err) })
      throw err
    }
    const key = this.keyOf(pending.tenant, pending.subjectDigest)
    await this.#store(key, grant)
    this.#hot.delete(entryName(key))
    this.#links.delete(entryName(key))
    audit(this.#deps.log, 'credential.consent', { ...who, outcome: 'granted', expiresAt: grant.expiresAt, refreshable: grant.refreshToken !== undefined, ...(grant.scope === undefined ? {} : { scope: grant.scope }) })
  }

  /** Revocation at the authorization server (when it offers it) and removal from the vault. */
  async revoke (key: VaultKey): Promise<{ found: boolean, revokedAtServer: boolean }> {
    const stored = await this.#deps.vault.get(key)
    let revokedAtServer = false
    if (stored !== undefined) {
      const tokens: Array<{ token: string, hint: 'access_token' | 'refresh_token' }> = [{ token: stored.accessToken, hint: 'access_token' }]
      if (stored.refreshToken !== undefined) tokens.push({ token: stored.refreshToken, hint: 'refresh_token' })
      try {
        revokedAtServer = await this.#client.revoke(tokens)
      } catch (err) {
        // The gateway forgets the tokens all the same; the listing no longer shows them.
        this.#deps.log.warn({ server: this.server, code: codeOf(err) }, 'revocation at the authorization server failed')
      }
    }
    await this.#deps.vault.delete(key)
    this.#hot.delete(entryName(key))
    audit(this.#deps.log, 'credential.revoked', { tenant: key.tenant, subject: key.subjectDigest ?? undefined, server: this.server, source: this.kind, found: stored !== undefined, revokedAtServer })
    return { found: stored !== undefined, revokedAtServer }
  }

  async #obtain (key: VaultKey, name: string): Promise<Credential> {
    const deadline = this.#now() + this.#config.timeoutMs
    for (;;) {
      const stored = await this.#deps.vault.get(key)
      if (stored === undefined) throw await this.#consentRequired(key)
      if (this.#usableUntil(stored.expiresAt) > this.#now()) return this.#use(name, stored, 'cached')
      if (stored.refreshToken === undefined) {
        await this.#deps.vault.delete(key)
        throw await this.#consentRequired(key)
      }
      // One refresh per entry among replicas: a rotated refresh token works once.
      if (await this.#consents.lock(name, this.#config.timeoutMs + 1000)) {
        try {
          return await this.#refresh(key, name, stored)
        } finally {
          await this.#consents.unlock(name)
        }
      }
      if (this.#now() > deadline) throw issuerUnavailable(this.server, 'a refresh under way on another replica did not finish in time', undefined)
      await sleep(LOCK_POLL_MS)
    }
  }

  async #refresh (key: VaultKey, name: string, stored: VaultEntry): Promise<Credential> {
    // Another replica may have refreshed between our read and our lock.
    const latest = await this.#deps.vault.get(key)
    if (latest === undefined) throw await this.#consentRequired(key)
    if (this.#usableUntil(latest.expiresAt) > this.#now()) return this.#use(name, latest, 'cached')
    const who = { tenant: key.tenant, subject: key.subjectDigest ?? undefined, server: this.server, source: this.kind }
    let grant: Grant
    try {
      grant = await this.#client.refresh(latest.refreshToken ?? stored.refreshToken as string)
    } catch (err) {
      if (isGatewayError(err) && err.code === 'GW_ERR_CREDENTIAL_REFUSED') {
        // The grant is gone (revoked, expired, rotated away): only a new consent helps.
        await this.#deps.vault.delete(key)
        this.#hot.delete(name)
        this.#deps.metrics.credentialLookup(this.server, this.kind, 'consent_required')
        audit(this.#deps.log, 'credential.failed', { ...who, outcome: 'refused', code: err.code, ...oauthErrorOf(err) })
        throw await this.#consentRequired(key)
      }
      this.#deps.metrics.credentialLookup(this.server, this.kind, 'unavailable')
      throw err
    }
    // A server that does not rotate keeps the old refresh token valid.
    const entry = await this.#store(key, { ...grant, ...(grant.refreshToken === undefined && latest.refreshToken !== undefined ? { refreshToken: latest.refreshToken } : {}) })
    audit(this.#deps.log, 'credential.refreshed', { ...who, expiresAt: entry.expiresAt, rotated: grant.refreshToken !== undefined })
    return this.#use(name, entry, 'issued')
  }

  async #store (key: VaultKey, grant: Grant): Promise<VaultEntry> {
    const entry: VaultEntry = { accessToken: grant.accessToken, expiresAt: grant.expiresAt ?? this.#now() + this.#config.defaultLifetimeMs }
    if (grant.refreshToken !== undefined) entry.refreshToken = grant.refreshToken
    if (grant.scope !== undefined) entry.scope = grant.scope
    await this.#deps.vault.put(key, entry)
    return entry
  }

  #use (name: string, entry: VaultEntry, outcome: 'cached' | 'issued'): Credential {
    const credential = credentialOf(this.#config, entry.accessToken, entry.expiresAt)
    this.#hot.set(name, { credential, usableUntil: this.#usableUntil(entry.expiresAt) })
    this.#deps.metrics.credentialLookup(this.server, this.kind, outcome)
    return credential
  }

  /** A new consent link for this user, and the error that hands it to the client. */
  async #consentRequired (key: VaultKey): Promise<GatewayError> {
    const name = entryName(key)
    const now = this.#now()
    // A client retrying gets the same link while it has a while to live (one record, one URL to show).
    let link = this.#links.get(name)
    if (link === undefined || link.expiresAt - LINK_REUSE_MARGIN_MS <= now) {
      const id = opaque()
      const expiresAt = now + CONSENT_TTL_MS
      await this.#consents.put(`l.${id}`, { kind: 'link', link: { tenant: key.tenant, subjectDigest: key.subjectDigest ?? '', server: this.server, expiresAt } }, CONSENT_TTL_MS)
      link = { id, expiresAt }
      if (this.#links.size >= MAX_LINKS) for (const [n, l] of this.#links) if (l.expiresAt - LINK_REUSE_MARGIN_MS <= now) this.#links.delete(n)
      if (this.#links.size < MAX_LINKS) this.#links.set(name, link)
    }
    const url = `${(this.#config.redirectBaseUrl ?? '').replace(/\/+$/, '')}${CONSENT_PATH}${link.id}`
    this.#deps.metrics.credentialLookup(this.server, this.kind, 'consent_required')
    return consentRequired(this.server, url, link.id)
  }

  #usableUntil (expiresAt: number | null): number {
    return expiresAt === null ? Infinity : expiresAt - this.#config.refreshBeforeMs
  }

}

/** GW_ERR_CREDENTIAL_CONSENT_REQUIRED with the link and what to do in `data` (consent-error.ts turns it into a URL elicitation). */
export function consentRequired (server: string, url: string, elicitationId: string): GatewayError {
  return withData(new GW_ERR_CREDENTIAL_CONSENT_REQUIRED(server), {
    server,
    authorizationUrl: url,
    elicitationId,
    action: `Open ${url} in a browser, sign in at the authorization server of '${server}' and approve; then retry this request. The link expires in ${CONSENT_TTL_MS / 60_000} minutes.`
  })
}

function codeOf (err: unknown): string {
  return isGatewayError(err) ? err.code : 'GW_ERR_INTERNAL'
}

function oauthErrorOf (err: unknown): { oauthError?: string } {
  const value = isGatewayError(err) ? err.data?.oauthError : undefined
  return typeof value === 'string' ? { oauthError: value } : {}
}
