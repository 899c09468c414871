// Request rate limits on the MCP endpoints (docs/authentication.md), before the body is read: every
// request of a tenant's principal on `/mcp/<server>`, `/sse/<server>` and its messages URL is
// charged to the tenant's bucket and its subject's, in one atomic step (auth/rate-limit.ts).
// /healthz, /readyz and anything else outside those routes is never limited; anonymous principals
// and tenants without rate limits pass.
//
// Over the limit: 429 with an integer Retry-After and a JSON-RPC error body. While the limiter's
// Redis is unreachable the request is refused with 503 and Retry-After (fail closed): in Redis
// mode the sessions live in the same Redis, so nothing could be served anyway, and a hosted
// operator would rather shed load for a moment than let a flood through to shared backends the
// instant a budget cannot be checked.
import fp from 'fastify-plugin'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { bucketsFor, retryAfterSeconds, type RateLimiter } from '../auth/rate-limit.js'
import type { ConcurrencyLimiter } from '../auth/concurrency.js'
import type { TenantDirectory } from '../auth/tenants.js'
import { GW_ERR_INVALID_REQUEST, GW_ERR_RATE_LIMITED, isGatewayError, withRetryAfter } from '../core/errors.js'
import { audit } from '../telemetry/audit.js'
import { readableId } from '../core/jsonrpc.js'
import { isMcpRoute } from './authenticate.js'

export interface HttpLimitsOptions {
  /** Read per request, so a replaced tenant table (config reload) applies at once. */
  tenants: Pick<TenantDirectory, 'limits'>
  limiter: RateLimiter
  /** Requests in flight per tenant and subject (limits.concurrentRequests); counted while their POST's response lasts. */
  concurrency: ConcurrencyLimiter
}

/** JSON-RPC requests (id and method) in a parsed body: what a POST asks the backend to answer. */
function requestsIn (body: unknown): number {
  const isRequest = (m: unknown): boolean => typeof m === 'object' && m !== null && 'method' in m && 'id' in m
  if (Array.isArray(body)) return body.filter(isRequest).length
  return isRequest(body) ? 1 : 0
}


/**
 * Charges one request, or, given the size of the batch it carries, the batch's other messages;
 * throws GW_ERR_RATE_LIMITED (429), a 400 for a batch no budget can hold, or a 503 store error.
 * Exported for tests.
 */
export async function chargeRequest (req: FastifyRequest, opts: HttpLimitsOptions, batchSize?: number): Promise<void> {
  const { tenant, subjectDigest } = req.principal
  if (tenant === null) return
  const limits = opts.tenants.limits(tenant)
  if (limits === undefined) return
  const buckets = bucketsFor(limits, subjectDigest)
  if (buckets.length === 0) return
  // A batch beyond a bucket's burst could never be admitted: say so, rather than a 429 whose
  // Retry-After would only invite the same refusal.
  if (batchSize !== undefined) {
    const burst = Math.min(...buckets.map(b => b.burst))
    if (batchSize > burst) throw new GW_ERR_INVALID_REQUEST(`a batch holds at most ${burst} messages under this tenant's rate limit`)
  }
  // The request itself was charged on arrival; the batch's other messages now.
  const cost = batchSize === undefined ? 1 : batchSize - 1
  let decision
  try {
    decision = await opts.limiter.consume(tenant, buckets, cost)
  } catch (err) {
    if (isGatewayError(err)) err.retryAfter ??= 1
    throw err
  }
  if (decision.allowed) return
  const retryAfter = retryAfterSeconds(decision.retryAfterMs)
  audit(req.log, 'request.refused', { tenant, subject: subjectDigest, server: (req.params as { server?: string }).server, method: req.method, status: 429, reason: 'rate limit', retryAfter })
  throw withRetryAfter(new GW_ERR_RATE_LIMITED(retryAfter), retryAfter)
}

async function httpLimits (app: FastifyInstance, opts: HttpLimitsOptions): Promise<void> {
  // onRequest, so a refused request's body is never parsed. It runs after the auth hook's own
  // onRequest (registered before this plugin in app.ts), which sets req.principal.
  // Callback-style hooks: a request nothing is charged for (no tenant, no limits) costs no promise.
  app.addHook('onRequest', (req, _reply, done) => {
    if (req.principal.tenant === null || !isMcpRoute(req.routeOptions.url)) { done(); return }
    chargeRequest(req, opts).then(() => { done() }, done)
  })
  // A JSON-RPC batch is as many requests as it holds messages, or a batch would carry thousands
  // of calls past the budget as one request: its other messages are charged once it is parsed.
  app.addHook('preHandler', (req, reply, done) => {
    if (req.principal.tenant === null || req.method !== 'POST' || !isMcpRoute(req.routeOptions.url)) { done(); return }
    // Requests in flight at once: a slot per request until the POST's response ends (the answers
    // of a Streamable HTTP or 2026-07-28 POST come on it; a legacy messages POST ends at once).
    const count = requestsIn(req.body)
    if (count > 0) {
      const { tenant, subjectDigest } = req.principal
      let release: (() => void) | null
      try {
        release = opts.concurrency.acquire(tenant, subjectDigest, opts.tenants.limits(tenant), count)
      } catch (err) {
        // The refusal answers the request it names (the route has not decoded the body yet).
        if (!Array.isArray(req.body)) req.jsonRpcId = readableId(req.body)
        audit(req.log, 'request.refused', { tenant, subject: subjectDigest, server: (req.params as { server?: string }).server, method: req.method, status: 429, reason: 'concurrent requests' })
        done(err as Error)
        return
      }
      if (release !== null) reply.raw.once('close', release)
    }
    if (!Array.isArray(req.body) || req.body.length <= 1) { done(); return }
    chargeRequest(req, opts, req.body.length).then(() => { done() }, done)
  })
}

export default fp(httpLimits, { name: 'gateway-limits', fastify: '5.x' })
