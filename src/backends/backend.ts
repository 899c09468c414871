// A live connection to one backend MCP server for one client session: a stdio child
// (stdio.ts) or an HTTP upstream session (streamable-http.ts, legacy-sse.ts). The router speaks
// JSON-RPC messages to it; how they travel is the connection's business.
import type { Logger } from 'pino'
import type { JsonRpcMessage } from '../core/jsonrpc.js'
import type { ServerConfig } from '../config/schema.js'
import type { CallerCredential } from '../credentials/types.js'

export interface BackendExit {
  /** Why the connection ended, for logs and the error sent to in-flight requests. */
  reason: string
  code?: number | null
  signal?: string | null
}

export interface BackendHandlers {
  /** A message from the backend (response, notification or server-to-client request). */
  onMessage (message: JsonRpcMessage): void
  /** The connection ended without close() being called. */
  onExit (exit: BackendExit): void
  /** HTTP backends: the backend's own session id, to keep in the session record. */
  onBackendSessionId? (backendSessionId: string | null): void
  /** HTTP backends: the protocol version the backend negotiated, for replicas that resume the session. */
  onBackendProtocolVersion? (version: string): void
  /** Streamable HTTP backends: the id of an event on the backend's GET stream, to resume from after a failover. */
  onGetStreamEventId? (eventId: string): void
}

export interface BackendConnection {
  /** Writes one message; rejects when the connection is closed or the write fails. */
  send (message: JsonRpcMessage): Promise<void>
  /** Stops the connection (stdio: stop ladder; HTTP: DELETE the backend session). */
  close (): Promise<void>
  /** stdio: the child's pid, for logs. */
  readonly pid?: number | undefined
  /**
   * stdio with a credential source: when the credential in the child's environment lapses (epoch
   * ms; null: never). The supervised session replaces the child for the next request after it.
   */
  readonly credentialExpiresAt?: number | null
}

/**
 * What one tenant's sessions of a server add upstream (config `tenants.<t>.servers.<s>.upstream`):
 * headers for HTTP backends, variables for a stdio child. Never anything from the client.
 */
export interface TenantUpstream {
  headers: Readonly<Record<string, string>>
  env: Readonly<Record<string, string>>
}

export interface BackendOpenOptions {
  server: string
  config: ServerConfig
  sid: string
  handlers: BackendHandlers
  log: Logger
  /** HTTP backends: resume this backend session instead of starting one (failover). */
  backendSessionId?: string | null
  /** HTTP backends: the protocol version the client negotiated, for MCP-Protocol-Version. */
  protocolVersion?: string
  /** Streamable HTTP backends: open the backend's GET stream (default true; false on non-lease replicas). */
  listen?: boolean
  /** Streamable HTTP backends: resume the backend's GET stream after this event (failover). */
  getStreamLastEventId?: string | null
  /**
   * HTTP backends: the client's request headers (any case). Only the names listed in the
   * server's `forwardHeaders` are sent upstream; everything else is dropped (A-UP-1).
   */
  forwardedHeaders?: Record<string, string>
  /**
   * HTTP backends: the client's `initialize` params, when resuming a backend session
   * (backendSessionId) on another replica, so a 404 from the backend can still be recovered
   * by re-initialising. A connection that sees the client's initialize remembers it itself.
   */
  initializeParams?: Record<string, unknown>
  /** The session's tenant's upstream values, on top of the server's own headers/env. */
  upstream?: TenantUpstream
  /**
   * The session owner's own credential (credentials/); absent when the server's credential is
   * static. HTTP backends set it on every request over the configured headers; a stdio child gets
   * it in its environment when it starts (stdio-credential.ts).
   */
  credential?: CallerCredential
}

export type BackendFactory = (options: BackendOpenOptions) => Promise<BackendConnection>
