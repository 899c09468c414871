// The credential sources of the live config: one per (tenant, server) whose `credentials` block
// says something other than static, made on first use and kept while that block stays the same.
// A reload that changes a block replaces its source (its in-memory cache goes; the vault's entries
// stay, filed under the audience, so an unchanged audience finds them again). `bind` gives a
// backend connection the credential of one caller (caller.ts).
import { GW_ERR_INTERNAL } from '../core/errors.js'
import { credentialsConfigOf } from '../config/credentials-check.js'
import type { Config } from '../config/schema.js'
import { GrantingSource, type SourceDeps } from './granting-source.js'
import { clientCredentials, tokenExchange } from './strategies.js'
import type { Credential, CredentialCaller, CredentialSource, CredentialSourceKind, CredentialTarget, CredentialsConfig } from './types.js'

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
  readonly #made = new Map<string, { text: string, bound: BoundSource }>()

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
    const text = JSON.stringify(config)
    const made = this.#made.get(id)
    if (made !== undefined && made.text === text) return made.bound
    this.#drop(id)
    const factory = this.#factories[config.source]
    if (factory === undefined) throw new GW_ERR_INTERNAL(`credential source ${config.source} is not available in this build`)
    const bound = { source: factory({ tenant, server, config, deps: this.#deps }), target: { server, config } }
    this.#made.set(id, { text, bound })
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
   * The credential of `caller` toward `server`, for a backend connection to hold (caller.ts), or
   * undefined when the server's requests carry only configured headers.
   */
  bind (live: CredentialsLive, caller: CredentialCaller, server: string): CallerCredentialBinding | undefined {
    return this.sourceFor(live, caller.tenant, server) === undefined ? undefined : new CallerCredentialBinding(this, live, caller, server)
  }

  close (): void {
    for (const id of [...this.#made.keys()]) this.#drop(id)
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
export class CallerCredentialBinding {
  readonly #sources: CredentialSources
  readonly #live: CredentialsLive
  readonly #server: string
  #caller: CredentialCaller

  constructor (sources: CredentialSources, live: CredentialsLive, caller: CredentialCaller, server: string) {
    this.#sources = sources
    this.#live = live
    this.#server = server
    this.#caller = { ...caller }
  }

  get caller (): CredentialCaller { return this.#caller }

  async current (signal?: AbortSignal): Promise<Credential | null> {
    const bound = this.#sources.sourceFor(this.#live, this.#caller.tenant, this.#server)
    return bound === undefined ? null : await bound.source.credentialFor(this.#caller, bound.target, signal)
  }

  async rejected (credential: Credential): Promise<void> {
    const bound = this.#sources.sourceFor(this.#live, this.#caller.tenant, this.#server)
    await bound?.source.invalidate(this.#caller, bound.target, credential)
  }

  update (token: string | undefined): void {
    if (token !== undefined) this.#caller = { ...this.#caller, token }
  }
}
