// Credentials -> principal (docs/architecture.md, A-RS-3). A credential arrives
// only in a header: `Authorization: Bearer <API key or JWT>` or `X-API-Key: <API key>`; a token
// in the query string is never looked at. Refusals carry the RFC 6750 challenge: without a
// credential only `resource_metadata` (the client starts discovery, RFC 9728 section 5.1); with a
// bad one `error="invalid_token"` too.
import type { IncomingHttpHeaders } from 'node:http'
import { GW_ERR_BAD_REQUEST, GW_ERR_INVALID_TOKEN, GW_ERR_UNAUTHORIZED, type GatewayError } from '../core/errors.js'
import { principalOf, type Principal } from './principal.js'
import type { EndpointKind, TenantDirectory } from './tenants.js'

/** A compact JWS: three base64url parts (the last empty for `alg: none`, refused later). */
const JWT_SHAPE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/
const BEARER = /^Bearer +([^\s,]+) *$/i
/** The auth-scheme of an Authorization value (RFC 9110 11.4): a token, then space or the end. */
const BEARER_SCHEME = /^Bearer(?: |$)/i

export interface Endpoint {
  kind: EndpointKind
  server: string
}

/**
 * Verifies a JWT presented for an endpoint (jwt.ts); absent: no tenant accepts JWTs.
 * `heldKeysOnly`: with the keys already held, never fetching a key set.
 */
export type JwtCheck = (token: string, endpoint: Endpoint, heldKeysOnly?: boolean) => Promise<{ tenant: string, subject: string }>

export type Credential = { type: 'api-key' | 'jwt', value: string } | null

function single (headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name]
  return Array.isArray(value) ? value[0] : value
}

/** The one credential a request presents; two different ones are a malformed request (RFC 6750 3.1). */
export function credentialOf (headers: IncomingHttpHeaders): Credential | 'malformed' {
  const authorization = single(headers, 'authorization')
  const apiKey = single(headers, 'x-api-key')
  let bearer: string | undefined
  // Another scheme (Basic for some proxy, Digest, a bare key) carries no Bearer credential: it is
  // ignored, so the request is judged on X-API-Key or gets the plain challenge (RFC 6750 section
  // 3: an unsupported authentication method gets no error code, and is no malformed request).
  if (authorization !== undefined && BEARER_SCHEME.test(authorization.trimStart())) {
    const m = BEARER.exec(authorization.trimStart())
    if (m === null) return 'malformed'
    bearer = m[1]
  }
  if (bearer !== undefined && apiKey !== undefined && apiKey !== '' && apiKey !== bearer) return 'malformed'
  if (bearer !== undefined) return { type: JWT_SHAPE.test(bearer) ? 'jwt' : 'api-key', value: bearer }
  if (apiKey !== undefined && apiKey !== '') return { type: 'api-key', value: apiKey }
  return null
}

/** Why a request was refused, for the audit line; never the credential itself. */
export class AuthRefusal {
  constructor (readonly error: GatewayError, readonly reason: string, readonly via: 'api-key' | 'jwt' | 'none') {}
}

/** The 401 for a request without a credential: only where to start discovery. */
export function challenge (directory: TenantDirectory, endpoint: Endpoint): GatewayError {
  const err: GatewayError = new GW_ERR_UNAUTHORIZED('a credential is required (Authorization: Bearer, or X-API-Key)')
  err.wwwAuthenticate = `Bearer resource_metadata="${directory.metadataUrl(endpoint.kind, endpoint.server)}"`
  return err
}

/** The 401 for a credential that is not accepted. `reason` is safe to show (no credential in it). */
export function invalidToken (directory: TenantDirectory, endpoint: Endpoint, reason: string): GatewayError {
  const err: GatewayError = new GW_ERR_INVALID_TOKEN(reason)
  // RFC 6750 3: error_description is printable ASCII without '"' or '\\'.
  const description = reason.replace(/[^\x20-\x21\x23-\x5b\x5d-\x7e]/g, '?')
  err.wwwAuthenticate = `Bearer error="invalid_token", error_description="${description}", resource_metadata="${directory.metadataUrl(endpoint.kind, endpoint.server)}"`
  return err
}

/**
 * The principal a request's headers authenticate as, for one endpoint. Throws an AuthRefusal
 * whose error is the answer (401, 400, or 503 when a JWT's keys cannot be fetched).
 * `heldOnly`: only what verifies from what the gateway holds (an API key's digest, a JWT signed
 * by a key already fetched); a token that would need a key set fetched is refused.
 */
export async function authenticate (headers: IncomingHttpHeaders, endpoint: Endpoint, directory: TenantDirectory, jwt?: JwtCheck, heldOnly = false): Promise<Principal> {
  const credential = credentialOf(headers)
  if (credential === null) throw new AuthRefusal(challenge(directory, endpoint), 'no credential', 'none')
  if (credential === 'malformed') {
    const err: GatewayError = new GW_ERR_BAD_REQUEST('one credential is expected: Authorization: Bearer <token>, or X-API-Key: <key>')
    err.wwwAuthenticate = `Bearer error="invalid_request", resource_metadata="${directory.metadataUrl(endpoint.kind, endpoint.server)}"`
    throw new AuthRefusal(err, 'malformed credential', 'none')
  }
  if (credential.type === 'api-key') {
    const principal = directory.principalOfApiKey(credential.value)
    if (principal === null) throw new AuthRefusal(invalidToken(directory, endpoint, 'unknown API key'), 'unknown API key', 'api-key')
    return principal
  }
  if (jwt === undefined) throw new AuthRefusal(invalidToken(directory, endpoint, 'no JWT issuer is configured'), 'jwt without issuers', 'jwt')
  const { tenant, subject } = await jwt(credential.value, endpoint, heldOnly)
  return principalOf(tenant, subject, 'jwt')
}
