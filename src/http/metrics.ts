// GET /metrics: this instance's registry in the Prometheus text format (docs/operating.md).
// Registered on the main listener, or on an address of its own (`metrics.listen`, app.ts), never
// under /mcp, so no MCP rate limit or quota applies. With `metrics.token`, a scraper must send
// `Authorization: Bearer <token>`; the comparison is of SHA-256 digests, in constant time.
import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { GW_ERR_METRICS_UNAUTHORIZED } from '../core/errors.js'
import type { GatewayMetrics } from '../telemetry/metrics.js'

export interface HttpMetricsOptions {
  metrics: GatewayMetrics
  token?: string | undefined
}

const digest = (value: string): Buffer => createHash('sha256').update(value).digest()

function bearerOf (req: FastifyRequest): string | null {
  const header = req.headers.authorization
  if (typeof header !== 'string') return null
  const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header)
  return match?.[1] ?? null
}

export default async function httpMetrics (app: FastifyInstance, opts: HttpMetricsOptions): Promise<void> {
  const registry = opts.metrics.registry
  if (registry === null) return
  const expected = opts.token === undefined ? null : digest(opts.token)
  app.get('/metrics', async (req, reply) => {
    if (expected !== null) {
      const presented = bearerOf(req)
      if (presented === null || !timingSafeEqual(digest(presented), expected)) {
        reply.header('www-authenticate', 'Bearer realm="metrics"')
        throw new GW_ERR_METRICS_UNAUTHORIZED()
      }
    }
    reply.type(registry.contentType)
    return await registry.metrics()
  })
}
