// The admin API's consent routes (docs/credentials.md): GET /admin/api/consents lists the users'
// user-authorization consents (tenant, server, subject digest, expiry, scope, vault key id; never
// a token), DELETE /admin/api/consents/<tenant>/<server>/<subject digest> revokes one. Registered
// inside the admin API's authenticated scope (plugin.ts).
import type { FastifyInstance } from 'fastify'
import { GW_ERR_BAD_REQUEST, GW_ERR_SERVER_NOT_FOUND } from '../../core/errors.js'
import type { ConsentAdmin } from '../../credentials/consent-admin.js'
import { audit } from '../../telemetry/audit.js'
import type { AddressOf } from '../client-address.js'

const NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/
const SUBJECT = /^[A-Za-z0-9_-]{1,128}$/
/** The path segment of the anonymous tenant (a config without tenants). */
const NO_TENANT = '-'

function nameOf (value: unknown, what: string): string | undefined {
  if (value === undefined || value === '') return undefined
  if (typeof value !== 'string' || !NAME.test(value)) throw new GW_ERR_BAD_REQUEST(`${what} must be a configured name`)
  return value
}

export function consentRoutes (api: FastifyInstance, consents: ConsentAdmin, addressOf: AddressOf): void {
  api.get('/consents', async req => {
    const q = req.query as Record<string, unknown>
    return { consents: await consents.list({ tenant: nameOf(q.tenant, 'tenant'), server: nameOf(q.server, 'server') }) }
  })
  api.delete('/consents/:tenant/:server/:subject', async req => {
    const p = req.params as { tenant: string, server: string, subject: string }
    const tenant = p.tenant === NO_TENANT ? null : nameOf(p.tenant, 'tenant') ?? null
    const server = nameOf(p.server, 'server') as string
    if (!SUBJECT.test(p.subject)) throw new GW_ERR_BAD_REQUEST('subject must be a subject digest')
    const outcome = await consents.revoke(tenant, server, p.subject)
    audit(req.log, 'admin.action', { action: 'consent.revoke', tenant, server, subject: p.subject, found: outcome?.found ?? false, address: addressOf(req) })
    if (outcome === undefined) throw new GW_ERR_SERVER_NOT_FOUND(server)
    return { tenant, server, subjectDigest: p.subject, ...outcome }
  })
}
