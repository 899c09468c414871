// The session store: session records and the leases that say which replica owns a session's
// backend connection and which holds each client stream (docs/architecture.md).
// Two twins implement it: session-store-memory.ts (single process) and session-store-redis.ts.
import type { KindName } from '../config/server-kind.js'

/** Everything any replica needs to serve a session; never holds a live object. */
export interface SessionRecord {
  id: string
  /** Name of the configured server (backend) this session talks to. */
  server: string
  /** Who created the session ('anonymous' with auth off). Another principal sees 404. */
  principal: string
  /**
   * The creator's tenant (null or absent without tenants): which tenant's upstream headers/env
   * the backend connection gets, on whichever replica opens it. Never a key or a token.
   */
  tenant?: string | null
  /** The creator's subject digest (never the subject): its session quota applies (auth/quotas.ts). */
  subjectDigest?: string
  /** 'streamable' (2025-03-26+, Mcp-Session-Id) or 'legacy' (2024-11-05 HTTP+SSE). */
  transport: 'streamable' | 'legacy'
  /**
   * The kind its server gave sessions when it was created. Never what a message is routed by (the
   * live config decides that); only compared with it: a reload that changed the kind ends the
   * session, whose state was made for the other one. Absent in records of older versions.
   */
  kind?: KindName
  /** Version negotiated with the client (its hop only, G-1). */
  protocolVersion: string
  /** The client's initialize params, re-sent when a backend must be re-initialised. */
  initializeParams: Record<string, unknown> | null
  /** The backend's session id (HTTP backends); never shown to the client. */
  backendSessionId: string | null
  /** Protocol version the backend negotiated (HTTP backends): what resuming replicas send it. */
  backendProtocolVersion?: string | null
  /** Last event id seen on the backend's GET stream (Streamable HTTP): where a new lease holder resumes. */
  backendGetEventId?: string | null
  /**
   * What the client established beyond initialize (routed sessions: stdio, legacy `sse`
   * upstreams), replayed into the backend a replica starts when it takes the session over.
   */
  established?: EstablishedState | null
  createdAt: number
  /**
   * When the client last sent something on the session (ms since the epoch, to within a few
   * seconds; absent: not since it was created). Not moved by stream keep-alives (admin console).
   */
  lastActiveAt?: number
}

/** The session state a client set on its backend, as the supervisor replays it after a restart. */
export interface EstablishedState {
  /** The client sent notifications/initialized. */
  initialized: boolean
  /** Params of the last logging/setLevel. */
  logLevel: Record<string, unknown> | null
  /** URIs subscribed (resources/subscribe) and not unsubscribed. */
  subscriptions: string[]
  /** The protocol version the backend negotiated (a replacement must negotiate the same). */
  backendVersion: string | null
}

/** An entry of the session index (SessionStore.sessionIndex). */
export interface IndexedSession {
  id: string
  /** When the record's idle TTL runs out (ms since the epoch). */
  expiresAt: number
}

/** One client stream this replica holds, in a batch of holder renewals (SessionStore.keepStreams). */
export interface HeldStream {
  sid: string
  streamId: string
  /**
   * Whether the stream has a holder lease to keep. A POST stream whose mark is still on its way
   * has none yet (no other replica can hold it): only its session is kept alive.
   */
  leased: boolean
}

/**
 * What keepStreams found for one stream: `held` (the lease was this replica's and is renewed, or
 * there is none to keep), `reclaimed` (it had lapsed and nobody had taken it: this replica holds
 * it again), `taken` (another replica holds it now) or `gone` (the session no longer exists).
 */
export type StreamKeep = 'held' | 'reclaimed' | 'taken' | 'gone'

/**
 * What keepOwners found for one session: `held` (the owner lease was this replica's and is
 * renewed), `claimed` (it was free and is this replica's now), `taken` (another replica owns
 * it) or `gone` (the session no longer exists).
 */
export type OwnerKeep = 'held' | 'claimed' | 'taken' | 'gone'

/** How many sessions an admin listing reads from the index at most (bounds its cost). */
export const SESSION_INDEX_READ_MAX = 10_000

export interface SessionStore {
  /** Creates the record with a TTL; ids are random, so an existing id is an error. */
  create (record: SessionRecord, ttlMs: number): Promise<void>
  get (sid: string): Promise<SessionRecord | null>
  /** Whether the record is live, without reading it (upkeep of many sessions at once). */
  exists (sid: string): Promise<boolean>
  /** Changes fields of a live record; false (and no write) when it has expired or was deleted. */
  update (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<boolean>
  /** Refreshes the TTL of the record; false when it no longer exists. */
  touch (sid: string, ttlMs: number): Promise<boolean>
  /** Deletes the record, its leases and cursors; true when it existed. */
  delete (sid: string): Promise<boolean>

  /** Takes the owner lease when free; returns the owner after the call. */
  claimOwner (sid: string, replicaId: string, ttlMs: number): Promise<string>
  /**
   * Takes the owner lease from a replica that is gone (`from`), or when free: the takeover after
   * an owner died. Returns the owner after the call (another replica when it won the race).
   */
  takeOwner (sid: string, replicaId: string, from: string | null, ttlMs: number): Promise<string>
  /** Extends the lease if replicaId still holds it. */
  renewOwner (sid: string, replicaId: string, ttlMs: number): Promise<boolean>
  /** Drops the lease only if replicaId holds it. */
  releaseOwner (sid: string, replicaId: string): Promise<void>
  getOwner (sid: string): Promise<string | null>

  /** Makes replicaId the holder of a client stream; returns the previous holder if another replica. */
  claimHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<string | null>
  renewHolder (sid: string, streamId: string, replicaId: string, ttlMs: number): Promise<boolean>
  releaseHolder (sid: string, streamId: string, replicaId: string): Promise<void>
  getHolder (sid: string, streamId: string): Promise<string | null>

  /**
   * Upkeep of the streams this replica holds, a batch in one go (pipelined with Redis, one script
   * per stream: a batch spans sessions, so hash slots): for each, its session's idle TTL is
   * refreshed (`idleMs`) and its holder lease renewed (`leaseMs`), or re-claimed when it lapsed
   * and nobody took it (a busy event loop is no reason to drop a stream). Answers in order.
   */
  keepStreams (streams: readonly HeldStream[], replicaId: string, leaseMs: number, idleMs: number): Promise<StreamKeep[]>
  /**
   * Upkeep of the owner leases of sessions whose backend connection is here, a batch in one go:
   * whether each session still exists (its idle TTL is not refreshed here) and its owner lease,
   * renewed when this replica's, taken when free (lapsed while this replica could not renew it,
   * or its holder died). Answers in order.
   */
  keepOwners (sids: readonly string[], replicaId: string, leaseMs: number): Promise<OwnerKeep[]>

  /** Last entry id written to any connection of a stream, for a GET without Last-Event-ID. */
  setCursor (sid: string, streamId: string, entryId: string, ttlMs: number): Promise<void>
  getCursor (sid: string, streamId: string): Promise<string | null>

  /**
   * 2026-07-28 listen streams: `replicaId` holds some for `topic` (a server and tenant) until
   * `ttlMs` from now (renewed while it does), so a backend notification seen on another replica
   * reaches them (docs/architecture.md).
   */
  addListener (topic: string, replicaId: string, ttlMs: number): Promise<void>
  /** The replicas holding listen streams of a topic now. */
  listeners (topic: string): Promise<string[]>

  /**
   * The live sessions, most recently active first (at most `limit`): the admin API's index.
   * Kept by create, touch and delete, so it costs no write of its own on the hot path;
   * `expiresAt` is when the record's idle TTL runs out (last activity = expiresAt - idle timeout,
   * to within the touch interval). An entry whose TTL has run out is dropped, never returned.
   */
  sessionIndex (limit: number): Promise<IndexedSession[]>

  /** A replica's summary for the admin API (JSON text), kept `ttlMs` (republished with its heartbeat). */
  publishSummary (replicaId: string, summary: string, ttlMs: number): Promise<void>
  /** Every replica's current summary (JSON text), in no particular order. */
  summaries (): Promise<string[]>

  /** This replica's liveness: a key with a TTL. */
  heartbeat (replicaId: string, ttlMs: number): Promise<void>
  isAlive (replicaId: string): Promise<boolean>
  /** False while the backing service is unreachable (for /readyz and 503s). */
  isReady (): boolean
  close (): Promise<void>
}
