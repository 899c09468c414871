// What a supervised backend connection offers its owner and what the owner hands it: the types
// the supervisor (supervisor.ts) and each connection (supervised-session.ts) share.
import type { Logger } from 'pino'
import type { JsonRpcMessage } from '../core/jsonrpc.js'
import type { EstablishedState } from '../state/session-store.js'
import type { BackendExit, TenantUpstream } from './backend.js'
import type { CallerCredential } from '../credentials/types.js'

/** What the owner of a session hears from its backend connection. */
export interface SupervisedHandlers {
  /** A message from the backend; never a response to the supervisor's own 'gw-' requests. */
  onMessage (msg: JsonRpcMessage): void
  /** The child died and will be restarted: fail every in-flight request of the session now. */
  onRestarting (info: BackendExit & { attempt: number, delayMs: number }): void
  /** The connection is gone for good (restart cap, HTTP exit, failed re-init): end the session. */
  onGone (reason: string): void
}

/** Options passed through to the backend factory. */
export interface SupervisedOpenOptions {
  /** The session's logger (its bindings name the session); default a child of the supervisor's. */
  log?: Logger
  /** HTTP backends: resume this backend session (failover). */
  backendSessionId?: string | null
  /** HTTP backends: the negotiated protocol version. */
  protocolVersion?: string
  /** HTTP backends: the backend's session id changed; store it in the session record. */
  onBackendSessionId?: (backendSessionId: string | null) => void
  /** HTTP backends: the client's headers, of which only config.forwardHeaders go upstream. */
  forwardedHeaders?: Record<string, string>
  /** HTTP backends: the client's initialize params, to re-initialise a resumed backend session. */
  initializeParams?: Record<string, unknown> | null
  /** Streamable HTTP backends: open the backend's GET stream (only the lease holder does). Default true. */
  listen?: boolean
  /** Streamable HTTP backends: resume the backend's GET stream after this event id (failover). */
  getStreamLastEventId?: string | null
  /** Streamable HTTP backends: every event id seen on the backend's GET stream. */
  onGetStreamEventId?: (eventId: string) => void
  /** HTTP backends: the protocol version the backend negotiated. */
  onBackendProtocolVersion?: (version: string) => void
  /** The session's tenant's upstream headers (HTTP) or env (stdio); kept across restarts. */
  upstream?: TenantUpstream
  /** The session owner's own credential (credentials/): HTTP, on each request; stdio, in each child's environment. */
  credential?: CallerCredential
  /**
   * Take over a session whose backend died with another replica: the new backend is initialised
   * with the client's initialize params and what it had established, before open() resolves
   * (the crash re-initialisation of supervised-session.ts, across replicas).
   */
  takeOver?: { initializeParams: Record<string, unknown>, established: EstablishedState | null }
  /** What the client establishes (initialized, log level, subscriptions), for a replica that takes over. */
  onEstablished?: (state: EstablishedState) => void
}

export interface StopOptions {
  /**
   * Leave HTTP backend sessions alive (no DELETE): on a graceful shutdown with shared sessions,
   * other replicas go on serving them. stdio children are stopped either way.
   */
  detach?: boolean
}

/** One client session's supervised backend connection. */
export interface BackendSession {
  readonly server: string
  readonly sid: string
  /** The current child's pid (stdio), which changes across restarts. */
  readonly pid: number | undefined
  /** Writes to the backend; queued while restarting; rejects with GW_ERR_BACKEND_UNAVAILABLE when it cannot. */
  send (msg: JsonRpcMessage): Promise<void>
  /** Stops the connection; cheap and idempotent. Handlers are not called afterwards. */
  stop (options?: StopOptions): Promise<void>
  /** Streamable HTTP backends: start or stop the backend's GET stream (the lease says who). No-op otherwise. */
  setListening (listening: boolean, fromEventId?: string | null): void
}
