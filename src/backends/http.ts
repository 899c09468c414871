// The HTTP backend factory: picks the transport file for a server's configured transport.
import type { BackendFactory } from './backend.js'
import type { HttpBackendConnection, HttpBackendOpenOptions } from './http-base.js'
import { GW_ERR_CONFIG_INVALID } from '../core/errors.js'
import { LegacySseBackend } from './legacy-sse.js'
import { StreamableHttpBackend } from './streamable-http.js'
import { ModernSessionBackend } from './modern-session.js'

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
  // `protocol: modern`: the server speaks only 2026-07-28, and the client's session is bridged
  // (modern-session.ts). `auto` is probed for 2026-07-28 clients only (http/modern.ts): a session
  // opens as it always did, with no probe on its path, so a dual-era server serves it natively.
  return config.protocol === 'modern' ? new ModernSessionBackend(options, config) : new StreamableHttpBackend(options, config)
}

/** The BackendFactory for transports 'streamable-http' and 'sse'. */
export const httpBackendFactory: BackendFactory = async options => await openHttpBackend(options)
