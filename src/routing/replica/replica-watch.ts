// The watch over what another replica's loss (or the store's) leaves this one waiting for
// (docs/architecture.md, "Owner loss (routed)"): this replica's heartbeat, and the upkeep of its
// leases. The router dispatches by those leases; this module keeps them current and acts when
// one is lost.
//
// - The heartbeat (a third of its TTL apart) tells the others this replica is alive, then looks at
//   the requests its POST streams wait for: a replica that served some of them and is gone never
//   answers them, so they are delivered again where the session's kind can, or answered -32007.
// - The upkeep tick (a third of a lease apart) renews owner and holder leases and watches the
//   owners of sessions whose streams are held here, acting on an owner found gone as the
//   session's kind says (carry on, take over, or end).
import { GW_ERR_BACKEND_LOST, GW_ERR_STORE_UNAVAILABLE, toJsonRpcError } from '../../core/errors.js'
import type { RequestId } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import { shortHash } from '../../telemetry/logger.js'
import type { UpkeepPass } from '../../telemetry/metrics.js'
import type { Relay } from '../upstream/relay.js'
import type { ReplicaContext } from './context.js'
import { heartbeatTtl, type Ownership } from './ownership.js'
import { APPEND_RETRY_MS, type ClientStreams } from './streams.js'
import { inBatches } from './upkeep.js'

/** What the watch asks of a session's kind (kinds/kind.ts, SessionKind, answers all of it). */
export interface WatchedKind {
  /** Whether the session has an owner replica whose loss ends what it runs. */
  readonly hasOwner: boolean
  /** Whether its sessions hold an owner lease at all, so a stream held here watches that owner. */
  readonly leased: boolean
  /** A replica that served some of the session's requests is gone: settles them. */
  orphansOf: (sid: string, server: string, dead: string, local: Relay | undefined, record: SessionRecord | null) => Promise<void>
  /** A client stream of the session is held here and its owner is alive nowhere. */
  ownerGone: (record: SessionRecord) => Promise<void>
}

export interface ReplicaWatchOptions extends ReplicaContext {
  ownership: Ownership
  streams: ClientStreams
  /** The kind of a server's sessions now (SessionKinds.of: a reload may change it). */
  kindOf: (server: string) => WatchedKind
  /** Answers every request in flight on a lost owner with -32007 (Delivery.failOrphans). */
  failOrphans: (sid: string, server: string, reason: string) => Promise<void>
  /** The session lifecycle's own upkeep, first in every tick (Sessions.sweep). */
  sweepSessions: () => void
  /** Ends a session everywhere (Sessions.end). */
  endSession: (sid: string, reason: string) => Promise<void>
  /** A replica was found gone: what else it ran (hosted tasks) is settled. */
  replicaGone?: (replica: string) => void
}

export class ReplicaWatch {
  readonly #services: ReplicaWatchOptions
  #tick: NodeJS.Timeout | undefined
  /** Whether a tick is running (#onTick). */
  #ticking = false
  /** The server of sessions whose streams are held here, as last read (#watchOwners). */
  readonly #serverOf = new Map<string, string>()
  #beat: NodeJS.Timeout | undefined
  #storeDown = false
  /** When the heartbeat first failed in the outage going on, if one is. */
  #storeDownSince: number | undefined
  /** `<sid> <replica>`: requests of a lost replica being settled now (#onBeat). */
  readonly #adopting = new Set<string>()
  /** Requests answered directly while the store was away: their markers are taken once it is back. */
  #answeredWithoutLog: Array<{ sid: string, streamId: string, id: RequestId }> = []

  constructor (services: ReplicaWatchOptions) {
    this.#services = services
  }

  get #replicaId (): string { return this.#services.replicaId }
  get #leaseMs (): number { return this.#services.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#services.config.sessions.idleTimeoutMs }

  /** The first heartbeat, then the heartbeat and upkeep timers (unref'd: they keep no process up). */
  async start (): Promise<void> {
    const { store, log } = this.#services
    const beatTtl = heartbeatTtl(this.#leaseMs)
    await store.heartbeat(this.#replicaId, beatTtl).catch(() => {})
    const every = Math.max(250, Math.min(5000, Math.floor(this.#leaseMs / 3), Math.floor(this.#idleMs / 4)))
    this.#tick = setInterval(() => { this.#onTick().catch(err => log.warn({ err }, 'router tick failed')) }, every)
    this.#tick.unref()
    let beating = false
    this.#beat = setInterval(() => {
      if (beating) return
      beating = true
      this.#timed('heartbeat', async () => { await this.#onBeat(beatTtl) }).catch(err => log.warn({ err }, 'heartbeat failed')).finally(() => { beating = false })
    }, Math.floor(beatTtl / 3))
    this.#beat.unref()
  }

  stop (): void {
    clearInterval(this.#tick)
    clearInterval(this.#beat)
  }

  /** A session's GET or legacy stream is held here now: its server is known without reading its record. */
  streamHeld (sid: string, server: string): void {
    this.#serverOf.set(sid, server)
  }

  /**
   * Every third of a heartbeat: the heartbeat itself, then the watch over the requests this
   * replica's POST streams wait for. An owner found dead means their answers can never come: they
   * get -32007 now (docs/architecture.md, "Owner loss (routed)"). While the store is unreachable nothing can
   * be appended or read, so every waiting request here is answered directly with an error.
   */
  async #onBeat (ttlMs: number): Promise<void> {
    const { store, log, eventLog, ownership, streams, kindOf } = this.#services
    let beat = true
    await store.heartbeat(this.#replicaId, ttlMs).catch(() => { beat = false })
    if (!beat || !store.isReady()) {
      // A blink, a restart or a failover is a delay: the answers on their way are tried again
      // across the reconnect for as long (ClientStreams, APPEND_RETRY_MS). Only an outage longer
      // than that answers the requests waiting here with an error.
      const since = this.#storeDownSince ??= Date.now()
      if (Date.now() - since < APPEND_RETRY_MS) return
      if (!this.#storeDown) log.warn('session store unreachable; answering waiting requests with an error')
      this.#storeDown = true
      const err = new GW_ERR_STORE_UNAVAILABLE('the session store became unreachable while this request was in flight')
      this.#answeredWithoutLog.push(...streams.failAwaiting(id => toJsonRpcError(err, id)))
      return
    }
    this.#storeDown = false
    this.#storeDownSince = undefined
    // Those requests got their answer: a late one from the backend must not be written after it.
    for (const { sid, streamId, id } of this.#answeredWithoutLog.splice(0)) await eventLog.claim(sid, streamId, id, this.#idleMs).catch(() => {})
    for (const sid of streams.awaitingSessions()) {
      if (ownership.opening(sid) !== undefined) continue
      const local = ownership.local(sid)
      // A relay here of a kind with an owner (routed, aggregate) is the owner: its record is not needed.
      const owned = local !== undefined && kindOf(local.server).hasOwner
      const record = owned ? null : await store.get(sid)
      const server = local?.server ?? record?.server
      if (server === undefined) continue
      // Each marker names the replica that serves its request (the one that took a direct
      // session's POST; a routed session's owner as routed to). Requests served by a replica that
      // is gone died with it, whoever owns the session now: a replica that kept serving a session
      // another one had taken over (its lease not yet found lost) and then died is one case.
      let adopting = false
      /** A replica serving some of these requests still has a heartbeat. */
      let servedByLive = false
      for (const replica of await eventLog.pendingReplicas(sid)) {
        if (replica === this.#replicaId) continue
        if (await store.isAlive(replica)) { servedByLive = true; continue }
        adopting = true
        this.#services.replicaGone?.(replica)
        // Not awaited: it may take the session over and start its backend, which must not hold
        // up this replica's own heartbeat (a beat skipped for that long would look like a death).
        const key = `${sid} ${replica}`
        if (this.#adopting.has(key)) continue
        this.#adopting.add(key)
        kindOf(server).orphansOf(sid, server, replica, local, record)
          .catch(err => log.warn({ err, sid: shortHash(sid) }, 'requests of a lost replica not settled'))
          .finally(() => this.#adopting.delete(key))
      }
      // Settled there, with what the lost replica never handed on delivered again (not failed below).
      if (adopting) continue
      // A routed session whose backend runs here: its answers come from here.
      if (owned) continue
      // Direct and pooled sessions have no owner whose loss ends their requests (pending markers above).
      if (record === null || !kindOf(record.server).hasOwner) continue
      if (ownership.has(sid)) continue
      const owner = await store.getOwner(sid)
      if (owner === this.#replicaId || (owner !== null && await store.isAlive(owner))) continue
      // A lease shorter than a heartbeat (redis.leaseMs under 3 s) lapses before its dead holder
      // is known dead: the replica serving the requests is found gone on a later beat, and what it
      // never handed on is delivered again then (above), not failed now.
      if (owner === null && servedByLive) continue
      await this.#services.failOrphans(sid, record.server, owner === null ? 'owner lease expired' : `replica ${owner} is gone`)
    }
  }

  /**
   * One upkeep tick (a third of a lease apart): owner leases, holder leases, then the watch over
   * sessions whose streams are held here and whose owner is elsewhere. A tick never starts while
   * the last one still runs: two passes at once would only slow each other past the leases.
   */
  async #onTick (): Promise<void> {
    if (this.#ticking) return
    this.#ticking = true
    try {
      await this.#tickOnce()
    } finally {
      this.#ticking = false
    }
  }

  async #tickOnce (): Promise<void> {
    const { ownership, streams, endSession } = this.#services
    this.#services.sweepSessions()
    const { expired, leaseLost } = await this.#timed('owner_leases', async () => await ownership.renew())
    // Idle timeout reached (or deleted elsewhere): stop the backend (idle reaping).
    for (const sid of expired) await endSession(sid, 'idle timeout')
    // Another replica took the session over (it thought this one dead): only the backend stops
    // here; the client's streams held here go on.
    // All at once: each drop takes its relay out at once, then waits for its backend to stop; one
    // after another, the last relays would go on serving sessions owned elsewhere for seconds.
    await Promise.all(leaseLost.map(async sid => {
      const server = ownership.local(sid)?.server ?? '?'
      await ownership.drop(sid, new GW_ERR_BACKEND_LOST(server, 'another replica took the session over'))
    }))
    const held = await this.#timed('stream_leases', async () => await streams.renew())
    await this.#timed('owner_watch', async () => { await this.#watchOwners(held) })
  }

  /**
   * Sessions whose streams are held here and whose backend runs elsewhere: an owner found gone is
   * acted on. Pooled sessions have no owner: known by their server (learnt once per session, and
   * never stored: a reload may change a server's mode), they cost nothing here.
   */
  async #watchOwners (held: Set<string>): Promise<void> {
    const { store, ownership, kindOf } = this.#services
    for (const sid of this.#serverOf.keys()) if (!held.has(sid)) this.#serverOf.delete(sid)
    const watched = [...held].filter(sid => {
      if (ownership.has(sid)) return false
      const server = this.#serverOf.get(sid)
      return server === undefined || kindOf(server).leased
    })
    await inBatches(watched, async batch => {
      const owners = await Promise.all(batch.map(async sid => await store.getOwner(sid)))
      const orphaned: string[] = []
      for (const [i, sid] of batch.entries()) {
        const owner = owners[i] ?? null
        if (owner === null || !await ownership.isAlive(owner)) orphaned.push(sid)
      }
      const records = await Promise.all(orphaned.map(async sid => await store.get(sid)))
      for (const [i, sid] of orphaned.entries()) {
        const record = records[i] ?? null
        if (record === null) continue
        this.#serverOf.set(sid, record.server)
        // Carried on, taken over here, or ended, as its kind says (a pooled session has no owner: nothing was lost).
        await kindOf(record.server).ownerGone(record)
      }
    })
  }

  /**
   * Runs one upkeep pass and records how long it took. A pass longer than a third of the lease
   * (the renewal interval) is logged: leases then lapse between renewals, and only re-claiming
   * keeps them.
   */
  async #timed<T> (pass: UpkeepPass, run: () => Promise<T>): Promise<T> {
    const started = performance.now()
    try {
      return await run()
    } finally {
      const ms = performance.now() - started
      this.#services.metrics.upkeepPass(pass, ms / 1000)
      if (ms > this.#leaseMs / 3) this.#services.log.warn({ pass, ms: Math.round(ms), leaseMs: this.#leaseMs }, 'upkeep pass took longer than a third of the lease')
    }
  }
}
