// The credential sources of the live config: one per (tenant, server) whose `credentials` block
// says something other than static, made on first use and kept while that block stays the same.
// A reload that changes a block replaces its source (its in-memory cache goes; the vault's entries
// stay, filed under the audience, so an unchanged audience finds them again). `bind` gives a
// backend connection the credential of one caller (caller.ts).
import { GW_ERR_CREDENTIAL_REQUIRED, GW_ERR_INTERNAL, withData } from '../core/errors.js'
import { credentialsConfigOf, wantsCallerToken } from '../config/credentials-check.js'
import type { Config } from '../config/schema.js'
import { CallerTokens } from './caller-tokens.js'
import { isPerUserSource } from '../config/credentials-check.js'
import { GrantingSource, type SourceDeps } from './granting-source.js'
import { clientCredentials, tokenExchange } from './strategies.js'
import type { CallerCredential, Credential, CredentialCaller, CredentialSource, CredentialSourceKind, CredentialTarget, CredentialsConfig } from './types.js'

export type { SourceDeps }

/** Makes the source of one (tenant, server) block. */
export type SourceFactory = (context: { tenant: string | null, server: string, config: CredentialsConfig, deps: SourceDeps }) => CredentialSource

/** The config a lookup reads: servers and tenants, as live.ts holds them. */
export type CredentialsLive = Pick<Config, 'servers' | 'tenants'>

/** The built-in factories; user-authorization is registered by its own module (register()). */
const BUILT_IN: Partial<Record<CredentialSourceKind, SourceFactory>> = {
  'token-exchange': ({ server, config, deps }) => new GrantingSource(server, config, tokenExchange, deps),
  'client-credentials': ({ server, config, deps }) => new GrantingSource(server, config, clientCredentials, deps)
}

/** A source and the target it serves: what a lookup for one caller needs. */
export interface BoundSource { source: CredentialSource, target: CredentialTarget }

export class CredentialSources {
  readonly #deps: SourceDeps
  readonly #factories: Partial<Record<CredentialSourceKind, SourceFactory>>
  readonly #made = new Map<string, { config: CredentialsConfig, text: string, bound: BoundSource }>()
  /** Each caller's newest verified JWT on this replica (caller-tokens.ts). */
  readonly tokens = new CallerTokens()

  constructor (deps: SourceDeps) {
    this.#deps = deps
    this.#factories = { ...BUILT_IN }
  }

  /** Adds (or replaces) the factory of a source kind: how user-authorization plugs in. */
  register (kind: CredentialSourceKind, factory: SourceFactory): void {
    this.#factories[kind] = factory
  }

  /** The source for `tenant`'s users of `server` under `live`, or undefined when it is static. */
  sourceFor (live: CredentialsLive, tenant: string | null, server: string): BoundSource | undefined {
    const config = credentialsConfigOf(live, tenant, server)
    const id = `${tenant ?? ''}/${server}`
    if (config === undefined || config.source === 'static') {
      this.#drop(id)
      return undefined
    }
    const made = this.#made.get(id)
    // The same (frozen) block as last time: the common case, without serialising it.
    if (made !== undefined && made.config === config) return made.bound
    const text = JSON.stringify(config)
    if (made !== undefined && made.text === text) {
      made.config = config
      return made.bound
    }
    this.#drop(id)
    const factory = this.#factories[config.source]
    if (factory === undefined) throw new GW_ERR_INTERNAL(`credential source ${config.source} is not available in this build`)
    const bound = { source: factory({ tenant, server, config, deps: this.#deps }), target: { server, config } }
    this.#made.set(id, { config, text, bound })
    return bound
  }

  /** A reload: sources whose block changed or went are dropped now (the rest are checked on use). */
  reconfigure (live: CredentialsLive): void {
    for (const [id, made] of this.#made) {
      const slash = id.indexOf('/')
      const tenant = slash === 0 ? null : id.slice(0, slash)
      const config = credentialsConfigOf(live, tenant, id.slice(slash + 1))
      if (config === undefined || JSON.stringify(config) !== made.text) this.#drop(id)
    }
  }

  /**
   * The credential of `caller` toward `server`, for a backend connection to hold, or undefined when
   * the server's requests carry only configured headers. `caller.subjectDigest` null: a connection
   * shared by the tenant's users (a pool's), which can carry the tenant's credential
   * (client-credentials) but never one user's: its requests get GW_ERR_CREDENTIAL_REQUIRED.
   */
  bind (live: CredentialsLive, caller: { tenant: string | null, subjectDigest: string | null }, server: string): CallerCredentialBinding | undefined {
    if (this.sourceFor(live, caller.tenant, server) === undefined) return undefined
    return new CallerCredentialBinding(this, live, caller, server)
  }

  /** Whether `tenant`'s users of `server` (or of its aggregate members) need their own JWT at hand (a token exchange). */
  wantsCallerToken (live: CredentialsLive, tenant: string | null, server: string): boolean {
    return wantsCallerToken(live, tenant, server)
  }

  close (): void {
    for (const id of [...this.#made.keys()]) this.#drop(id)
    this.tokens.clear()
  }

  #drop (id: string): void {
    const made = this.#made.get(id)
    if (made === undefined) return
    this.#made.delete(id)
    made.bound.source.close()
  }
}

/**
 * One caller's credential toward one server, as a backend connection holds it: the source is looked
 * up per request (a reload may have changed it), the caller's newest token is kept in memory only.
 */
export class CallerCredentialBinding implements CallerCredential {
  readonly #sources: CredentialSources
  readonly #live: CredentialsLive
  readonly #server: string
  readonly #tenant: string | null
  readonly #subjectDigest: string | null
  #token: string | undefined

  constructor (sources: CredentialSources, live: CredentialsLive, caller: { tenant: string | null, subjectDigest: string | null, token?: string }, server: string) {
    this.#sources = sources
    this.#live = live
    this.#server = server
    this.#tenant = caller.tenant
    this.#subjectDigest = caller.subjectDigest
    this.#token = caller.token
  }

  /** Who the credential is for; the token is the newest this replica holds for the caller. */
  get caller (): CredentialCaller {
    const token = this.#subjectDigest === null ? undefined : this.#token ?? this.#sources.tokens.tokenOf(this.#tenant, this.#subjectDigest)
    return { tenant: this.#tenant, subjectDigest: this.#subjectDigest ?? '*', ...(token === undefined ? {} : { token }) }
  }

  async current (signal?: AbortSignal): Promise<Credential | null> {
    const bound = this.#bound()
    return bound === undefined ? null : await bound.source.credentialFor(this.caller, bound.target, signal)
  }

  async rejected (credential: Credential): Promise<void> {
    const bound = this.#bound()
    await bound?.source.invalidate(this.caller, bound.target, credential)
  }

  update (token: string | undefined): void {
    if (token !== undefined) this.#token = token
  }

  #bound (): BoundSource | undefined {
    const bound = this.#sources.sourceFor(this.#live, this.#tenant, this.#server)
    if (bound !== undefined && this.#subjectDigest === null && isPerUserSource(bound.target.config)) {
      throw withData(new GW_ERR_CREDENTIAL_REQUIRED(this.#server, `a connection shared by the tenant's users cannot carry one user's ${bound.target.config.source} credential`), { server: this.#server })
    }
    return bound
  }
}
