// What the two granting sources ask of the authorization server (granting-source.ts does the rest).
//
// token-exchange (RFC 8693): the client's verified JWT is the subject token; the answer is a token
// for the backend's audience, filed per (tenant, server, subject, audience) and never used past the
// client's own token. client-credentials (RFC 6749 section 4.4): the gateway's own client, filed
// per (tenant, server, audience), shared by the tenant's users.
import { decodeJwt } from 'jose'
import { GW_ERR_CREDENTIAL_REQUIRED, withData } from '../core/errors.js'
import type { GrantStrategy } from './granting-source.js'
import type { CredentialCaller, CredentialTarget } from './types.js'

const TOKEN_EXCHANGE_GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange'

/** The audience/resource/scope parameters both grants share. */
function targetParameters (target: CredentialTarget): Record<string, string> {
  const c = target.config
  const out: Record<string, string> = {}
  if (c.audience !== undefined) out.audience = c.audience
  if (c.resource !== undefined) out.resource = c.resource
  if (c.scopes.length > 0) out.scope = c.scopes.join(' ')
  return out
}

const audienceOf = (target: CredentialTarget): string | undefined => target.config.audience ?? target.config.resource

export const tokenExchange: GrantStrategy = {
  kind: 'token-exchange',
  grantType: TOKEN_EXCHANGE_GRANT,
  keyOf: (who, target) => ({ tenant: who.tenant, server: target.server, subjectDigest: who.subjectDigest, ...optionalAudience(target) }),
  parameters (who, target) {
    if (who.token === undefined) {
      // Asked without a client request (a GET stream, a resumed stream) or for an API key caller,
      // with no exchanged token cached for this subject.
      throw withData(new GW_ERR_CREDENTIAL_REQUIRED(target.server, 'a token exchange needs the client\'s JWT on the request (an API key cannot be exchanged), and none is cached for this caller'), { server: target.server })
    }
    const out: Record<string, string> = { subject_token: who.token, subject_token_type: target.config.subjectTokenType, ...targetParameters(target) }
    if (target.config.requestedTokenType !== undefined) out.requested_token_type = target.config.requestedTokenType
    return out
  },
  capExpiry (who: CredentialCaller, expiresAt: number): number {
    if (who.token === undefined) return expiresAt
    try {
      const exp = decodeJwt(who.token).exp
      return typeof exp === 'number' ? Math.min(expiresAt, exp * 1000) : expiresAt
    } catch {
      return expiresAt
    }
  }
}

export const clientCredentials: GrantStrategy = {
  kind: 'client-credentials',
  grantType: 'client_credentials',
  keyOf: (who, target) => ({ tenant: who.tenant, server: target.server, subjectDigest: null, ...optionalAudience(target) }),
  parameters: (_who, target) => targetParameters(target)
}

function optionalAudience (target: CredentialTarget): { audience?: string } {
  const audience = audienceOf(target)
  return audience === undefined ? {} : { audience }
}
