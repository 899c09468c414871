// A real authorization server for the credential tests: oidc-provider (the certified Node
// implementation) on a free loopback port, with the gateway registered as a confidential client
// allowed client_credentials and an RFC 8693 token exchange grant (registerGrantType). Access
// tokens are JWTs signed with the provider's keys (its jwks_uri), their audience the resource or
// audience asked for. The exchange accepts subject tokens signed by the test's "user" issuer.
import { generateKeyPair, exportJWK, jwtVerify, createLocalJWKSet, type JWK } from 'jose'
import Provider, { errors, type KoaContextWithOIDC } from 'oidc-provider'
import type { Test } from 'tap'
import { listen } from '../fixtures/http-upstreams.js'

export const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange'
export const GATEWAY_CLIENT = { id: 'gateway', secret: 'gateway-client-secret-0123456789' }

export interface OAuthServer {
  issuer: string
  jwksUri: string
  tokenEndpoint: string
  /** Lifetime of the next access tokens, in seconds. */
  ttlSeconds: number
  /** Subjects whose exchanges are refused (invalid_grant). */
  refused: Set<string>
  /** Grants answered, by grant type. */
  grants: Array<{ grantType: string, subject?: string, audience?: string }>
  /** Stops listening (open sockets dropped): the server is down. */
  stop: () => Promise<void>
}

/**
 * Starts the server. `userKeys`: the public keys of the issuer whose JWTs clients present to the
 * gateway (the subject tokens of an exchange).
 */
export async function startOAuthServer (t: Test, userKeys: { keys: JWK[] }, userIssuer: string): Promise<OAuthServer> {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true })
  const signing = { ...(await exportJWK(privateKey)), kid: 'as-1', alg: 'RS256', use: 'sig' }
  const userJwks = createLocalJWKSet(userKeys)
  // The port is known before the provider exists: its issuer must be its own URL.
  let handler: ((req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) => void) | undefined
  const http = await listen((req, res) => { handler?.(req, res) })
  const state: OAuthServer = {
    issuer: http.url,
    jwksUri: `${http.url}/jwks`,
    tokenEndpoint: `${http.url}/token`,
    ttlSeconds: 300,
    refused: new Set(),
    grants: [],
    stop: http.close
  }
  const resourceServer = (audience: string): InstanceType<Provider['ResourceServer']> =>
    new provider.ResourceServer(audience, { audience, scope: 'read write', accessTokenFormat: 'jwt', accessTokenTTL: state.ttlSeconds, jwt: { sign: { alg: 'RS256' } } })
  const provider: Provider = new Provider(http.url, {
    clients: [{
      client_id: GATEWAY_CLIENT.id,
      client_secret: GATEWAY_CLIENT.secret,
      grant_types: ['client_credentials', TOKEN_EXCHANGE],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_basic'
    }],
    jwks: { keys: [signing] },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined as unknown as string,
        getResourceServerInfo: (_ctx: unknown, indicator: string) => ({ audience: indicator, scope: 'read write', accessTokenFormat: 'jwt', accessTokenTTL: state.ttlSeconds, jwt: { sign: { alg: 'RS256' } } }),
        useGrantedResource: () => true
      }
    },
    scopes: ['read', 'write'],
    ttl: { ClientCredentials: () => state.ttlSeconds, AccessToken: () => state.ttlSeconds }
  })
  provider.on('grant.success', (ctx: KoaContextWithOIDC) => {
    const params = ctx.oidc.params as Record<string, string | undefined>
    if (params.grant_type === 'client_credentials') state.grants.push({ grantType: 'client_credentials', ...(params.resource === undefined ? {} : { audience: params.resource }) })
  })
  provider.registerGrantType(TOKEN_EXCHANGE, async (ctx: KoaContextWithOIDC) => {
    const params = ctx.oidc.params as Record<string, string | undefined>
    let subject: string
    try {
      const { payload } = await jwtVerify(params.subject_token ?? '', userJwks, { issuer: userIssuer })
      subject = String(payload.sub)
    } catch {
      throw new errors.InvalidGrant('subject_token is not valid')
    }
    const audience = params.audience ?? params.resource
    if (audience === undefined) throw new errors.InvalidTarget('audience or resource is required')
    if (state.refused.has(subject)) throw new errors.InvalidGrant('exchange refused for this subject')
    const token = new provider.AccessToken({ accountId: subject, client: ctx.oidc.client, gty: 'token_exchange', scope: 'read', resourceServer: resourceServer(audience) } as ConstructorParameters<Provider['AccessToken']>[0])
    const value = await token.save()
    state.grants.push({ grantType: TOKEN_EXCHANGE, subject, audience })
    ctx.body = { access_token: value, issued_token_type: 'urn:ietf:params:oauth:token-type:access_token', token_type: 'Bearer', expires_in: token.expiration, scope: 'read' }
  }, ['subject_token', 'subject_token_type', 'audience', 'resource', 'scope', 'requested_token_type', 'actor_token', 'actor_token_type'])
  const callback = provider.callback()
  handler = (req, res) => { void callback(req, res) }
  t.teardown(http.close)
  return state
}
