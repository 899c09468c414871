// Session lifecycle (docs/architecture.md, "Flows"): create, look up (principal-checked), update,
// touch (idle timeout) and end, on this replica and, through the bus, on the others.
import { randomBytes } from 'node:crypto'
import { GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_SHUTTING_DOWN } from '../core/errors.js'
import type { Envelope } from '../state/bus.js'
import { GET_STREAM } from '../state/event-log.js'
import type { SessionRecord } from '../state/session-store.js'
import type { ReplicaContext } from './replica/context.js'
import type { Ownership } from './replica/ownership.js'
import type { PooledSessions } from './kinds/pooled-sessions.js'
import type { SessionKinds } from './kinds/kinds.js'
import { capabilitiesOf } from './upstream/relay.js'
import type { ClientStreams } from './replica/streams.js'
import { principalOfRecord } from '../auth/principal.js'
import { audit } from '../telemetry/audit.js'
import { shortHash } from '../telemetry/logger.js'
import { deepFreeze } from '../core/freeze.js'

const SESSION_ID = /^[A-Za-z0-9_-]{16,64}$/
/** A session's last-active time is written at most this often (the console shows it in seconds). */
const ACTIVE_MARK_MS = 5000

export function isValidSessionId (sid: string): boolean {
  return SESSION_ID.test(sid)
}

export type NewSession = Omit<SessionRecord, 'id' | 'createdAt' | 'backendSessionId'>

export interface SessionsOptions extends ReplicaContext {
  ownership: Ownership
  /** What each kind of session holds here (kinds/). */
  kinds: SessionKinds
  /** Pooled sessions' calls running here, ended with the session (docs/architecture.md, "A pooled call"). */
  pooled: PooledSessions
  streams: ClientStreams
  /** Whether the replica is stopping (no new sessions then). */
  stopping: () => boolean
  /** Session quotas (auth/quotas.ts): takes a slot for a new record or throws 429. */
  admit?: (record: SessionRecord) => Promise<void>
  /** The session's record was deleted here (once per session): what is kept beside it goes too. */
  ended?: (sid: string) => void
}

export class Sessions {
  readonly #services: SessionsOptions
  /** When each session's TTL was last refreshed from here. */
  readonly #lastTouch = new Map<string, number>()
  /** When each session's last-active time was last written (touch). */
  readonly #lastActive = new Map<string, number>()
  /**
   * Redis mode: the records of routed Streamable HTTP sessions whose backend runs here, as last
   * read. What a POST needs of them (server, principal, transport, version, tenant) never changes
   * once created, and whether the session still exists is asked alongside its requests (an
   * EXISTS that travels with them, or the marking script: ClientStreams.openPost; a session found
   * gone is refused with 404), so such a POST waits for no read first: a read before every call
   * was a Redis round trip on the request path.
   */
  readonly #owned = new Map<string, SessionRecord>()

  constructor (options: SessionsOptions) {
    this.#services = options
  }

  get #idleMs (): number { return this.#services.config.sessions.idleTimeoutMs }

  /** Creates a session owned by this replica and starts its backend connection. */
  async create (input: NewSession, forwardedHeaders?: Record<string, string>): Promise<SessionRecord> {
    if (this.#services.stopping()) throw new GW_ERR_SHUTTING_DOWN()
    // The initialize params are frozen, not copied: the relay, the backend's replay and the memory
    // store then share one object nobody can change (heap per idle session).
    const record: SessionRecord = {
      ...input,
      initializeParams: deepFreeze(input.initializeParams),
      id: randomBytes(24).toString('base64url'),
      kind: this.#services.kinds.of(input.server).name,
      backendSessionId: null,
      createdAt: Date.now()
    }
    await this.#services.store.create(record, this.#idleMs)
    // The quota slot is taken once the record exists (quotas.ts prunes slots whose record is gone).
    if (this.#services.admit !== undefined) {
      try {
        await this.#services.admit(record)
      } catch (err) {
        await this.#services.store.delete(record.id).catch(() => {})
        throw err
      }
    }
    try {
      await this.#services.kinds.of(record.server).open(record, forwardedHeaders)
    } catch (err) {
      await this.#services.store.delete(record.id).catch(() => {})
      throw err
    }
    audit(this.#services.log, 'session.created', { ...principalOfRecord(record), server: record.server, transport: record.transport, session: shortHash(record.id) })
    return record
  }

  /**
   * The session if it exists and belongs to this principal; another principal sees none (G-5).
   * `checkedLater`: the caller checks next that the session still exists (when it opens the POST's
   * stream), so a session owned here may be answered from the record read before (#owned).
   */
  async get (sid: string, principal: string, checkedLater = false): Promise<SessionRecord | null> {
    if (!isValidSessionId(sid)) return null
    const owned = checkedLater ? this.#owned.get(sid) : undefined
    if (owned !== undefined && this.#services.ownership.local(sid)?.isOwner === true) {
      if (owned.principal !== principal) return null
      if (this.#kindChanged(owned)) return await this.#endChanged(owned)
      this.touch(sid)
      return owned
    }
    const record = await this.#services.store.get(sid)
    if (record === null || record.principal !== principal) return null
    if (this.#kindChanged(record)) return await this.#endChanged(record)
    this.touch(sid)
    if (this.#services.config.redis !== undefined && this.#services.ownership.local(sid)?.isOwner === true && this.#services.kinds.of(record.server).cachesRecord(record)) {
      this.#owned.set(sid, deepFreeze(record))
    }
    return record
  }

  /**
   * A reload gave the session's server another kind (pooled to dedicated, stdio to HTTP …): what
   * the session holds was made for the old one (a child of its own, or none; a backend session id,
   * or none), so it ends here and its client, told 404, starts a new one of the new kind.
   */
  #kindChanged (record: SessionRecord): boolean {
    return record.kind !== undefined && record.kind !== this.#services.kinds.of(record.server).name
  }

  async #endChanged (record: SessionRecord): Promise<null> {
    await this.end(record.id, `a reload changed the server's sessions from ${record.kind ?? '?'} to ${this.#services.kinds.of(record.server).name}`)
      .catch(err => { this.#services.log.warn({ err }, 'session end failed') })
    return null
  }

  /**
   * Whether get() may have answered for this session from the records read before (#owned)
   * rather than from the store: the caller then still has to ask whether it exists.
   */
  mayBeCached (sid: string): boolean {
    return this.#owned.has(sid)
  }

  async update (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<void> {
    await this.#services.store.update(sid, patch)
    this.#services.ownership.local(sid)?.setClient(
      patch.protocolVersion,
      patch.initializeParams != null ? capabilitiesOf(patch.initializeParams) : undefined
    )
  }

  /** Ends a session everywhere (DELETE, legacy stream closed, backend gone, idle). */
  async end (sid: string, reason: string): Promise<void> {
    const { store, bus, replicaId } = this.#services
    const [record, owner, getHolder] = await Promise.all([
      store.get(sid).catch(() => null),
      store.getOwner(sid).catch(() => null),
      store.getHolder(sid, GET_STREAM).catch(() => null)
    ])
    const existed = await store.delete(sid)
    if (existed) this.#services.ended?.(sid)
    // Once per session: a second end (another replica, a race) finds it deleted. A record that
    // expired (idle timeout) is gone already: then the owner of its backend tells who it was.
    const relay = this.#services.ownership.local(sid)
    if (existed && record !== null) audit(this.#services.log, 'session.ended', { ...principalOfRecord(record), server: record.server, reason, session: shortHash(sid) })
    else if (record === null && relay?.isOwner === true) audit(this.#services.log, 'session.ended', { ...relay.principal, server: relay.server, reason, session: shortHash(sid) })
    await this.#services.eventLog.deleteSession(sid)
    const server = record?.server ?? relay?.server
    const envelope: Envelope = { kind: 'end-session', sid, reason, server }
    for (const replica of new Set([owner, getHolder])) {
      if (replica !== null && replica !== replicaId) await bus.send(replica, envelope).catch(() => {})
    }
    await this.endLocal(sid, reason, server)
  }

  /**
   * Ends what this replica holds of a session: its streams, and its backend if owned here. A
   * request still waiting on a stream here gets its one answer first, an error saying why.
   */
  async endLocal (sid: string, reason: string, server?: string): Promise<void> {
    const relay = this.#services.ownership.local(sid)
    const err = new GW_ERR_BACKEND_UNAVAILABLE(server ?? relay?.server ?? '?', `session ended: ${reason}`)
    this.#services.streams.endSession(sid, err)
    this.#services.pooled.endLocal(sid, err)
    this.#lastTouch.delete(sid)
    this.#lastActive.delete(sid)
    this.#owned.delete(sid)
    if (await this.#services.ownership.drop(sid, err)) {
      relay?.log.info({ reason }, 'session ended')
    }
  }

  /**
   * The client sent something: refreshes the session TTL, at most every tenth of the idle timeout
   * (saves store round trips), and its last-active time, at most every ACTIVE_MARK_MS. An open
   * stream's keep-alive refreshes the TTL elsewhere (streams.ts) and is no client activity.
   */
  touch (sid: string): void {
    const now = Date.now()
    if (now - (this.#lastActive.get(sid) ?? 0) >= ACTIVE_MARK_MS) {
      this.#lastActive.set(sid, now)
      this.#services.store.update(sid, { lastActiveAt: now }).catch(() => {})
    }
    const last = this.#lastTouch.get(sid) ?? 0
    if (now - last < this.#idleMs / 10) return
    this.#lastTouch.set(sid, now)
    this.#services.store.touch(sid, this.#idleMs).catch(() => {})
  }

  /**
   * Forgets touch times older than the idle timeout (their sessions refresh on the next use), and
   * the records of sessions whose backend no longer runs here (a lease lost, a session ended).
   */
  sweep (): void {
    const stale = Date.now() - this.#idleMs
    for (const [sid, at] of this.#lastTouch) if (at < stale) this.#lastTouch.delete(sid)
    for (const [sid, at] of this.#lastActive) if (at < stale) this.#lastActive.delete(sid)
    for (const sid of this.#owned.keys()) if (this.#services.ownership.local(sid)?.isOwner !== true) this.#owned.delete(sid)
  }
}
