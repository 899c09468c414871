// Direct sessions (ARCHITECTURE.md flow 7): a Streamable HTTP backend session that every replica
// serving the session reaches with its own connection (ids pass through). The owner lease means
// only "listens to the backend's GET stream"; a free lease is taken by a replica that still serves
// the session, resumed from the event id in the record. Losing a replica loses only the requests
// it was sending.
import { GW_ERR_SESSION_NOT_FOUND } from '../../core/errors.js'
import { cancelledRequestOf, isRequest, type JsonRpcMessage, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import type { Relay } from '../upstream/relay.js'
import type { KindName, Route, SessionKind } from './kind.js'
import type { RelayKindOptions } from './routed.js'

export class DirectKind implements SessionKind {
  readonly name: KindName = 'direct'
  readonly hasOwner = false
  readonly leased = true
  readonly #o: RelayKindOptions

  constructor (options: RelayKindOptions) {
    this.#o = options
  }

  async prepare (): Promise<void> {}

  async open (record: SessionRecord, forwardedHeaders?: Record<string, string>): Promise<void> {
    const { ownership } = this.#o
    await ownership.claimNew(record.id)
    await ownership.open(record, { direct: true, isOwner: true, takeOver: false, ...(forwardedHeaders !== undefined ? { forwardedHeaders } : {}) })
  }

  async admit (): Promise<undefined> { return undefined }

  prefetchOwner (): undefined { return undefined }

  /**
   * Its requests leave from here when its backend session exists or its connection is here. One
   * still initialising (no backend session id: a stateless or 2026-07-28 backend, or initialize
   * not done) sends them to its lease holder.
   */
  sendsFromHere (record: SessionRecord): boolean {
    return record.backendSessionId !== null || this.#o.ownership.local(record.id) !== undefined
  }

  release (): void {}

  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, _route: Route | undefined, trace: TraceCarrier | undefined): Promise<void> {
    const { ownership, delivery, store } = this.#o
    const sid = record.id
    const local = ownership.local(sid)
    // Requests are sent from here; notifications go to the lease holder, whose connection saw
    // initialize and runs the backend's GET stream. A cancellation of a request in flight here is
    // handled here: its stream waits on this relay (Relay, U-CAN-1).
    if (local !== undefined && (local.isOwner || isRequest(message) || cancelsHere(local, message))) { delivery.toRelay(local, message, streamId, trace); return }
    const resumable = record.backendSessionId !== null
    if (isRequest(message) && resumable) {
      delivery.toRelay(await ownership.openDirect(record), message, streamId, trace)
      return
    }
    const owner = await store.getOwner(sid)
    if (owner !== null && owner !== this.#o.replicaId && await ownership.isAlive(owner)) {
      await this.#o.bus.send(owner, { kind: 'deliver', sid, streamId, message, trace })
      return
    }
    if (resumable) {
      // The lease holder is gone but the backend session lives on: take it over here.
      const opened = local ?? await ownership.openDirect(record)
      await ownership.claimLease(opened)
      delivery.toRelay(opened, message, streamId, trace)
      return
    }
    // A session whose first initialize never completed, and its owner is gone.
    await this.#o.endSession(sid, 'owner replica gone')
    throw new GW_ERR_SESSION_NOT_FOUND()
  }

  answer (record: SessionRecord, response: JsonRpcResponse): void {
    const local = this.#o.ownership.local(record.id)
    if (local !== undefined) this.#o.delivery.toRelay(local, response, null)
  }

  listen (): void {}

  /** Every replica sends a direct session's requests itself: those of a lost one died with it (-32007). */
  async orphansOf (sid: string, server: string, dead: string): Promise<void> {
    await this.#o.delivery.failOrphans(sid, server, `replica ${dead} is gone`, dead)
  }

  async ownerGone (record: SessionRecord): Promise<void> {
    const { ownership } = this.#o
    // The backend session outlives the replica: this one, serving the client's stream, takes it over.
    if (record.backendSessionId !== null) await ownership.claimLease(await ownership.openDirect(record))
    else await this.#o.endSession(record.id, 'owner replica gone')
  }

  cachesRecord (): boolean { return false }
}

/** Whether `message` cancels a request in flight on this relay. */
function cancelsHere (relay: Relay, message: JsonRpcMessage): boolean {
  const id = cancelledRequestOf(message)
  return id !== undefined && relay.inFlight(id)
}
