// The auth hook on every MCP route (`/mcp/<server>`, `/sse/<server>` and its messages URL, every
// method): with tenants configured, each request is resolved into a principal before any handler
// reads a session (docs/architecture.md), and a tenant's request for a server not in its list
// is 403. /healthz, /readyz, CORS preflights and unknown paths are not MCP routes and stay open.
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { authenticate, AuthRefusal, type Endpoint, type JwtCheck } from '../auth/authenticate.js'
import type { EndpointKind, TenantDirectory } from '../auth/tenants.js'
import type { AuthFailureBudget } from '../auth/failure-budget.js'
import { GW_ERR_AUTH_THROTTLED, GW_ERR_SERVER_NOT_ALLOWED, GW_ERR_SERVER_NOT_FOUND, withRetryAfter } from '../core/errors.js'
import { audit } from '../telemetry/audit.js'
import type { AddressOf } from './client-address.js'
import type { ServerSource } from '../config/live.js'

export interface HttpAuthenticateOptions {
  tenants: TenantDirectory
  jwt?: JwtCheck
  /** Failed authentication charged per client address; absent: not charged. */
  failures?: AuthFailureBudget
  /** The client's address (http/client-address.ts): the TCP peer's, or what a trusted proxy says. */
  addressOf: AddressOf
  /** The servers configured now (a reload changes them). */
  live: ServerSource
  /**
   * Where a verified JWT is kept for the backend credentials that need it (a token exchange:
   * credentials/caller-tokens.ts); only for the (tenant, server) pairs that `wants`.
   */
  callerTokens?: {
    wants: (tenant: string | null, server: string) => boolean
    remember: (tenant: string | null, subjectDigest: string, token: string) => void
  }
}

/** Route patterns of the MCP endpoints, and which protected resource each belongs to. */
const MCP_ROUTES = new Map<string, EndpointKind>([
  ['/mcp/:server', 'mcp'],
  ['/sse/:server', 'sse'],
  ['/sse/:server/messages', 'sse']
])
const SERVER_NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/

/** Whether a route is one of the MCP endpoints (authenticated here, charged by http/limits.ts). */
export function isMcpRoute (url: string | undefined): boolean {
  return url !== undefined && MCP_ROUTES.has(url)
}

export default fp<HttpAuthenticateOptions>(async function httpAuthenticate (app: FastifyInstance, opts) {
  const { tenants, jwt, failures, addressOf, live, callerTokens } = opts
  app.addHook('onRequest', (req: FastifyRequest, _reply, done) => {
    // Callback-style: with tenants off, a request costs no promise here.
    if (!tenants.enabled) { done(); return }
    const kind = MCP_ROUTES.get(req.routeOptions.url ?? '')
    if (kind === undefined) { done(); return }
    check(req, kind).then(() => { done() }, done)
  })

  async function check (req: FastifyRequest, kind: EndpointKind): Promise<void> {
    const server = (req.params as { server?: string }).server ?? ''
    // A name no server can have is 404 at once: it would otherwise end up in the challenge header.
    if (!SERVER_NAME.test(server)) throw new GW_ERR_SERVER_NOT_FOUND(server.slice(0, 64))
    const endpoint: Endpoint = { kind, server }
    const address = addressOf(req)
    // An address whose budget is spent still gets what verifies from what the gateway holds (a
    // known API key, a JWT signed by a key already fetched): clients behind one proxy or NAT share
    // an address, and one client's failures must not lock the others out. Anything else that
    // presents a credential is 429 without a fetch or a charge, whatever its reason, so the
    // answer tells a guesser nothing a 401 would not.
    const wait = failures?.blocked(address) ?? 0
    let principal
    try {
      principal = await authenticate(req.headers, endpoint, tenants, jwt, wait > 0)
    } catch (err) {
      if (!(err instanceof AuthRefusal)) throw err
      if (wait > 0 && err.via !== 'none') throw throttled(req, server, wait, address)
      audit(req.log, 'request.refused', { server, method: req.method, status: err.error.statusCode, reason: err.reason, via: err.via, address })
      // A credential that failed is charged (no credential at all is discovery's first step, and a
      // 503 is the issuer's fault, not the client's); once the address's budget is spent: 429.
      if (failures !== undefined && err.via !== 'none' && err.error.statusCode === 401) {
        const spent = await failures.charge(address)
        if (spent > 0) throw throttled(req, server, spent, address)
      }
      throw err.error
    }
    // No such server (never configured, or removed by a reload: its sessions ended) is 404 for
    // everyone, as without tenants: the client's cue that the session is gone. Which servers exist
    // is no secret (their OAuth metadata is public); another tenant's server stays 403.
    if (!Object.hasOwn(live.servers, server)) throw new GW_ERR_SERVER_NOT_FOUND(server)
    if (principal.tenant === null || tenants.server(principal.tenant, server) === undefined) {
      audit(req.log, 'request.refused', { tenant: principal.tenant, subject: principal.subjectDigest, server, method: req.method, status: 403, reason: 'server not allowed', address })
      throw new GW_ERR_SERVER_NOT_ALLOWED(server)
    }
    req.principal = principal
    if (principal.via === 'jwt' && callerTokens?.wants(principal.tenant, server) === true) {
      const token = /^Bearer +(\S+)\s*$/i.exec(String(req.headers.authorization ?? ''))?.[1]
      if (token !== undefined) callerTokens.remember(principal.tenant, principal.subjectDigest, token)
    }
  }
}, { name: 'gateway-authenticate', fastify: '5.x' })

function throttled (req: FastifyRequest, server: string, retryAfter: number, address: string): Error {
  audit(req.log, 'request.refused', { server, method: req.method, status: 429, reason: 'failed authentication budget', retryAfter, address })
  return withRetryAfter(new GW_ERR_AUTH_THROTTLED(retryAfter), retryAfter)
}
