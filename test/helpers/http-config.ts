// The config of a Streamable HTTP server the backend tests open connections to.
import type { HttpServerConfig } from '../../src/config/schema.js'

export function httpConfig (url: string, overrides: Partial<HttpServerConfig> = {}): HttpServerConfig {
  return {
    transport: 'streamable-http',
    url,
    // These tests are about the 2025 transports: no era probe before the session.
    protocol: 'legacy',
    headers: {},
    forwardHeaders: [],
    maxSessions: 100,
    connectTimeoutMs: 2000,
    requestTimeoutMs: 10_000,
    connections: 4,
    reconnect: { maxAttempts: 2, baseDelayMs: 20, maxDelayMs: 200 },
    ...overrides
  }
}
