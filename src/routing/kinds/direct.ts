// Direct sessions (docs/architecture.md, "Session kinds"): a Streamable HTTP backend session that
// every replica serving the session reaches with its own connection (ids pass through). The owner
// lease means only "listens to the backend's GET stream" (ListenerLease); a free lease is taken by
// a replica that still serves the session, resumed from the event id in the record. Losing a
// replica loses only the requests it was sending.
import { GW_ERR_SESSION_NOT_FOUND } from '../../core/errors.js'
import { cancelledRequestOf, isRequest, type JsonRpcMessage, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import type { Relay } from '../upstream/relay.js'
import type { LeaseFound, RelayLease } from '../replica/ownership.js'
import type { KindName, Route, SessionKind } from './kind.js'
import type { RelayKindOptions } from './routed.js'

export class DirectKind implements SessionKind {
  readonly name: KindName = 'direct'
  readonly hasOwner = false
  readonly leased = true
  readonly #services: RelayKindOptions
  readonly #lease: ListenerLease

  constructor (options: RelayKindOptions) {
    this.#services = options
    this.#lease = new ListenerLease(options)
  }

  async prepare (): Promise<void> {}

  async open (record: SessionRecord, forwardedHeaders?: Record<string, string>): Promise<void> {
    const { ownership } = this.#services
    await ownership.claimNew(record.id)
    await ownership.open(record, { direct: true, isOwner: true, takeOver: false, lease: this.#lease, ...(forwardedHeaders !== undefined ? { forwardedHeaders } : {}) })
  }

  async admit (): Promise<undefined> { return undefined }

  prefetchOwner (): undefined { return undefined }

  /**
   * Its requests leave from here when its backend session exists or its connection is here. One
   * still initialising (no backend session id: a stateless or 2026-07-28 backend, or initialize
   * not done) sends them to its lease holder.
   */
  sendsFromHere (record: SessionRecord): boolean {
    return record.backendSessionId !== null || this.#services.ownership.local(record.id) !== undefined
  }

  release (): void {}

  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, _route: Route | undefined, trace: TraceCarrier | undefined): Promise<void> {
    const { ownership, delivery, store } = this.#services
    const sid = record.id
    const local = ownership.local(sid)
    // Requests are sent from here; notifications go to the lease holder, whose connection saw
    // initialize and runs the backend's GET stream. A cancellation of a request in flight here is
    // handled here: its stream waits on this relay (Relay).
    if (local !== undefined && (local.isOwner || isRequest(message) || cancelsHere(local, message))) { delivery.toRelay(local, message, streamId, trace); return }
    const resumable = record.backendSessionId !== null
    if (isRequest(message) && resumable) {
      delivery.toRelay(await ownership.openDirect(record, this.#lease), message, streamId, trace)
      return
    }
    const owner = await store.getOwner(sid)
    if (owner !== null && owner !== this.#services.replicaId && await ownership.isAlive(owner)) {
      await this.#services.bus.send(owner, { kind: 'deliver', sid, streamId, message, trace })
      return
    }
    if (resumable) {
      // The lease holder is gone but the backend session lives on: take it over here.
      const opened = local ?? await ownership.openDirect(record, this.#lease)
      await ownership.claimLease(opened)
      delivery.toRelay(opened, message, streamId, trace)
      return
    }
    // A session whose first initialize never completed, and its owner is gone.
    await this.#services.endSession(sid, 'owner replica gone')
    throw new GW_ERR_SESSION_NOT_FOUND()
  }

  answer (record: SessionRecord, response: JsonRpcResponse): void {
    const local = this.#services.ownership.local(record.id)
    if (local !== undefined) this.#services.delivery.toRelay(local, response, null)
  }

  listen (): void {}

  /** Every replica sends a direct session's requests itself: those of a lost one died with it (-32007). */
  async orphansOf (sid: string, server: string, dead: string): Promise<void> {
    await this.#services.delivery.failOrphans(sid, server, `replica ${dead} is gone`, dead)
  }

  async ownerGone (record: SessionRecord): Promise<void> {
    const { ownership } = this.#services
    // The backend session outlives the replica: this one, serving the client's stream, takes it over.
    if (record.backendSessionId !== null) await ownership.claimLease(await ownership.openDirect(record, this.#lease))
    else await this.#services.endSession(record.id, 'owner replica gone')
  }

  cachesRecord (): boolean { return false }
}

/**
 * A direct session's owner lease: it says only which replica listens to the backend's GET stream.
 * Losing it stops the listening, not the relay (the replica goes on sending the requests it
 * takes); a free one is taken by a replica that still serves the session.
 */
class ListenerLease implements RelayLease {
  readonly #services: RelayKindOptions

  constructor (services: RelayKindOptions) {
    this.#services = services
  }

  /** This replica holds the lease now: it listens to the backend's GET stream, resumed where the last holder was. */
  async claimed (relay: Relay): Promise<void> {
    relay.isOwner = true
    const record = await this.#services.store.get(relay.sid)
    relay.backend?.setListening(true, record?.backendGetEventId ?? null)
    relay.log.info('took the backend GET-stream lease')
  }

  async renewed (relay: Relay, found: LeaseFound): Promise<undefined> {
    if (found === 'taken') {
      if (relay.isOwner) {
        relay.isOwner = false
        relay.backend?.setListening(false)
        relay.log.warn('backend GET-stream lease lost; no longer listening')
      }
    } else if (!relay.isOwner) {
      // A free lease (its holder died) is taken by a replica that still serves the session.
      await this.claimed(relay)
    } else {
      // The holder keeps its backend GET stream wanted: this re-arms a stream that gave up
      // (e.g. a stale stream of a dead holder answered 409 for a while). A no-op when connected.
      relay.backend?.setListening(true)
    }
    return undefined
  }
}

/** Whether `message` cancels a request in flight on this relay. */
function cancelsHere (relay: Relay, message: JsonRpcMessage): boolean {
  const id = cancelledRequestOf(message)
  return id !== undefined && relay.inFlight(id)
}
