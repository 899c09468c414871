// What this replica owns: the relays of the backend sessions it runs, and the leases and
// liveness checks that say so to the other replicas (docs/architecture.md, "Session kinds" and
// "Owner loss (routed)").
//
// - Owner leases: every session with a relay holds one, and its kind says what it means
//   (RelayLease, given when the relay opens). A routed session's says where the backend
//   connection lives; only the owner has a relay, and a replica that loses the lease stops its
//   backend (OWNER_LEASE). A direct session's says only who listens to the backend's GET stream
//   (kinds/direct.ts): every replica that serves the session has its own relay.
// - Liveness: a replica's heartbeat key, short-lived (HEARTBEAT_TTL_MS, refreshed three times
//   within it), so a replica killed without its shutdown path is known dead within seconds, not
//   after a full lease; a positive answer is cached for a third of that.
// - Takeover (routed sessions): when the owner is dead, the next request for the session, on any
//   replica, takes the lease (takeOver), takes what the dead owner never handed on from its inbox
//   (those requests never reached its backend: they are delivered again to the new one),
//   answers the rest of what was in flight on it with -32007 (its pending markers, failOrphans)
//   and starts the backend with the client's replayed initialize, initialized, log level and
//   subscriptions (the supervisor's crash path). What the backend kept in its memory is lost; the
//   client keeps its session, streams and history.
import { filterToolsListOf, type ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { ServerConfig } from '../../config/schema.js'
import { isAggregateConfig } from '../../config/server-kind.js'
import type { ServerSource } from '../../config/live.js'
import { GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_SERVER_NOT_FOUND, type GatewayError } from '../../core/errors.js'
import type { DeliverEnvelope } from '../../state/bus.js'
import type { EstablishedState, OwnerKeep, SessionRecord } from '../../state/session-store.js'
import { lazyChild, shortHash } from '../../telemetry/logger.js'
import type { BackendSupervisor, CredentialLookup, UpstreamLookup } from '../upstream/ports.js'
import type { CallerCredential } from '../../credentials/types.js'
import type { ReplicaContext } from './context.js'
import { principalOfRecord } from '../../auth/principal.js'
import { capabilitiesOf, Relay, type RelayHost } from '../upstream/relay.js'
import { inBatches } from './upkeep.js'

/** How long a replica's heartbeat lives (at most the lease): a killed replica is dead after this. */
const HEARTBEAT_TTL_MS = 3000

export function heartbeatTtl (leaseMs: number): number {
  return Math.min(leaseMs, HEARTBEAT_TTL_MS)
}

export interface OwnershipOptions extends Omit<ReplicaContext, 'eventLog' | 'bus'> {
  backends: BackendSupervisor
  /** The servers as configured now (live reload); config.servers is the boot-time set. */
  live: ServerSource
  /** What relays append to and how they end a session. */
  host: RelayHost
  /** A tenant's upstream headers/env for a server (tenants.ts); none without tenants. */
  upstream?: UpstreamLookup
  /** The session owner's own credential toward the server (credentials/); none when static. */
  credentials?: CredentialLookup
  /** A tenant's tool policy on a server (auth/tool-policy.ts): filters its tools/list answers. */
  toolPolicy?: ToolPolicyLookup
  /**
   * Before a takeover's backend starts: what the lost owner (`from`) never handed on is taken from its
   * inbox and returned (for redeliver); every other request in flight on it gets -32007.
   */
  failOrphans: (sid: string, server: string, reason: string, from: string | null) => Promise<DeliverEnvelope[]>
  /** Hands what failOrphans took to the takeover's relay, or answers its requests with `to.err`. */
  redeliver: (envelopes: DeliverEnvelope[], to: { relay: Relay } | { err: GatewayError }) => void
}

/** What a renewal found of a relay's owner lease, its session still there (SessionStore.keepOwners). */
export type LeaseFound = Exclude<OwnerKeep, 'gone'>

/**
 * What a relay's owner lease means, as its session's kind says (OpenOptions.lease): the lease
 * upkeep (Ownership.renew, claimLease) hands it what it found and does what it answers.
 */
export interface RelayLease {
  /** This replica took the free lease of a relay it serves without holding it (Ownership.claimLease). */
  claimed (relay: Relay): Promise<void>
  /**
   * One renewal's answer for the relay. `lost`: the relay stops here (its session moved);
   * `reclaimed`: a lapsed lease nobody took is this replica's again (logged once per pass).
   */
  renewed (relay: Relay, found: LeaseFound): Promise<'lost' | 'reclaimed' | undefined>
}

/**
 * The lease of the one replica that runs a session's backend connection (routed and aggregate
 * sessions): another replica holding it means the session moved, and the backend here stops.
 */
export const OWNER_LEASE: RelayLease = {
  // An owner's relay holds its lease from the start (isOwner): claimLease never takes it.
  async claimed () {},
  async renewed (relay, found) {
    // A lease that lapsed while this replica could not renew it (its event loop blocked past the
    // lease: a burst of stdio spawns on a loaded machine took 10 s) and that nobody took
    // meanwhile is claimed back: the backend is still here. Only a lease another replica holds
    // means the session moved (a replica taking over claims it atomically, so either it or this
    // claim wins). In one process nobody else can hold it.
    if (found === 'claimed') return 'reclaimed'
    if (found !== 'taken') return undefined
    relay.log.warn('owner lease lost; stopping backend')
    return 'lost'
  }
}

/** How a session's backend connection is opened here (Ownership.open). */
export interface OpenOptions {
  /** A backend session every replica reaches with its own connection (ids pass through; the lease only listens). */
  direct: boolean
  /** Whether this replica holds the owner lease. */
  isOwner: boolean
  /** What the session's owner lease means (its kind's). */
  lease: RelayLease
  /** Resumed with what the client had established (the owner was lost). */
  takeOver: boolean
  /** The client's headers, of which an HTTP backend forwards the configured ones. */
  forwardedHeaders?: Record<string, string>
}


export class Ownership {
  readonly #services: OwnershipOptions
  readonly #relays = new Map<string, Relay>()
  /** What each relay's lease means (OpenOptions.lease); OWNER_LEASE when none was given (register). */
  readonly #leases = new WeakMap<Relay, RelayLease>()
  /** How a relay that is not the supervisor's (an aggregate's) stops, by session. */
  readonly #stops = new Map<string, () => Promise<void>>()
  readonly #opening = new Map<string, Promise<Relay>>()
  /** Replica liveness seen recently (replica -> until), so a forwarded message skips the check. */
  readonly #aliveUntil = new Map<string, number>()

  constructor (options: OwnershipOptions) {
    this.#services = options
  }

  get #leaseMs (): number { return this.#services.config.redis?.leaseMs ?? 10_000 }

  /** The relay of a session whose backend connection lives here. */
  local (sid: string): Relay | undefined {
    return this.#relays.get(sid)
  }

  has (sid: string): boolean {
    return this.#relays.has(sid)
  }

  /** The sessions with a relay here whose server is one of `servers` (live reload). */
  sessionsOf (servers: ReadonlySet<string>): string[] {
    return [...this.#relays.values()].filter(r => servers.has(r.server)).map(r => r.sid)
  }

  /** The store found `replica`'s heartbeat gone: whatever this replica had cached of it is stale now. */
  notAlive (replica: string): void {
    this.#aliveUntil.delete(replica)
  }

  /** Replica liveness, cached for a third of a heartbeat: a dead owner is noticed within seconds. */
  async isAlive (replica: string): Promise<boolean> {
    const now = Date.now()
    if ((this.#aliveUntil.get(replica) ?? 0) > now) return true
    const alive = await this.#services.store.isAlive(replica)
    if (alive) this.#aliveUntil.set(replica, now + heartbeatTtl(this.#leaseMs) / 3)
    else this.#aliveUntil.delete(replica)
    return alive
  }

  /** A takeover or direct open of this session in progress here. */
  opening (sid: string): Promise<Relay> | undefined {
    return this.#opening.get(sid)
  }

  /**
   * The owner of a routed session is gone (`from`, or no lease at all): takes the lease and starts
   * the backend here, resumed with what the client had established. Returns the relay, or the
   * replica that won the race for the lease. Concurrent calls for one session share one attempt.
   * `open` starts the session's relay as its kind does, replayed from the record.
   */
  async takeOver (record: SessionRecord, from: string | null, open: () => Promise<Relay>): Promise<Relay | string> {
    const existing = this.#relays.get(record.id) ?? this.#opening.get(record.id)
    if (existing !== undefined) return await existing
    const { store, replicaId } = this.#services
    const owner = await store.takeOwner(record.id, replicaId, from, this.#leaseMs)
    if (owner !== replicaId) return owner
    const again = this.#relays.get(record.id) ?? this.#opening.get(record.id)
    if (again !== undefined) return await again
    const opening = (async () => {
      // What the lost owner had in flight is answered first: its answers can no longer come.
      // What it never handed on goes to the new backend, before anything sent to it meanwhile.
      const unread = await this.#services.failOrphans(record.id, record.server, from === null ? 'owner lease expired' : `replica ${from} is gone`, from)
      try {
        const relay = await open()
        relay.log.warn({ from, redelivered: unread.length }, 'took over a session whose owner replica is gone; backend restarted and re-initialised')
        this.#services.redeliver(unread, { relay })
        return relay
      } catch (err) {
        await store.releaseOwner(record.id, replicaId).catch(() => {})
        this.#services.redeliver(unread, { err: new GW_ERR_BACKEND_UNAVAILABLE(record.server, `the takeover could not start it (${err instanceof Error ? err.message : String(err)})`) })
        throw err
      }
    })().finally(() => this.#opening.delete(record.id))
    this.#opening.set(record.id, opening)
    return await opening
  }

  /** Claims the owner lease of a new session (its creator owns it). */
  async claimNew (sid: string): Promise<void> {
    await this.#services.store.claimOwner(sid, this.#services.replicaId, this.#leaseMs)
  }

  /**
   * Opens this replica's own connection to a backend session other replicas reach too
   * (deduplicated), and takes its lease if it is free (`lease`: what that lease means).
   */
  async openDirect (record: SessionRecord, lease: RelayLease): Promise<Relay> {
    const existing = this.#relays.get(record.id)
    if (existing !== undefined) return existing
    let opening = this.#opening.get(record.id)
    if (opening === undefined) {
      opening = (async () => {
        const relay = await this.open(record, { direct: true, isOwner: false, takeOver: false, lease })
        await this.claimLease(relay)
        return relay
      })().finally(() => this.#opening.delete(record.id))
      this.#opening.set(record.id, opening)
    }
    return await opening
  }

  /** Takes the owner lease of a session served here if it is free, and acts as its lease says. */
  async claimLease (relay: Relay): Promise<void> {
    if (relay.isOwner) return
    const owner = await this.#services.store.claimOwner(relay.sid, this.#services.replicaId, this.#leaseMs)
    if (owner === this.#services.replicaId) await this.#leaseOf(relay).claimed(relay)
  }

  #leaseOf (relay: Relay): RelayLease {
    return this.#leases.get(relay) ?? OWNER_LEASE
  }

  /** Opens the backend connection of a session on this replica and registers its relay. */
  async open (record: SessionRecord, { direct, isOwner, takeOver, lease, forwardedHeaders }: OpenOptions): Promise<Relay> {
    const server = this.#serverConfig(record.server)
    if (isAggregateConfig(server)) throw new GW_ERR_BACKEND_UNAVAILABLE(record.server, 'an aggregate has no backend connection of its own')
    const store = this.#services.store
    const policyOf = this.#services.toolPolicy
    // The closures below outlive this call (they are the backend's handlers and the relay's
    // filter): they read these, never `record`, so an idle session does not keep the record (with
    // its initialize params) alive a second time through them (heap per idle session).
    const sid = record.id
    const tenant = record.tenant
    const serverName = record.server
    // Client headers matter only to an HTTP backend that forwards some (`forwardHeaders`); otherwise a
    // supervised session would keep a copy of them for its life.
    const forwards = forwardedHeaders !== undefined && 'forwardHeaders' in server && server.forwardHeaders.length > 0
    const relay = new Relay({
      sid: record.id,
      server: record.server,
      legacy: record.transport === 'legacy',
      direct,
      isOwner,
      protocolVersion: record.protocolVersion,
      clientCapabilities: capabilitiesOf(record.initializeParams),
      requestTimeoutMs: server.requestTimeoutMs,
      metrics: this.#services.metrics.forSession(record.server, record.tenant),
      createdAt: record.createdAt,
      clientRequestTimeoutMs: this.#services.config.sessions.clientRequestTimeoutMs,
      cancelOnTimeout: server.transport === 'stdio',
      backendTransport: server.transport,
      host: this.#services.host,
      principal: principalOfRecord(record),
      log: lazyChild(this.#services.log, { sid: shortHash(record.id), backend: record.server }),
      // Looked up per answer, so a replaced tenant table applies to sessions already open.
      ...(policyOf !== undefined ? { filterResult: (method: string, result: unknown) => method === 'tools/list' ? filterToolsListOf(method, result, policyOf(tenant, serverName)) : result } : {})
    })
    this.#relays.set(record.id, relay)
    this.#leases.set(relay, lease)
    const log = relay.log
    const storeUpdate = (patch: Partial<SessionRecord>, what: string): void => {
      store.update(sid, patch).catch(err => log.warn({ err }, `${what} not stored`))
    }
    try {
      relay.backend = await this.#services.backends.open(record.id, record.server, {
        onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'backend message not routed')) },
        onRestarting: info => {
          log.warn({ reason: info.reason, attempt: info.attempt, delayMs: info.delayMs }, 'backend restarting')
          relay.metrics.childRestarted()
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(relay.server, `backend stopped (${info.reason}); restarting`))
        },
        onGone: reason => {
          log.warn({ reason }, 'backend gone; ending session')
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(relay.server, reason))
          this.#services.host.endSession(relay.sid, reason).catch(err => log.error({ err }, 'session end failed'))
        }
      }, {
        log,
        backendSessionId: record.backendSessionId,
        // A resumed HTTP backend session speaks the version its backend negotiated, not the client's.
        protocolVersion: record.backendProtocolVersion ?? record.protocolVersion,
        initializeParams: record.initializeParams,
        // Looked up from the record, so every replica that opens the session adds the same values.
        ...(this.#services.upstream !== undefined ? { upstream: this.#services.upstream(record.tenant, record.server) } : {}),
        // From the record too: its tenant and subject digest, never a token (the binding finds the
        // caller's newest verified token in this replica's memory, credentials/caller-tokens.ts).
        ...credentialOption(this.#services.credentials?.(record.tenant, record.subjectDigest, record.server)),
        ...(forwards ? { forwardedHeaders } : {}),
        ...(direct ? { listen: isOwner, getStreamLastEventId: record.backendGetEventId ?? null } : {}),
        // HTTP backends: any replica that takes the session over resumes this backend session.
        // On a new backend session (first initialize, or a re-initialise after a 404) the old GET
        // stream position means nothing for it.
        // (A stdio child has neither: no callbacks kept for its whole life.)
        ...(server.transport === 'stdio'
          ? {}
          : {
              onBackendSessionId: (backendSessionId: string | null) => { storeUpdate({ backendSessionId, backendGetEventId: null }, 'backend session id') },
              onBackendProtocolVersion: (backendProtocolVersion: string) => { storeUpdate({ backendProtocolVersion }, 'backend protocol version') }
            }),
        // The replica that takes the GET lease over resumes the backend's stream from here, so
        // nothing the backend sent meanwhile is lost (it replays, if it keeps an event store).
        ...(direct ? { onGetStreamEventId: (backendGetEventId: string) => { storeUpdate({ backendGetEventId }, 'backend GET event id') } } : {}),
        // Routed sessions: a replica that takes the session over replays what the client established.
        ...(direct ? {} : { onEstablished: (established: EstablishedState) => { storeUpdate({ established }, 'established session state') } }),
        ...(takeOver && !direct ? { takeOver: { initializeParams: record.initializeParams ?? {}, established: record.established ?? null } } : {})
      })
    } catch (err) {
      this.#relays.delete(record.id)
      throw err
    }
    return relay
  }

  /** Registers a relay that is not the supervisor's (an aggregate's): `stop` ends what it holds. */
  register (relay: Relay, stop: () => Promise<void>): void {
    this.#relays.set(relay.sid, relay)
    this.#stops.set(relay.sid, stop)
  }

  /** Forgets a relay register() added whose start failed (its own code stops it). */
  forget (relay: Relay): void {
    if (this.#relays.get(relay.sid) !== relay) return
    this.#relays.delete(relay.sid)
    this.#stops.delete(relay.sid)
  }

  /** Forgets a session's relay: its requests in flight get `err`, its backend stops. */
  async drop (sid: string, err: GatewayError): Promise<boolean> {
    const relay = this.#relays.get(sid)
    if (relay === undefined) return false
    this.#relays.delete(sid)
    relay.failAll(err)
    if (relay.isOwner) relay.metrics.sessionEnded(relay.createdAt)
    const stop = this.#stops.get(sid)
    this.#stops.delete(sid)
    if (stop !== undefined) await stop()
    else await this.#services.backends.stop(sid)
    return true
  }

  /** Sessions whose backend connection this replica owns, by server. */
  ownedByServer (): Map<string, number> {
    const counts = new Map<string, number>()
    for (const relay of this.#relays.values()) if (relay.isOwner) counts.set(relay.server, (counts.get(relay.server) ?? 0) + 1)
    return counts
  }

  /**
   * Lease upkeep for every relay here (a third of a lease apart), in batches (SessionStore.keepOwners:
   * one round trip per batch with Redis; upkeep.ts). Returns the sessions whose record is gone
   * (idle timeout, or deleted elsewhere) and those whose owner lease another replica took.
   */
  async renew (): Promise<{ expired: string[], leaseLost: string[] }> {
    const { store, replicaId, log } = this.#services
    const expired: string[] = []
    const leaseLost: string[] = []
    let reclaimed = 0
    await inBatches([...this.#relays.values()], async batch => {
      const kept = await store.keepOwners(batch.map(relay => relay.sid), replicaId, this.#leaseMs)
      for (const [i, relay] of batch.entries()) {
        // Dropped meanwhile (a session ended, a lease lost): nothing of it to keep.
        if (this.#relays.get(relay.sid) !== relay) continue
        // One answer per session asked (keepOwners): a missing one is read as a lease still held.
        const keep = kept[i] ?? 'held'
        if (keep === 'gone') { expired.push(relay.sid); continue }
        const outcome = await this.#leaseOf(relay).renewed(relay, keep)
        if (outcome === 'reclaimed') reclaimed++
        else if (outcome === 'lost') leaseLost.push(relay.sid)
      }
    })
    if (reclaimed > 0) log.warn({ sessions: reclaimed, leaseMs: this.#leaseMs }, 'owner leases had lapsed (the event loop was held past them) and nobody had taken them: claimed back')
    return { expired, leaseLost }
  }

  /** Shutdown: every request in flight is answered, leases released, backends stopped. */
  async stopAll (err: GatewayError): Promise<void> {
    const relays = [...this.#relays.values()]
    for (const relay of relays) relay.failAll(err)
    await Promise.allSettled(relays.map(r => this.#services.store.releaseOwner(r.sid, this.#services.replicaId)))
    this.#relays.clear()
    // An aggregate's member connections are the supervisor's too: stopAll stops them below.
    this.#stops.clear()
    // With shared sessions (Redis), HTTP backend sessions outlive this replica: another one
    // resumes them. Alone, nothing can resume them, so they are ended (DELETE).
    await this.#services.backends.stopAll({ detach: this.#services.config.redis !== undefined })
  }

  #serverConfig (server: string): ServerConfig {
    const servers = this.#services.live.servers
    const config = Object.hasOwn(servers, server) ? servers[server] : undefined
    // Removed by a reload since the session was looked up (live reload): the client sees 404.
    if (config === undefined) throw new GW_ERR_SERVER_NOT_FOUND(server)
    return config
  }
}

function credentialOption (credential: CallerCredential | undefined): { credential?: CallerCredential } {
  return credential === undefined ? {} : { credential }
}
