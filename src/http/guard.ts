// DNS-rebinding protection and CORS for every MCP endpoint (H-EP-2..4, S-4): a present
// Origin must be allowed (403 otherwise); the Host header must be allowed too when the gateway
// listens on loopback (the SDK's localhost host validation). CORS and the Origin check use the
// same allow-list so they can never disagree.
import { isIP } from 'node:net'
import cors from '@fastify/cors'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Config } from '../config/schema.js'
import { GW_ERR_FORBIDDEN } from '../core/errors.js'
import { isLoopbackAddress } from '../core/loopback.js'


export interface HttpGuardOptions {
  config: Readonly<Config>
}

function hostName (hostHeader: string): string {
  // "[::1]:8080" -> "[::1]", "localhost:8080" -> "localhost"
  if (hostHeader.startsWith('[')) return hostHeader.slice(0, hostHeader.indexOf(']') + 1).toLowerCase()
  return (hostHeader.split(':')[0] ?? '').toLowerCase()
}

/**
 * A scrape of /metrics addressed to an IP literal (Prometheus scraping a pod's address): exempt from
 * http.allowedHosts, which names the public host clients use. DNS rebinding, which the Host check
 * stops, always arrives with a name, never an address; /metrics keeps its own token.
 */
function isScrapeByAddress (url: string, host: string | undefined): boolean {
  if (host === undefined || !(url === '/metrics' || url.startsWith('/metrics?'))) return false
  const name = hostName(host)
  return isIP(name.startsWith('[') ? name.slice(1, -1) : name) !== 0
}

export function makeOriginCheck (config: Readonly<Config>): (origin: string) => boolean {
  const allowed = new Set(config.http.allowedOrigins.map(o => o.toLowerCase().replace(/\/$/, '')))
  return origin => {
    const normalised = origin.toLowerCase().replace(/\/$/, '')
    if (allowed.size > 0) return allowed.has(normalised) || allowed.has('*')
    try {
      const url = new URL(normalised)
      return (url.protocol === 'http:' || url.protocol === 'https:') && isLoopbackAddress(url.hostname)
    } catch {
      return false
    }
  }
}

/** Whether an Origin names the host the request was sent to (the page came from this gateway). */
function sameOrigin (origin: string, host: string | undefined): boolean {
  if (host === undefined) return false
  try {
    return new URL(origin).host.toLowerCase() === host.toLowerCase()
  } catch {
    return false
  }
}

export function makeHostCheck (config: Readonly<Config>): (host: string | undefined) => boolean {
  const allowed = new Set(config.http.allowedHosts.map(h => h.toLowerCase()))
  const loopbackOnly = allowed.size === 0 && isLoopbackAddress(config.listen.host)
  return host => {
    if (allowed.size === 0 && !loopbackOnly) return true
    if (host === undefined) return false
    const name = hostName(host)
    if (allowed.size > 0) return allowed.has(name) || allowed.has(host.toLowerCase())
    return isLoopbackAddress(name)
  }
}

export default fp<HttpGuardOptions>(async function httpGuard (app: FastifyInstance, opts) {
  const originAllowed = makeOriginCheck(opts.config)
  const hostAllowed = makeHostCheck(opts.config)
  await app.register(cors, {
    origin: (origin, cb) => { cb(null, origin === undefined ? false : originAllowed(origin)) },
    methods: ['GET', 'POST', 'DELETE', 'OPTIONS'],
    allowedHeaders: ['Content-Type', 'Accept', 'Authorization', 'X-API-Key', 'Mcp-Session-Id', 'MCP-Protocol-Version', 'Last-Event-ID', 'Mcp-Method', 'Mcp-Name'],
    exposedHeaders: ['Mcp-Session-Id', 'WWW-Authenticate'],
    maxAge: 600
  })
  // The last Host header allowed: a client sends the same one on every request, so the parse and
  // the loopback check run once per new value, not per request.
  let lastAllowedHost: string | undefined
  app.addHook('onRequest', (req: FastifyRequest, _reply, done) => {
    if (req.url.startsWith('/healthz') || req.url.startsWith('/readyz')) { done(); return }
    const host = req.headers.host
    if ((host !== lastAllowedHost || host === undefined) && !isScrapeByAddress(req.url, host)) {
      if (!hostAllowed(host)) { done(new GW_ERR_FORBIDDEN('Host header not allowed')); return }
      lastAllowedHost = host
    }
    const origin = req.headers.origin
    // The console calls the admin API from the gateway's own origin; the API wants a bearer
    // token, so a page elsewhere gains nothing from the browser's ambient credentials.
    if (origin !== undefined && !originAllowed(origin) && !(req.url.startsWith('/admin') && sameOrigin(origin, host))) { done(new GW_ERR_FORBIDDEN('Origin not allowed')); return }
    done()
  })
}, { name: 'gateway-http-guard', fastify: '5.x' })
