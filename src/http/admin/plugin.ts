// The operator's console (`/admin`) and admin API (`/admin/api/…`), docs/console.md. On only with
// `admin.token`; on the main listener, or on an address of its own (`admin.listen`). The API
// wants `Authorization: Bearer <admin token>`, compared as SHA-256 digests in constant time; a
// missing or wrong token is 401 and charged to the address's failed-authentication budget (429
// once spent), like a tenant's bad key. The admin routes are not MCP routes: a tenant's API key or
// JWT is never checked, accepted or forwarded here. The page and its two assets carry no data and
// need no token; they are served with a strict CSP (no inline script or style, same origin only).
import { createHash, timingSafeEqual } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { AuthFailureBudget } from '../../auth/failure-budget.js'
import { GW_ERR_ADMIN_UNAUTHORIZED, GW_ERR_AUTH_THROTTLED, GW_ERR_BAD_REQUEST, GW_ERR_SESSION_NOT_FOUND, withRetryAfter } from '../../core/errors.js'
import { audit } from '../../telemetry/audit.js'
import type { AdminService } from './service.js'
import type { ConsentAdmin } from '../../credentials/consent-admin.js'
import { consentRoutes } from './consents.js'
import type { AddressOf } from '../client-address.js'
import type { Vault } from '../../credentials/types.js'

export interface HttpAdminOptions {
  token: string
  service: AdminService
  failures?: AuthFailureBudget | undefined
  /** The client's address (http/client-address.ts), for the budget and the audit lines. */
  addressOf: AddressOf
  /** Users' consents to user-authorization sources (consents.ts); absent: no such routes. */
  consents?: ConsentAdmin | undefined
  /** The backend tokens at rest (credentials/): listed by tenant, metadata only. */
  vault?: Pick<Vault, 'list'>
}

export const ADMIN_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const ASSETS: Record<string, { file: string, type: string }> = {
  '/admin': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/admin/console.js': { file: 'console.js', type: 'text/javascript; charset=utf-8' },
  '/admin/console.css': { file: 'console.css', type: 'text/css; charset=utf-8' }
}

const digest = (value: string): Buffer => createHash('sha256').update(value).digest()
const DIGEST = /^[A-Za-z0-9_-]{10}$/
const NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/

function bearerOf (req: FastifyRequest): string | null {
  const header = req.headers.authorization
  if (typeof header !== 'string') return null
  const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header)
  return match?.[1] ?? null
}

function securityHeaders (reply: FastifyReply): void {
  reply.header('content-security-policy', ADMIN_CSP)
  reply.header('x-content-type-options', 'nosniff')
  reply.header('referrer-policy', 'no-referrer')
  reply.header('x-frame-options', 'DENY')
}

function optionalName (value: unknown, what: string): string | undefined {
  if (value === undefined || value === '') return undefined
  if (typeof value !== 'string' || !NAME.test(value)) throw new GW_ERR_BAD_REQUEST(`${what} must be a configured name`)
  return value
}

function boundedInt (value: unknown, fallback: number, min: number, max: number): number {
  if (value === undefined || value === '') return fallback
  const n = Number(value)
  if (!Number.isInteger(n) || n < min || n > max) throw new GW_ERR_BAD_REQUEST(`expected an integer from ${min} to ${max}`)
  return n
}

export default async function httpAdmin (app: FastifyInstance, opts: HttpAdminOptions): Promise<void> {
  const { service, failures, addressOf } = opts
  const expected = digest(opts.token)
  // Read once: the console's files are part of the build (dist/src/http/admin/console/).
  const folder = consoleFolder()
  const files = new Map(Object.entries(ASSETS).map(([path, asset]) => [path, { body: readFileSync(new URL(asset.file, folder)), type: asset.type }]))

  for (const [path, asset] of files) {
    app.get(path, async (_req, reply) => {
      securityHeaders(reply)
      reply.header('cache-control', 'no-cache')
      reply.type(asset.type)
      return asset.body
    })
  }
  app.get('/admin/', async (_req, reply) => await reply.redirect('/admin'))

  app.register(async api => {
    api.addHook('onRequest', async (req, reply) => {
      securityHeaders(reply)
      reply.header('cache-control', 'no-store')
      // As on the MCP routes (http/authenticate.ts): the right token passes even from an address
      // whose budget is spent (an operator behind the same proxy as a guesser); a wrong one is
      // then 429 without a charge.
      const address = addressOf(req)
      const wait = failures?.blocked(address) ?? 0
      const presented = bearerOf(req)
      if (presented !== null && timingSafeEqual(digest(presented), expected)) return
      if (wait > 0) throw throttled(req, wait, address)
      audit(req.log, 'request.refused', { route: 'admin', method: req.method, status: 401, reason: presented === null ? 'no admin token' : 'wrong admin token', address })
      const spent = await failures?.charge(address) ?? 0
      if (spent > 0) throw throttled(req, spent, address)
      reply.header('www-authenticate', 'Bearer realm="admin"')
      throw new GW_ERR_ADMIN_UNAUTHORIZED()
    })

    api.get('/overview', async () => await service.overview())
    api.get('/replicas', async () => ({ replicas: (await service.overview()).replicas }))
    api.get('/servers', async () => ({ servers: (await service.overview()).servers }))
    api.get('/tenants', async () => ({ tenants: (await service.overview()).tenants }))
    api.get('/sessions', async req => {
      const q = req.query as Record<string, unknown>
      return await service.sessions({
        tenant: optionalName(q.tenant, 'tenant'),
        server: optionalName(q.server, 'server'),
        offset: boundedInt(q.offset, 0, 0, 1_000_000),
        limit: boundedInt(q.limit, 50, 1, 500)
      })
    })
    api.get('/sessions/:session/tasks', async req => {
      const { session } = req.params as { session: string }
      const found = DIGEST.test(session) ? await service.sessionTasks(session) : null
      if (found === null) throw new GW_ERR_SESSION_NOT_FOUND()
      return found
    })
    api.delete('/sessions/:session', async req => {
      const { session } = req.params as { session: string }
      if (!DIGEST.test(session)) throw new GW_ERR_SESSION_NOT_FOUND()
      const ended = await service.endSession(session)
      audit(req.log, 'admin.action', { action: 'session.end', session, found: ended !== null, tenant: ended?.tenant ?? null, ...(ended !== null ? { server: ended.server } : {}), address: addressOf(req) })
      if (ended === null) throw new GW_ERR_SESSION_NOT_FOUND()
      return { ended: session, ...ended }
    })
    // What the vault holds for a tenant: whose, toward which server and audience, until when, under
    // which key (rotation progress). Never a token.
    api.get('/credentials', async req => {
      const q = req.query as Record<string, unknown>
      const server = optionalName(q.server, 'server')
      const entries = await opts.vault?.list({ tenant: optionalName(q.tenant, 'tenant') ?? null, ...(server === undefined ? {} : { server }) }) ?? []
      return { credentials: entries.map(e => ({ server: e.key.server, subject: e.key.subjectDigest, audience: e.key.audience ?? null, expiresAt: e.expiresAt, keyId: e.keyId })) }
    })
    api.post('/reload', async req => {
      const outcome = await service.reloadAll()
      audit(req.log, 'admin.action', { action: 'config.reload', ok: outcome.local.ok, replicas: outcome.notified.length + 1, address: addressOf(req) })
      return outcome
    })
    if (opts.consents !== undefined) consentRoutes(api, opts.consents, addressOf)
  }, { prefix: '/admin/api' })
}

/**
 * Where the console's files are: next to this module (`npm run build` copies them into dist, the
 * image has them there), else in the source tree of a checkout built with `tsc` alone.
 */
function consoleFolder (): URL {
  const built = new URL('./console/', import.meta.url)
  if (existsSync(new URL('index.html', built))) return built
  return new URL('../../../../src/http/admin/console/', import.meta.url)
}

function throttled (req: FastifyRequest, retryAfter: number, address: string): Error {
  audit(req.log, 'request.refused', { route: 'admin', method: req.method, status: 429, reason: 'failed authentication budget', retryAfter, address })
  return withRetryAfter(new GW_ERR_AUTH_THROTTLED(retryAfter), retryAfter)
}
