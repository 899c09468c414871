// Session kinds (docs/architecture.md, "Session kinds"): what kind of session a message belongs
// to is decided here and nowhere else, once per message, from the live config (never from the
// session record: a reload may change a server's mode). Every kind answers the same operations;
// the router and the session lifecycle call them without asking which kind they hold, as undici's
// Client, Pool and Agent all answer `dispatch()`.
//
// The kinds the code has:
// - routed:    a stdio or legacy-SSE backend connection owned by one replica (routed.ts);
// - aggregate: a routed session whose relay is made of member links (aggregate.ts);
// - direct:    a Streamable HTTP backend session every replica can reach (direct.ts);
// - pooled:    no connection of its own; each request borrows one of the pool (pooled.ts).
// The stateless 2026-07-28 request has no session: what serves it is stateless.ts's to say.
import type { KindName } from '../../config/server-kind.js'
import type { JsonRpcMessage, JsonRpcRequest, JsonRpcResponse } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import type { Relay } from '../upstream/relay.js'
import type { PoolReservations } from './pooled-sessions.js'

export { kindNameOf, serverConfigOf, type KindName } from '../../config/server-kind.js'

/**
 * Where a POST's messages go, as its kind's admit() found before the stream opened: the relay
 * here or the owner replica's id (routed), what the requests reserved of the pool (pooled), or
 * nothing (direct). Opaque to everything but the kind that made it.
 */
export type Route = Relay | string | PoolReservations

export interface SessionKind {
  readonly name: KindName
  /**
   * Whether the session has an owner replica whose loss ends what it runs (routed, aggregate): the
   * heartbeat watch and the console's owner column read it. Direct and pooled sessions have none.
   */
  readonly hasOwner: boolean
  /**
   * Whether its sessions hold an owner lease at all (routed, aggregate: the backend's owner; direct:
   * the backend GET stream's listener), so a stream held here watches for that owner's loss.
   */
  readonly leased: boolean

  /** Before a new session's record is written: may refuse (capacity) or get the backend ready. */
  prepare (server: string, tenant: string | null, subject?: string): Promise<void>
  /** The record is written: starts what the session holds here (its backend connection, or nothing). */
  open (record: SessionRecord, forwardedHeaders?: Record<string, string>): Promise<void>

  /**
   * Before a POST opens its response stream: where its messages go. May refuse (an HTTP error,
   * not an error inside a 200 stream) or reserve what the requests will run on.
   */
  admit (record: SessionRecord, ownerRead: Promise<string | null> | undefined, requests: readonly JsonRpcRequest[]): Promise<Route | undefined>
  /** Starts reading the owner while the caller reads the record (Redis mode); undefined when admit() would not read it. */
  prefetchOwner (sid: string): Promise<string | null> | undefined
  /** Whether a POST's requests leave for the backend from this replica (see ClientStreams.openPost's `mark`). */
  sendsFromHere (record: SessionRecord, route: Route | undefined): boolean
  /** Gives back what admit() reserved and was not used: all of it, or that of one request. */
  release (route: Route | undefined, request?: JsonRpcRequest): void

  /** A client message (not an answer to a server request) for the session's backend. */
  fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, route: Route | undefined, trace: TraceCarrier | undefined): Promise<void>
  /** The client's answer to a server-to-client request asked from this replica. */
  answer (record: SessionRecord, response: JsonRpcResponse): void
  /** The session's GET (or legacy) stream is held here now. */
  listen (record: SessionRecord): void

  /**
   * A replica that served some of the session's requests is gone (found by the POST streams
   * waiting here): those it never handed on are delivered again where the kind can, the rest get -32007.
   */
  orphansOf (sid: string, server: string, dead: string, local: Relay | undefined, record: SessionRecord | null): Promise<void>
  /** A client stream of the session is held here and its owner is alive nowhere: carry on, take over, or end. */
  ownerGone (record: SessionRecord): Promise<void>
  /**
   * Whether Sessions.get may answer from the record it read before: a session whose backend runs
   * here and whose record cannot change under it (routed Streamable HTTP sessions, Redis mode).
   */
  cachesRecord (record: SessionRecord): boolean
}
