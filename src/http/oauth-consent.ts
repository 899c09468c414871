// The two browser routes of the user-authorization source (credentials/user-authorization.ts,
// docs/credentials.md): GET /oauth/consent/<id>, the link a client shows its user, which starts an
// authorization request at the backend's authorization server; and GET /oauth/callback, where
// that server sends the browser back. Either may land on any replica: what they need is in the
// consent store. A state is used once and expires; the callback must come from the browser that
// opened the link (a cookie named after the state, holding a nonce whose digest the state keeps),
// so a callback URL replayed elsewhere files nothing. The pages carry no token and no subject.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { isGatewayError } from '../core/errors.js'
import { audit } from '../telemetry/audit.js'
import { CALLBACK_PATH } from '../credentials/authorization-client.js'
import type { ConsentStore } from '../credentials/consent-store.js'
import { CONSENT_PATH, CONSENT_TTL_MS, type UserAuthorizationSource } from '../credentials/user-authorization.js'

export interface OAuthConsentOptions {
  consents: ConsentStore
  /** The user-authorization source of (tenant, server) under the live config; undefined when there is none now. */
  sourceOf: (tenant: string | null, server: string) => UserAuthorizationSource | undefined
}

const ID = /^[A-Za-z0-9_-]{20,100}$/
const PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

const digestOf = (text: string): string => createHash('sha256').update(text).digest('base64url')
const cookieNameOf = (state: string): string => `mcpgw_consent_${digestOf(state).slice(0, 16)}`

function escapeHtml (text: string): string {
  return text.replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`)
}

function page (reply: FastifyReply, status: number, title: string, text: string): FastifyReply {
  reply.code(status)
  reply.header('content-security-policy', PAGE_CSP)
  reply.header('cache-control', 'no-store')
  reply.header('referrer-policy', 'no-referrer')
  reply.header('x-content-type-options', 'nosniff')
  reply.type('text/html; charset=utf-8')
  return reply.send(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(title)}</title></head><body style="font-family:sans-serif;max-width:40em;margin:3em auto"><h1>${escapeHtml(title)}</h1><p>${escapeHtml(text)}</p></body></html>`)
}

function cookieOf (req: FastifyRequest, name: string): string | undefined {
  const header = req.headers.cookie
  if (typeof header !== 'string') return undefined
  for (const part of header.split(';')) {
    const eq = part.indexOf('=')
    if (eq !== -1 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim()
  }
  return undefined
}

function sameDigest (a: string, b: string): boolean {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}

function failurePage (reply: FastifyReply, err: unknown, server: string): FastifyReply {
  if (isGatewayError(err) && err.code === 'GW_ERR_CREDENTIAL_REFUSED') {
    return page(reply, 400, 'Access not granted', `The authorization server of '${server}' refused to complete the authorization (${String(err.data?.oauthError ?? 'refused')}). Retry the request in your client for a new link.`)
  }
  return page(reply, 502, 'Authorization server unavailable', `The authorization server of '${server}' could not be reached. Retry the request in your client in a moment.`)
}

export default async function httpOAuthConsent (app: FastifyInstance, opts: OAuthConsentOptions): Promise<void> {
  const { consents, sourceOf } = opts

  app.get(`${CONSENT_PATH}:id`, async (req, reply) => {
    const { id } = req.params as { id: string }
    const record = ID.test(id) ? await consents.get(`l.${id}`) : undefined
    if (record?.kind !== 'link' || record.link.expiresAt <= Date.now()) {
      return page(reply, 400, 'Consent link not valid', 'This link has expired or is not valid. Retry the request in your client: it will give you a new link.')
    }
    const { link } = record
    const source = sourceOf(link.tenant, link.server)
    if (source === undefined) return page(reply, 400, 'Consent link not valid', `Server '${link.server}' no longer asks for this consent.`)
    const nonce = randomBytes(24).toString('base64url')
    let url: URL
    try {
      url = await source.begin(link, digestOf(nonce))
    } catch (err) {
      req.log.warn({ server: link.server, code: isGatewayError(err) ? err.code : undefined }, 'consent could not start')
      return failurePage(reply, err, link.server)
    }
    const state = url.searchParams.get('state') ?? ''
    const secure = req.protocol === 'https' ? '; Secure' : ''
    reply.header('set-cookie', `${cookieNameOf(state)}=${nonce}; Path=${CALLBACK_PATH}; Max-Age=${CONSENT_TTL_MS / 1000}; HttpOnly; SameSite=Lax${secure}`)
    reply.header('cache-control', 'no-store')
    reply.header('referrer-policy', 'no-referrer')
    return await reply.redirect(url.href, 302)
  })

  app.get(CALLBACK_PATH, async (req, reply) => {
    const query = req.query as Record<string, unknown>
    const state = typeof query.state === 'string' && ID.test(query.state) ? query.state : undefined
    // Taken at once: a second callback with this state finds nothing, on any replica.
    const record = state === undefined ? undefined : await consents.take(`s.${state}`)
    if (state === undefined || record?.kind !== 'state' || record.pending.expiresAt <= Date.now()) {
      return page(reply, 400, 'Authorization not valid', 'This authorization has expired or was already used. Retry the request in your client for a new link.')
    }
    const { pending } = record
    const name = cookieNameOf(state)
    reply.header('set-cookie', `${name}=; Path=${CALLBACK_PATH}; Max-Age=0; HttpOnly; SameSite=Lax`)
    const nonce = cookieOf(req, name)
    if (nonce === undefined || !sameDigest(digestOf(nonce), pending.browserDigest)) {
      return page(reply, 400, 'Authorization not valid', 'This authorization was started in another browser. Open the link your client gave you in this browser.')
    }
    if (typeof query.error === 'string') {
      audit(req.log, 'credential.consent', { tenant: pending.tenant, subject: pending.subjectDigest, server: pending.server, source: 'user-authorization', outcome: 'refused', oauthError: query.error.slice(0, 64) })
      return page(reply, 400, 'Access not granted', `The authorization server of '${pending.server}' did not grant access (${query.error.slice(0, 64)}). Retry the request in your client to try again.`)
    }
    const source = sourceOf(pending.tenant, pending.server)
    if (source === undefined) return page(reply, 400, 'Authorization not valid', `Server '${pending.server}' no longer asks for this consent.`)
    const callbackUrl = new URL(pending.redirectUri)
    const search = req.url.indexOf('?')
    callbackUrl.search = search === -1 ? '' : req.url.slice(search)
    try {
      await source.complete(pending, state, callbackUrl)
    } catch (err) {
      req.log.warn({ server: pending.server, code: isGatewayError(err) ? err.code : undefined }, 'consent could not complete')
      return failurePage(reply, err, pending.server)
    }
    return page(reply, 200, 'Access granted', `The gateway may now reach '${pending.server}' on your behalf. You can close this page and return to your client.`)
  })
}
