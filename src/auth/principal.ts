// Who is calling (docs/architecture.md): every request on an MCP endpoint is resolved into
// a principal before it touches a session. A session belongs to the principal's `key`; any other
// key sees 404. Without tenants everyone is the one anonymous principal.

import { createHash } from 'node:crypto'

export interface Principal {
  /** The tenant's name from config; null when tenants are not configured. */
  tenant: string | null
  /**
   * A digest of the subject (API key id or JWT subject), never the subject itself: this is what
   * logs, Redis and metrics may carry.
   */
  subjectDigest: string
  /** What a session record stores as its owner: tenant and subject digest, or 'anonymous'. */
  key: string
  /** How the credential was presented. */
  via: 'anonymous' | 'api-key' | 'jwt'
}

export const ANONYMOUS_PRINCIPAL: Readonly<Principal> = Object.freeze({
  tenant: null,
  subjectDigest: 'anonymous',
  key: 'anonymous',
  via: 'anonymous'
})

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by the auth hook before any handler runs; anonymous without tenants. */
    principal: Readonly<Principal>
  }
}

/** Tenant and subject digest of a session (audit lines, relays): never the subject itself. */
export function principalOfRecord (record: { tenant?: string | null | undefined, principal: string }): { tenant: string | null, subject: string } {
  return { tenant: record.tenant ?? null, subject: subjectOfKey(record.principal) }
}

/** The subject digest inside a principal key (`<tenant>:<digest>`, or 'anonymous'). */
export function subjectOfKey (key: string): string {
  const colon = key.lastIndexOf(':')
  return colon === -1 ? key : key.slice(colon + 1)
}

/**
 * The principal of an authenticated caller. `subject` names the caller inside its tenant (an API
 * key's id, or a JWT's issuer and subject); only a digest of it leaves this function, so logs,
 * Redis and metrics never hold it. The tenant is part of the digest: the same subject in two
 * tenants is two principals.
 */
export function principalOf (tenant: string, subject: string, via: 'api-key' | 'jwt'): Principal {
  const subjectDigest = createHash('sha256').update(`${tenant}\0${subject}`).digest('hex').slice(0, 32)
  return { tenant, subjectDigest, key: `${tenant}:${subjectDigest}`, via }
}
