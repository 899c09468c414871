// Handing client messages to a relay here, and settling the requests of a replica that is gone:
// the mechanics the kinds with a backend connection (routed, aggregate, direct) and the router's
// envelopes share.
import { GW_ERR_BACKEND_LOST, toJsonRpcError, type GatewayError } from '../../core/errors.js'
import { cancelledRequestOf, isRequest, type JsonRpcMessage } from '../../core/jsonrpc.js'
import type { DeliverEnvelope } from '../../state/bus.js'
import { LEGACY_STREAM } from '../../state/event-log.js'
import { shortHash } from '../../telemetry/logger.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import type { ReplicaContext } from '../replica/context.js'
import type { Ownership } from '../replica/ownership.js'
import { capabilitiesOf, type Relay } from '../upstream/relay.js'
import type { ClientStreams } from '../replica/streams.js'

/** How old a pending marker must be before a lost replica's requests are answered -32007 (see failOrphans). */
export const ORPHAN_MIN_AGE_MS = 1000

export interface DeliveryOptions extends ReplicaContext {
  ownership: Ownership
  streams: ClientStreams
  /** Refreshes the session's idle timeout (Sessions.touch). */
  touch: (sid: string) => void
}

export class Delivery {
  readonly #services: DeliveryOptions

  constructor (options: DeliveryOptions) {
    this.#services = options
  }

  /** Hands a client message to the session's relay on this replica. */
  toRelay (relay: Relay, message: JsonRpcMessage, streamId: string | null, trace?: TraceCarrier, holder?: string): void {
    this.#services.touch(relay.sid)
    if (relay.direct && relay.isOwner && this.#services.config.redis !== undefined) {
      const cancelled = cancelledRequestOf(message)
      if (cancelled !== undefined && !relay.inFlight(cancelled)) {
        this.#cancelElsewhere(relay.sid, message).catch(err => this.#services.log.warn({ err, sid: shortHash(relay.sid) }, 'cancellation not passed on'))
      }
    }
    if (isRequest(message) && message.method === 'initialize' && relay.legacy) {
      // A legacy session negotiates on a POST that may have landed on another replica, which
      // stored the outcome: take version and capabilities from the record before forwarding.
      const target = streamId ?? LEGACY_STREAM
      this.#services.store.get(relay.sid).then(record => {
        if (record !== null) relay.setClient(record.protocolVersion, capabilitiesOf(record.initializeParams))
        relay.deliver(message, target, trace, holder)
      }, err => { relay.refuse(message, target, err) })
      return
    }
    relay.deliver(message, streamId, trace, holder)
  }

  /**
   * A direct session's cancellation reached its lease holder, but the request runs on another
   * replica (every replica sends a direct session's requests itself): the replicas its pending
   * markers name get it too, so the one running it settles its stream (its relay tells the
   * backend as well; a second cancellation of one request is ignored). A request not
   * marked (answered as one JSON body so far) is not found: it ends at its deadline.
   */
  async #cancelElsewhere (sid: string, message: JsonRpcMessage): Promise<void> {
    for (const replica of await this.#services.eventLog.pendingReplicas(sid)) {
      if (replica !== this.#services.replicaId && await this.#services.ownership.isAlive(replica)) await this.#services.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
    }
  }

  /** What a lost replica `dead` never handed on of the session's messages, now marked as served by `servedBy`. */
  async takeUnread (dead: string, sid: string, servedBy: string): Promise<DeliverEnvelope[]> {
    const unread = await this.#services.bus.takeUnread(dead, sid, servedBy).catch((err: unknown) => {
      this.#services.log.warn({ err, sid: shortHash(sid) }, 'unread messages of a lost replica not taken; its requests get -32007')
      return []
    })
    if (unread.length > 0) this.#services.log.info({ sid: shortHash(sid), from: dead, to: servedBy, messages: unread.length }, 'messages a lost replica never handed on are delivered again')
    return unread
  }

  /**
   * A takeover here (Ownership.takeOver): what the lost owner `dead` never handed on of the
   * session's messages is taken from its inbox for this replica to deliver again (its markers
   * name this replica now); every other request recorded up to now gets -32007.
   */
  async adoptOrphans (sid: string, server: string, reason: string, dead: string | null): Promise<DeliverEnvelope[]> {
    const unread = dead === null ? [] : await this.takeUnread(dead, sid, this.#services.replicaId)
    await this.failOrphans(sid, server, reason, undefined, this.#services.replicaId)
    return unread
  }

  /** Hands what adoptOrphans took to the takeover's relay, or answers its requests with `to.err`. */
  redeliver (envelopes: DeliverEnvelope[], to: { relay: Relay } | { err: GatewayError }): void {
    for (const { sid, streamId, message, trace, holder } of envelopes) {
      if ('relay' in to) this.toRelay(to.relay, message, streamId, trace, holder)
      else if (isRequest(message) && streamId !== null) {
        this.#services.streams.append(sid, streamId, toJsonRpcError(to.err, message.id)).catch(err => this.#services.log.warn({ err, sid: shortHash(sid) }, 'error answer not appended'))
      }
    }
  }

  /**
   * Answers every request that was in flight on a lost owner with -32007 (exactly once: claimed).
   * A marker younger than ORPHAN_MIN_AGE_MS stays for a later pass: its request may still be on
   * its way to the lost replica's inbox (marked, then sent), where a later takeUnread finds it and
   * delivers it again; claimed now, it would get -32007 without ever reaching a backend.
   */
  async failOrphans (sid: string, server: string, reason: string, of?: string, except?: string): Promise<void> {
    const orphans = await this.#services.eventLog.claimOrphans(sid, of, except, ORPHAN_MIN_AGE_MS)
    if (orphans.length === 0) return
    this.#services.log.warn({ sid: shortHash(sid), requests: orphans.length, reason }, 'requests in flight on a lost owner answered with an error')
    const err = new GW_ERR_BACKEND_LOST(server, reason)
    for (const { streamId, id } of orphans) {
      await this.#services.streams.append(sid, streamId, toJsonRpcError(err, id), true)
        .catch(e => this.#services.log.warn({ err: e, sid: shortHash(sid) }, 'owner-loss error not appended'))
    }
  }
}
