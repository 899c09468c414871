// The types the upstream room offers the rooms above it, and what it needs of the layers below:
// the supervisor's connections (backends/) and a tenant's upstream settings.
import type { SupervisedHandlers, SupervisedOpenOptions } from '../../backends/supervisor.js'
import type { TenantUpstream } from '../../backends/backend.js'
import type { CallerCredential } from '../../credentials/types.js'
import type { BackendSessionHandle } from './relay.js'

/**
 * What the upstream connections need of the backend supervisor (src/backends/supervisor.ts
 * implements it): it starts, restarts and stops backend connections. Not a pool: the pool of
 * initialised connections per (server, tenant) is ConnectionPool (pool.ts).
 */
export interface BackendSupervisor {
  open (sid: string, server: string, handlers: SupervisedHandlers, options?: SupervisedOpenOptions): Promise<BackendSessionHandle>
  stop (sid: string): Promise<void>
  stopAll (options?: { detach?: boolean }): Promise<void>
}


/** A tenant's upstream headers/env for a server (auth/tenants.ts). */
export type UpstreamLookup = (tenant: string | null | undefined, server: string) => TenantUpstream

/**
 * The credential a session owner's backend connection carries (credentials/sources.ts), from the
 * record's tenant and subject digest; undefined when the server's credential is static.
 */
export type CredentialLookup = (tenant: string | null | undefined, subjectDigest: string | undefined, server: string) => CallerCredential | undefined

/**
 * The key of what is shared per (server, tenant): a pool's connections, its listen topic, an
 * aggregate's catalogue. NUL cannot occur in a server name or a tenant id, so keys never collide.
 */
export function serverTenantKey (server: string, tenant: string | null | undefined): string {
  return `${server}\0${tenant ?? ''}`
}

/**
 * The key of a pool: per (server, tenant), or per (server, tenant, subject digest) when the server's
 * credential is one user's (a child, a connection, then serves that user only).
 */
export function poolKey (server: string, tenant: string | null, subjectDigest: string | null): string {
  return subjectDigest === null ? serverTenantKey(server, tenant) : `${serverTenantKey(server, tenant)}\0${subjectDigest}`
}
