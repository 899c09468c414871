// The HTTP backend factory: picks the transport file for a server's configured transport.
import type { BackendFactory } from './backend.js'
import type { HttpBackendConnection, HttpBackendOpenOptions } from './http-base.js'
import { GW_ERR_CONFIG_INVALID } from '../core/errors.js'
import { LegacySseBackend } from './legacy-sse.js'
import { StreamableHttpBackend } from './streamable-http.js'
import { ModernSessionBackend } from './modern-session.js'
import { configuredEra, eraOf, type BackendEra } from './modern-http.js'
import { upstreamBaseHeaders } from './http-base.js'
import type { HttpServerConfig } from '../config/schema.js'

export type { HttpBackendConnection, HttpBackendOpenOptions } from './http-base.js'
export { closeHttpDispatchers } from './http-io.js'

/**
 * Opens a connection to an HTTP backend ('streamable-http' or 'sse'). Performs no network I/O
 * before it resolves for Streamable HTTP; a legacy 'sse' backend starts its SSE GET at once and
 * queues messages until the `endpoint` event arrives. With `backendSessionId` the connection
 * resumes that backend session (failover) without initialize.
 */
export async function openHttpBackend (options: HttpBackendOpenOptions): Promise<HttpBackendConnection> {
  const config = options.config
  if (config.transport !== 'streamable-http' && config.transport !== 'sse') {
    throw new GW_ERR_CONFIG_INVALID(`server '${options.server}' is not an HTTP backend`)
  }
  if (config.transport === 'sse') return new LegacySseBackend(options, config)
  return await sessionEra(options, config) === 'modern' ? new ModernSessionBackend(options, config) : new StreamableHttpBackend(options, config)
}

/**
 * Which way a client session reaches a Streamable HTTP server: `modern` bridges it to a server that
 * speaks only 2026-07-28 (modern-session.ts). Where `protocol` names no era (configuredEra: `auto`,
 * or no setting) the probe decides (modern-http.ts eraOf, once per server config); a probe that
 * finds nothing (unreachable, 5xx, auth) opens the session the 2025 way, whose own errors then
 * reach the client. A session resumed on another replica (it has a backend session id) is a 2025 one.
 */
async function sessionEra (options: HttpBackendOpenOptions, config: HttpServerConfig): Promise<BackendEra> {
  const configured = configuredEra(config)
  if (configured !== null) return configured
  if (options.backendSessionId != null) return 'legacy'
  try {
    return await eraOf(options.server, config, () => upstreamBaseHeaders(config, options.upstream, options.forwardedHeaders ?? {}))
  } catch {
    return 'legacy'
  }
}

/** The BackendFactory for transports 'streamable-http' and 'sse'. */
export const httpBackendFactory: BackendFactory = async options => await openHttpBackend(options)
