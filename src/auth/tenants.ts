// The tenant table: who may call, with which credentials, which servers, and what each tenant's
// sessions add upstream. One object, so a config reload swaps it whole (replace()) and every
// request after that sees the new table; requests already authenticated keep their principal.
import type { Config, TenantConfig, TenantJwtConfig, TenantLimitsConfig, TenantServerConfig } from '../config/schema.js'
import type { TenantUpstream } from '../backends/backend.js'
import { matchApiKey, type ApiKeyEntry } from './api-keys.js'
import { principalOf, type Principal } from './principal.js'

export type { TenantUpstream }

/** The two client faces an MCP endpoint can have; each is its own protected resource. */
export type EndpointKind = 'mcp' | 'sse'

/** A JWT issuer as one tenant configured it. */
export interface TenantIssuer {
  tenant: string
  jwt: TenantJwtConfig
}

const NO_UPSTREAM: TenantUpstream = Object.freeze({ headers: Object.freeze({}), env: Object.freeze({}) })

export type TenantSettings = Pick<Config, 'auth' | 'tenants'>

export class TenantDirectory {
  #tenants = new Map<string, TenantConfig>()
  /** Each key with the principal it authenticates as (fixed by config: made once, shared, frozen). */
  #apiKeys: Array<ApiKeyEntry & { principal: Readonly<Principal> }> = []
  #issuers = new Map<string, TenantIssuer[]>()
  #enabled = false
  #publicUrl = ''

  constructor (settings: TenantSettings) {
    this.replace(settings)
  }

  /**
   * Swaps the whole table (config reload). The settings must have passed loadConfig's checks
   * (every tenant's servers exist; publicUrl set when tenants are).
   */
  replace (settings: TenantSettings): void {
    const tenants = new Map<string, TenantConfig>()
    const apiKeys: Array<ApiKeyEntry & { principal: Readonly<Principal> }> = []
    const issuers = new Map<string, TenantIssuer[]>()
    for (const [name, tenant] of Object.entries(settings.tenants ?? {})) {
      tenants.set(name, tenant)
      for (const key of tenant.apiKeys) {
        apiKeys.push({ tenant: name, id: key.id, digest: Buffer.from(key.sha256, 'hex'), principal: Object.freeze(principalOf(name, `key:${key.id}`, 'api-key')) })
      }
      for (const jwt of tenant.jwt) {
        const list = issuers.get(jwt.issuer) ?? []
        list.push({ tenant: name, jwt })
        issuers.set(jwt.issuer, list)
      }
    }
    this.#tenants = tenants
    this.#apiKeys = apiKeys
    this.#issuers = issuers
    this.#enabled = settings.tenants !== undefined
    this.#publicUrl = (settings.auth.publicUrl ?? '').replace(/\/+$/, '')
  }

  /** Whether tenants are configured: then every MCP endpoint needs a credential. */
  get enabled (): boolean { return this.#enabled }

  /** The principal an API key authenticates as, or null; constant time in the key (api-keys.ts). */
  principalOfApiKey (presented: string): Readonly<Principal> | null {
    return matchApiKey(this.#apiKeys, presented)?.principal ?? null
  }

  /** The tenants' configurations of a JWT issuer (several tenants may share one). */
  issuer (iss: string): readonly TenantIssuer[] {
    return this.#issuers.get(iss) ?? []
  }

  /** The tenant's settings for a server, or undefined when the server does not exist for it. */
  server (tenant: string, server: string): TenantServerConfig | undefined {
    const servers = this.#tenants.get(tenant)?.servers
    return servers !== undefined && Object.hasOwn(servers, server) ? servers[server] : undefined
  }

  /** The tenant's limits (auth/rate-limit.ts, auth/quotas.ts); undefined for an unknown tenant. */
  limits (tenant: string): TenantLimitsConfig | undefined {
    return this.#tenants.get(tenant)?.limits
  }

  /** What a tenant's sessions of a server add upstream; nothing for the anonymous principal. */
  upstream (tenant: string | null | undefined, server: string): TenantUpstream {
    if (tenant === null || tenant === undefined) return NO_UPSTREAM
    return this.server(tenant, server)?.upstream ?? NO_UPSTREAM
  }

  /** Issuers of the tenants that may use a server: its metadata's authorization_servers. */
  authorizationServers (server: string): string[] {
    const out = new Set<string>()
    for (const tenant of this.#tenants.values()) {
      if (!Object.hasOwn(tenant.servers, server)) continue
      for (const jwt of tenant.jwt) out.add(jwt.issuer)
    }
    return [...out]
  }

  /** Whether any tenant may use a server (the metadata of other servers is 404). */
  served (server: string): boolean {
    for (const tenant of this.#tenants.values()) if (Object.hasOwn(tenant.servers, server)) return true
    return false
  }

  /** The endpoint's canonical URL: its RFC 9728 `resource` and the default JWT audience (RFC 8707). */
  resourceUrl (kind: EndpointKind, server: string): string {
    return `${this.#publicUrl}/${kind}/${server}`
  }

  /** Where the endpoint's protected resource metadata is served (RFC 9728 section 3.1, path-inserted). */
  metadataUrl (kind: EndpointKind, server: string): string {
    return `${this.#publicUrl}/.well-known/oauth-protected-resource/${kind}/${server}`
  }
}
