// One authorization server as the gateway's client sees it (openid-client): its metadata (read
// once from `issuer`, or the configured `tokenEndpoint`), the client's authentication, and grants
// with a deadline. Every failure becomes a typed error: the server unreachable, slow or answering
// nonsense is GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE; an OAuth error answer (invalid_grant,
// unauthorized_client, ...) is GW_ERR_CREDENTIAL_REFUSED with its error code in data.oauthError.
// Neither message carries a token, a secret or the server's error_description (it may echo input).
import * as oidc from 'openid-client'
import { isLoopbackAddress } from '../core/loopback.js'
import { GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE, GW_ERR_CREDENTIAL_REFUSED, isGatewayError, withData, withRetryAfter, type GatewayError } from '../core/errors.js'
import type { CredentialsConfig } from './types.js'

/** What a grant gave. */
export interface Grant {
  accessToken: string
  /** Epoch ms; null when the answer had no expires_in. */
  expiresAt: number | null
  scope?: string
  refreshToken?: string
}

/** What a token endpoint's answer gave. */
export function grantOf (answer: oidc.TokenEndpointResponse): Grant {
  const grant: Grant = {
    accessToken: answer.access_token,
    expiresAt: typeof answer.expires_in === 'number' ? Date.now() + answer.expires_in * 1000 : null
  }
  if (typeof answer.scope === 'string') grant.scope = answer.scope
  if (typeof answer.refresh_token === 'string') grant.refreshToken = answer.refresh_token
  return grant
}

/** Seconds a client is told to wait after the authorization server failed. */
const UNAVAILABLE_RETRY_S = 5

export class Issuer {
  readonly #server: string
  readonly #config: CredentialsConfig
  #configuration: Promise<oidc.Configuration> | undefined

  constructor (server: string, config: CredentialsConfig) {
    this.#server = server
    this.#config = config
  }

  /** A grant at the token endpoint (`grantType` any registered grant; parameters as the form). */
  async grant (grantType: string, parameters: Record<string, string>, signal?: AbortSignal): Promise<Grant> {
    const configuration = await this.#configurationNow(signal)
    let answer: oidc.TokenEndpointResponse
    try {
      answer = grantType === 'client_credentials'
        ? await oidc.clientCredentialsGrant(configuration, parameters)
        : await oidc.genericGrantRequest(configuration, grantType, parameters)
    } catch (err) {
      throw this.#failure(err)
    }
    if (signal?.aborted === true) throw this.#unavailable('the request was abandoned', signal.reason)
    return grantOf(answer)
  }

  /** The client's configuration, discovered once; a failed discovery is tried again next time. */
  async #configurationNow (signal?: AbortSignal): Promise<oidc.Configuration> {
    this.#configuration ??= this.#configure()
    try {
      const configuration = await this.#configuration
      signal?.throwIfAborted()
      return configuration
    } catch (err) {
      this.#configuration = undefined
      throw this.#failure(err)
    }
  }

  async #configure (): Promise<oidc.Configuration> {
    const c = this.#config
    const clientId = c.clientId ?? ''
    const auth = clientAuthOf(c)
    const insecure = [c.issuer, c.tokenEndpoint].some(url => url !== undefined && isPlainLoopback(url))
    let configuration: oidc.Configuration
    if (c.tokenEndpoint !== undefined) {
      const metadata: oidc.ServerMetadata = {
        issuer: c.issuer ?? new URL(c.tokenEndpoint).origin,
        token_endpoint: c.tokenEndpoint,
        ...(c.authorizationEndpoint === undefined ? {} : { authorization_endpoint: c.authorizationEndpoint })
      }
      configuration = new oidc.Configuration(metadata, clientId, undefined, auth)
      if (insecure) oidc.allowInsecureRequests(configuration)
    } else {
      configuration = await oidc.discovery(new URL(c.issuer as string), clientId, undefined, auth, discoveryOptions(c, insecure))
    }
    return withDeadline(configuration, c)
  }

  #failure (err: unknown): GatewayError {
    return issuerFailure(this.#server, this.#config.timeoutMs, err)
  }

  #unavailable (why: string, cause: unknown): GatewayError {
    return issuerUnavailable(this.#server, why, cause)
  }
}

/** The client's authentication at the token endpoint: none for a public client. */
export function clientAuthOf (c: CredentialsConfig): oidc.ClientAuth {
  if (c.clientSecret === undefined) return oidc.None()
  return c.clientAuth === 'client_secret_post' ? oidc.ClientSecretPost(c.clientSecret) : oidc.ClientSecretBasic(c.clientSecret)
}

const timeoutSeconds = (c: CredentialsConfig): number => Math.max(1, Math.ceil(c.timeoutMs / 1000))

/** A fetch that ends by the config's deadline: openid-client counts whole seconds, the config milliseconds. */
export function deadlineFetch (c: CredentialsConfig): oidc.CustomFetch {
  return async (url, options) => await fetch(url, {
    ...options,
    signal: AbortSignal.any([options.signal, AbortSignal.timeout(c.timeoutMs)].filter((s): s is AbortSignal => s !== undefined))
  } as RequestInit)
}

/** The discovery options: the deadline held by the fetch too, plain http allowed to a loopback issuer. */
export function discoveryOptions (c: CredentialsConfig, insecure: boolean): oidc.DiscoveryRequestOptions {
  return { timeout: timeoutSeconds(c), [oidc.customFetch]: deadlineFetch(c), ...(insecure ? { execute: [oidc.allowInsecureRequests] } : {}) }
}

/** Every request of `configuration` ends by the config's deadline. */
export function withDeadline (configuration: oidc.Configuration, c: CredentialsConfig): oidc.Configuration {
  configuration.timeout = timeoutSeconds(c)
  configuration[oidc.customFetch] = deadlineFetch(c)
  return configuration
}

/** What a failed call to the authorization server means for the caller (see the top of this file). */
export function issuerFailure (server: string, timeoutMs: number, err: unknown): GatewayError {
  if (err instanceof oidc.ResponseBodyError) {
    // A 5xx with an OAuth body is still the server failing, not a decision about this caller.
    if (err.status >= 500) return issuerUnavailable(server, `it answered HTTP ${err.status}`, err)
    return withData(new GW_ERR_CREDENTIAL_REFUSED(server, err.error), { server, oauthError: err.error, status: err.status })
  }
  if (isGatewayError(err)) return err
  const name = (err as Error | undefined)?.name
  if (name === 'TimeoutError' || name === 'AbortError') return issuerUnavailable(server, `no answer within ${timeoutMs} ms`, err)
  const code = (err as { code?: unknown } | undefined)?.code
  if (code === 'OAUTH_RESPONSE_IS_NOT_CONFORM' || code === 'OAUTH_JSON_ATTRIBUTE_COMPARISON_FAILED' || code === 'OAUTH_INVALID_RESPONSE') {
    return issuerUnavailable(server, 'its answer is not a valid OAuth response', err)
  }
  return issuerUnavailable(server, 'it cannot be reached', err)
}

export function issuerUnavailable (server: string, why: string, cause: unknown): GatewayError {
  const err = withRetryAfter(new GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE(server, why, { cause }), UNAVAILABLE_RETRY_S)
  return withData(err, { server })
}

/** http to a loopback host: allowed by config checks, and openid-client must be told so. */
export function isPlainLoopback (text: string): boolean {
  try {
    const url = new URL(text)
    return url.protocol === 'http:' && isLoopbackAddress(url.hostname.replace(/^\[|\]$/g, ''))
  } catch {
    return false
  }
}
