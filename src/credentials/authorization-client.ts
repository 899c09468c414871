// The gateway as an OAuth client of a backend's authorization server, for the user-authorization
// source: authorization code with PKCE (S256, RFC 7636), refresh, revocation (RFC 7009), through
// openid-client. Where the server is found, as the MCP authorization spec (2025-11-25,
// "Authorization Server Discovery") has a client do it: the configured endpoints; else the
// configured `issuer`'s metadata (RFC 8414 first, then OpenID discovery); else the backend's
// protected resource metadata (RFC 9728) at `resource`, whose `authorization_servers` names it.
// Every request carries `resource` (RFC 8707) when configured, so tokens are bound to the backend.
import * as oidc from 'openid-client'
import { clientAuthOf, discoveryOptions, grantOf, isPlainLoopback, issuerFailure, issuerUnavailable, withDeadline, type Grant } from './issuer.js'
import { AUTHORIZATION_CALLBACK_PATH, type CredentialsConfig } from './types.js'

/** Where the authorization server sends the user back, under the gateway's public base. */
export const CALLBACK_PATH = AUTHORIZATION_CALLBACK_PATH

export function redirectUriOf (config: CredentialsConfig): string {
  return `${(config.redirectBaseUrl ?? '').replace(/\/+$/, '')}${CALLBACK_PATH}`
}

export class AuthorizationClient {
  readonly #server: string
  readonly #config: CredentialsConfig
  #configuration: Promise<oidc.Configuration> | undefined

  constructor (server: string, config: CredentialsConfig) {
    this.#server = server
    this.#config = config
  }

  /** The authorization request's URL (state and S256 challenge of `verifier`). */
  async authorizationUrl (state: string, verifier: string): Promise<URL> {
    const configuration = await this.#now()
    const parameters: Record<string, string> = {
      redirect_uri: redirectUriOf(this.#config),
      response_type: 'code',
      state,
      code_challenge: await oidc.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
      ...this.#resource()
    }
    if (this.#config.scopes.length > 0) parameters.scope = this.#config.scopes.join(' ')
    return oidc.buildAuthorizationUrl(configuration, parameters)
  }

  /** The code of `callbackUrl` exchanged for tokens (state, issuer and PKCE checked by openid-client). */
  async exchange (callbackUrl: URL, state: string, verifier: string): Promise<Grant> {
    const configuration = await this.#now()
    return await this.#call(async () => await oidc.authorizationCodeGrant(configuration, callbackUrl, { pkceCodeVerifier: verifier, expectedState: state }, this.#resource()))
  }

  async refresh (refreshToken: string): Promise<Grant> {
    const configuration = await this.#now()
    return await this.#call(async () => await oidc.refreshTokenGrant(configuration, refreshToken, this.#resource()))
  }

  /** RFC 7009 revocation of each token, where the server's metadata names a revocation endpoint; false when it names none. */
  async revoke (tokens: Array<{ token: string, hint: 'access_token' | 'refresh_token' }>): Promise<boolean> {
    const configuration = await this.#now()
    if (configuration.serverMetadata().revocation_endpoint === undefined) return false
    for (const { token, hint } of tokens) {
      try {
        await oidc.tokenRevocation(configuration, token, { token_type_hint: hint })
      } catch (err) {
        throw issuerFailure(this.#server, this.#config.timeoutMs, err)
      }
    }
    return true
  }

  #resource (): Record<string, string> {
    return this.#config.resource === undefined ? {} : { resource: this.#config.resource }
  }

  async #call (grant: () => Promise<oidc.TokenEndpointResponse>): Promise<Grant> {
    let answer: oidc.TokenEndpointResponse
    try {
      answer = await grant()
    } catch (err) {
      throw issuerFailure(this.#server, this.#config.timeoutMs, err)
    }
    return grantOf(answer)
  }

  /** The client's configuration, found once; a failed discovery is tried again next time. */
  async #now (): Promise<oidc.Configuration> {
    this.#configuration ??= this.#configure()
    try {
      return await this.#configuration
    } catch (err) {
      this.#configuration = undefined
      throw issuerFailure(this.#server, this.#config.timeoutMs, err)
    }
  }

  async #configure (): Promise<oidc.Configuration> {
    const c = this.#config
    const auth = clientAuthOf(c)
    const clientId = c.clientId ?? ''
    if (c.authorizationEndpoint !== undefined && c.tokenEndpoint !== undefined) {
      const metadata: oidc.ServerMetadata = { issuer: c.issuer ?? new URL(c.tokenEndpoint).origin, authorization_endpoint: c.authorizationEndpoint, token_endpoint: c.tokenEndpoint }
      const configuration = new oidc.Configuration(metadata, clientId, undefined, auth)
      if ([c.authorizationEndpoint, c.tokenEndpoint].some(isPlainLoopback)) oidc.allowInsecureRequests(configuration)
      return withDeadline(configuration, c)
    }
    const issuer = c.issuer ?? await this.#issuerFromResource()
    const insecure = isPlainLoopback(issuer)
    const options = discoveryOptions(c, insecure)
    let configuration: oidc.Configuration
    try {
      configuration = await oidc.discovery(new URL(issuer), clientId, undefined, auth, { ...options, algorithm: 'oauth2' })
    } catch {
      configuration = await oidc.discovery(new URL(issuer), clientId, undefined, auth, { ...options, algorithm: 'oidc' })
    }
    return withDeadline(configuration, c)
  }

  /**
   * RFC 9728: the backend's protected resource metadata, at the path-inserted well-known URL
   * first, then at the root; its `resource` must be the backend's, its first authorization server is used.
   */
  async #issuerFromResource (): Promise<string> {
    const resource = this.#config.resource
    if (resource === undefined) throw issuerUnavailable(this.#server, 'no issuer, endpoints or resource to discover it from', undefined)
    const url = new URL(resource)
    const path = url.pathname === '/' ? '' : url.pathname.replace(/\/+$/, '')
    const candidates = [...new Set([`${url.origin}/.well-known/oauth-protected-resource${path}`, `${url.origin}/.well-known/oauth-protected-resource`])]
    for (const candidate of candidates) {
      const res = await fetch(candidate, { headers: { accept: 'application/json' }, signal: AbortSignal.timeout(this.#config.timeoutMs), redirect: 'error' })
      if (!res.ok) { await res.body?.cancel(); continue }
      const metadata = await res.json() as { resource?: unknown, authorization_servers?: unknown }
      const servers = Array.isArray(metadata.authorization_servers) ? metadata.authorization_servers.filter((s): s is string => typeof s === 'string') : []
      if (metadata.resource !== resource || servers[0] === undefined) throw issuerUnavailable(this.#server, 'its protected resource metadata does not name this resource and an authorization server', undefined)
      return servers[0]
    }
    throw issuerUnavailable(this.#server, 'it publishes no protected resource metadata', undefined)
  }
}
