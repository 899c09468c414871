// What this replica owns: the relays of the backend sessions it runs, and the leases and
// liveness checks that say so to the other replicas (ARCHITECTURE.md sections 1, 5 and 6).
//
// - Routed sessions (stdio, legacy `sse` upstreams): the owner lease says where the backend
//   connection lives; only the owner has a relay. A replica that loses the lease stops its backend.
// - Direct sessions (Streamable HTTP backends): every replica that serves the session opens its
//   own relay to the same backend session; the owner lease means only "listens to the backend's
//   GET stream". A free lease (its holder died) is taken by a replica that still serves the session,
//   which resumes the backend's GET stream from the event id recorded in the session record.
// - Liveness: a replica's heartbeat key; a positive answer is cached for a quarter lease so a
//   forwarded message rarely pays for the check, and a dead owner is still noticed within a lease.
import type { ServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE, type GatewayError } from '../core/errors.js'
import type { SessionRecord } from '../state/session-store.js'
import { shortHash } from '../telemetry/logger.js'
import type { SupervisedHandlers, SupervisedOpenOptions } from '../backends/supervisor.js'
import type { ReplicaContext } from './context.js'
import { capabilitiesOf, Relay, type BackendSessionHandle, type RelayHost } from './relay.js'

/** What ownership needs of the supervisor (src/backends/supervisor.ts implements it). */
export interface BackendPool {
  open (sid: string, server: string, handlers: SupervisedHandlers, options?: SupervisedOpenOptions): Promise<BackendSessionHandle>
  stop (sid: string): Promise<void>
  stopAll (options?: { detach?: boolean }): Promise<void>
}

export interface OwnershipOptions extends Omit<ReplicaContext, 'eventLog' | 'bus'> {
  backends: BackendPool
  /** What relays append to and how they end a session. */
  host: RelayHost
}

export class Ownership {
  readonly #o: OwnershipOptions
  readonly #relays = new Map<string, Relay>()
  readonly #opening = new Map<string, Promise<Relay>>()
  /** Replica liveness seen recently (replica -> until), so a forwarded message skips the check. */
  readonly #aliveUntil = new Map<string, number>()

  constructor (options: OwnershipOptions) {
    this.#o = options
  }

  get #leaseMs (): number { return this.#o.config.redis?.leaseMs ?? 10_000 }

  /** The relay of a session whose backend connection lives here. */
  local (sid: string): Relay | undefined {
    return this.#relays.get(sid)
  }

  has (sid: string): boolean {
    return this.#relays.has(sid)
  }

  /** Streamable HTTP backends are shared by the replicas that serve the session (see the header). */
  isDirect (server: string): boolean {
    return this.#o.config.servers[server]?.transport === 'streamable-http'
  }

  /** Replica liveness, cached for a quarter lease: a dead owner is still noticed within a lease. */
  async isAlive (replica: string): Promise<boolean> {
    const now = Date.now()
    if ((this.#aliveUntil.get(replica) ?? 0) > now) return true
    const alive = await this.#o.store.isAlive(replica)
    if (alive) this.#aliveUntil.set(replica, now + this.#leaseMs / 4)
    else this.#aliveUntil.delete(replica)
    return alive
  }

  /** Claims the owner lease of a new session (its creator owns it). */
  async claimNew (sid: string): Promise<void> {
    await this.#o.store.claimOwner(sid, this.#o.replicaId, this.#leaseMs)
  }

  /** Opens this replica's own connection to a direct session's backend session (deduplicated). */
  async openDirect (record: SessionRecord): Promise<Relay> {
    const existing = this.#relays.get(record.id)
    if (existing !== undefined) return existing
    let opening = this.#opening.get(record.id)
    if (opening === undefined) {
      opening = (async () => {
        const relay = await this.open(record, undefined, false)
        await this.claimLease(relay)
        return relay
      })().finally(() => this.#opening.delete(record.id))
      this.#opening.set(record.id, opening)
    }
    return await opening
  }

  /** Takes the owner lease of a direct session if it is free, and then listens to the backend. */
  async claimLease (relay: Relay): Promise<void> {
    if (relay.isOwner) return
    const owner = await this.#o.store.claimOwner(relay.sid, this.#o.replicaId, this.#leaseMs)
    if (owner === this.#o.replicaId) {
      relay.isOwner = true
      const record = await this.#o.store.get(relay.sid)
      relay.backend?.setListening(true, record?.backendGetEventId ?? null)
      relay.log.info('took the backend GET-stream lease')
    }
  }

  /** Opens the backend connection of a session on this replica and registers its relay. */
  async open (record: SessionRecord, forwardedHeaders?: Record<string, string>, isOwner = true): Promise<Relay> {
    const direct = this.isDirect(record.server)
    const server = this.#serverConfig(record.server)
    const store = this.#o.store
    const relay = new Relay({
      sid: record.id,
      server: record.server,
      legacy: record.transport === 'legacy',
      direct,
      isOwner,
      protocolVersion: record.protocolVersion,
      clientCapabilities: capabilitiesOf(record.initializeParams),
      requestTimeoutMs: server.requestTimeoutMs,
      clientRequestTimeoutMs: this.#o.config.sessions.clientRequestTimeoutMs,
      cancelOnTimeout: server.transport === 'stdio',
      host: this.#o.host,
      log: this.#o.log.child({ sid: shortHash(record.id), backend: record.server })
    })
    this.#relays.set(record.id, relay)
    const log = relay.log
    const storeUpdate = (patch: Partial<SessionRecord>, what: string): void => {
      store.update(record.id, patch).catch(err => log.warn({ err }, `${what} not stored`))
    }
    try {
      relay.backend = await this.#o.backends.open(record.id, record.server, {
        onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'backend message not routed')) },
        onRestarting: info => {
          log.warn({ reason: info.reason, attempt: info.attempt, delayMs: info.delayMs }, 'backend restarting')
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(relay.server, `backend stopped (${info.reason}); restarting`))
        },
        onGone: reason => {
          log.warn({ reason }, 'backend gone; ending session')
          relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(relay.server, reason))
          this.#o.host.endSession(relay.sid, reason).catch(err => log.error({ err }, 'session end failed'))
        }
      }, {
        backendSessionId: record.backendSessionId,
        // A resumed HTTP backend session speaks the version its backend negotiated (G-1, H-PV-1).
        protocolVersion: record.backendProtocolVersion ?? record.protocolVersion,
        initializeParams: record.initializeParams,
        ...(forwardedHeaders !== undefined ? { forwardedHeaders } : {}),
        ...(direct ? { listen: isOwner, getStreamLastEventId: record.backendGetEventId ?? null } : {}),
        // HTTP backends: any replica that takes the session over resumes this backend session.
        // On a new backend session (first initialize, or a re-initialise after a 404) the old GET
        // stream position means nothing for it.
        onBackendSessionId: backendSessionId => { storeUpdate({ backendSessionId, backendGetEventId: null }, 'backend session id') },
        onBackendProtocolVersion: backendProtocolVersion => { storeUpdate({ backendProtocolVersion }, 'backend protocol version') },
        // The replica that takes the GET lease over resumes the backend's stream from here, so
        // nothing the backend sent meanwhile is lost (it replays, if it keeps an event store).
        ...(direct ? { onGetStreamEventId: (backendGetEventId: string) => { storeUpdate({ backendGetEventId }, 'backend GET event id') } } : {})
      })
    } catch (err) {
      this.#relays.delete(record.id)
      throw err
    }
    return relay
  }

  /** Forgets a session's relay: its requests in flight get `err`, its backend stops. */
  async drop (sid: string, err: GatewayError): Promise<boolean> {
    const relay = this.#relays.get(sid)
    if (relay === undefined) return false
    this.#relays.delete(sid)
    relay.failAll(err)
    await this.#o.backends.stop(sid)
    return true
  }

  /**
   * Lease upkeep for every relay here (a third of a lease apart). Returns the sessions whose
   * record is gone (idle timeout, or deleted elsewhere) and those whose owner lease was lost.
   */
  async renew (): Promise<{ expired: string[], leaseLost: string[] }> {
    const store = this.#o.store
    const replicaId = this.#o.replicaId
    const expired: string[] = []
    const leaseLost: string[] = []
    for (const relay of [...this.#relays.values()]) {
      const [alive, leased] = await Promise.all([
        store.get(relay.sid).then(r => r !== null),
        relay.isOwner ? store.renewOwner(relay.sid, replicaId, this.#leaseMs) : Promise.resolve(false)
      ])
      if (!alive) {
        expired.push(relay.sid)
      } else if (relay.direct) {
        if (relay.isOwner && !leased) {
          relay.isOwner = false
          relay.backend?.setListening(false)
          relay.log.warn('backend GET-stream lease lost; no longer listening')
        }
        // A free lease (its holder died) is taken by a replica that still serves the session.
        if (!relay.isOwner) await this.claimLease(relay)
        // The holder keeps its backend GET stream wanted: this re-arms a stream that gave up
        // (e.g. a stale stream of a dead holder answered 409 for a while). A no-op when connected.
        else relay.backend?.setListening(true)
      } else if (!leased) {
        relay.log.warn('owner lease lost; stopping backend')
        leaseLost.push(relay.sid)
      }
    }
    return { expired, leaseLost }
  }

  /** Shutdown: every request in flight is answered, leases released, backends stopped. */
  async stopAll (err: GatewayError): Promise<void> {
    const relays = [...this.#relays.values()]
    for (const relay of relays) relay.failAll(err)
    await Promise.allSettled(relays.map(r => this.#o.store.releaseOwner(r.sid, this.#o.replicaId)))
    this.#relays.clear()
    // With shared sessions (Redis), HTTP backend sessions outlive this replica: another one
    // resumes them. Alone, nothing can resume them, so they are ended (DELETE).
    await this.#o.backends.stopAll({ detach: this.#o.config.redis !== undefined })
  }

  #serverConfig (server: string): ServerConfig & { requestTimeoutMs: number } {
    const config = this.#o.config.servers[server]
    if (config === undefined) throw new Error(`unknown server ${server}`)
    return config
  }
}
