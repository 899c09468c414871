// Routed sessions (docs/architecture.md, "A client request" and "Owner loss (routed)"): a stdio or legacy-SSE backend connection that
// lives on one replica, the owner. Every message of the session goes to it; when it is gone, the
// next request on any replica takes the session over (or ends it, with `onOwnerLoss: end`).
import { GW_ERR_SESSION_NOT_FOUND } from '../../core/errors.js'
import { isRequest, type JsonRpcMessage, type JsonRpcResponse } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import { shortHash } from '../../telemetry/logger.js'
import type { TraceCarrier } from '../../telemetry/tracing.js'
import type { ServerSource } from '../../config/live.js'
import type { ReplicaContext } from '../replica/context.js'
import { OWNER_LEASE, type Ownership } from '../replica/ownership.js'
import { Relay } from '../upstream/relay.js'
import type { ClientStreams } from '../replica/streams.js'
import type { Delivery } from './delivery.js'
import { serverConfigOf, type KindName, type Route, type SessionKind } from './kind.js'

export interface RelayKindOptions extends ReplicaContext {
  live: ServerSource
  ownership: Ownership
  streams: ClientStreams
  delivery: Delivery
  /** Ends a session everywhere (Sessions.end). */
  endSession: (sid: string, reason: string) => Promise<void>
}

export class RoutedKind implements SessionKind {
  readonly name: KindName = 'routed'
  readonly hasOwner = true
  readonly leased = true
  readonly #services: RelayKindOptions

  constructor (options: RelayKindOptions) {
    this.#services = options
  }

  async prepare (): Promise<void> {}

  async open (record: SessionRecord, forwardedHeaders?: Record<string, string>): Promise<void> {
    await this.#services.ownership.claimNew(record.id)
    await this.openRelay(record, forwardedHeaders, false)
  }

  /** Starts the session's backend connection here and registers its relay (`takeOver`: replayed from the record). */
  protected async openRelay (record: SessionRecord, forwardedHeaders: Record<string, string> | undefined, takeOver: boolean): Promise<Relay> {
    return await this.#services.ownership.open(record, { direct: false, isOwner: true, takeOver, lease: OWNER_LEASE, ...(forwardedHeaders !== undefined ? { forwardedHeaders } : {}) })
  }

  // routeOf's own promise, not an async wrapper around it: one frame and one await less per POST.
  admit (record: SessionRecord, ownerRead: Promise<string | null> | undefined): Promise<Route> {
    return this.routeOf(record, ownerRead)
  }

  prefetchOwner (sid: string): Promise<string | null> | undefined {
    if (this.#services.ownership.local(sid) !== undefined) return undefined
    const read = this.#services.store.getOwner(sid)
    // Awaited by admit(), or dropped when the request fails before (an unknown session: 404).
    read.catch(() => {})
    return read
  }

  sendsFromHere (_record: SessionRecord, route: Route | undefined): boolean {
    return route !== undefined && typeof route !== 'string'
  }

  release (): void {}

  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, route: Route | undefined, trace: TraceCarrier | undefined): Promise<void> {
    // Everything goes to the owner, which may be taken over.
    const target = typeof route === 'string' || route instanceof Relay ? route : await this.routeOf(record)
    if (typeof target !== 'string') { this.#services.delivery.toRelay(target, message, streamId, trace); return }
    const sid = record.id
    // A request whose stream is written here (its POST's): the answer's wake can go with its append.
    const holder = streamId !== null && isRequest(message) && this.#services.streams.writes(sid, streamId) ? this.#services.replicaId : undefined
    await this.#services.bus.send(target, { kind: 'deliver', sid, streamId, message, trace, ...(holder !== undefined ? { holder } : {}) })
  }

  answer (record: SessionRecord, response: JsonRpcResponse): void {
    const local = this.#services.ownership.local(record.id)
    if (local !== undefined) this.#services.delivery.toRelay(local, response, null)
  }

  listen (): void {}

  /**
   * Requests served by `dead` (found by the POST streams waiting here). Those it never handed on
   * (still in its inbox) never reached a backend: they go to the session's owner now (taken over
   * here if the owner is gone too) and are answered normally. The rest may have reached its
   * backend and get -32007. A session whose route is not known (gone) only gets the -32007.
   */
  async orphansOf (sid: string, server: string, dead: string, local: Relay | undefined, record: SessionRecord | null): Promise<void> {
    const { delivery } = this.#services
    const reason = `replica ${dead} is gone`
    let target: Relay | string | undefined = local
    // The watch found its heartbeat gone: a liveness cached from before would route the session
    // back to it, and the calls it never read would get -32007 instead of a takeover's delivery.
    this.#services.ownership.notAlive(dead)
    if (target === undefined && record !== null) {
      target = await this.routeOf(record, undefined, dead).catch((err: unknown) => {
        this.#services.log.warn({ err, sid: shortHash(sid) }, 'no owner found for the requests of a lost replica')
        return undefined
      })
    }
    // Still named as alive (its heartbeat back, or read before it lapsed): the next beat looks again.
    if (target === dead) return
    if (target === undefined) {
      await delivery.failOrphans(sid, server, reason, dead)
      return
    }
    const unread = await delivery.takeUnread(dead, sid, typeof target === 'string' ? target : this.#services.replicaId)
    await delivery.failOrphans(sid, server, reason, dead)
    for (const envelope of unread) {
      if (typeof target !== 'string') delivery.toRelay(target, envelope.message, envelope.streamId, envelope.trace, envelope.holder)
      // Its marker names the owner now: should that one die too, it is found again from there.
      else await this.#services.bus.send(target, envelope).catch(err => this.#services.log.warn({ err, sid: shortHash(sid) }, 'unread message not delivered again'))
    }
  }

  async ownerGone (record: SessionRecord): Promise<void> {
    // The owner died with its children: a session that is not carried on ends now, so the client
    // re-initialises instead of waiting on a stream nothing will ever write to. Otherwise its next
    // request, on any replica, takes it over.
    if (record.transport === 'legacy' || this.#onOwnerLoss(record.server) === 'end') await this.#services.endSession(record.id, 'owner replica gone')
  }

  cachesRecord (record: SessionRecord): boolean {
    return record.transport === 'streamable'
  }

  /**
   * Where the session's messages go: the relay here, or the owner replica's id. A session whose
   * owner is gone is taken over here (or, with `onOwnerLoss: end`, ended: a plain 404), so any
   * failure is an HTTP answer, not an empty stream. `ownerRead`: the owner as prefetchOwner()
   * started reading it. `lost`: a replica found dead that served the session's requests; when
   * the owner lease lapsed before that replica was known dead (a lease as short as a heartbeat),
   * it is the owner the takeover takes over from, so what it never handed on is read from its
   * inbox and delivered again.
   */
  protected async routeOf (record: SessionRecord, ownerRead?: Promise<string | null>, lost?: string): Promise<Relay | string> {
    const sid = record.id
    const { ownership } = this.#services
    // A takeover starting the backend here: its relay is registered before the backend runs, so
    // a request handed to it now would find no backend ("not connected"). Wait for the start.
    const opening = ownership.opening(sid)
    if (opening !== undefined) return await opening
    const local = ownership.local(sid)
    if (local !== undefined) return local
    const owner = await (ownerRead ?? this.#services.store.getOwner(sid))
    if (owner !== null && owner !== this.#services.replicaId && await ownership.isAlive(owner)) return owner
    // The owner is gone and its backend with it (docs/architecture.md, "Owner loss (routed)"). A legacy HTTP+SSE client's
    // only stream died with it too, so that session is over; others carry on unless told not to.
    if (record.transport === 'legacy' || this.#onOwnerLoss(record.server) === 'end') {
      await this.#services.endSession(sid, 'owner replica gone')
      throw new GW_ERR_SESSION_NOT_FOUND()
    }
    return await ownership.takeOver(record, owner ?? lost ?? null, async () => await this.openRelay(record, undefined, true))
  }

  #onOwnerLoss (server: string): 'carry-on' | 'end' {
    const config = serverConfigOf(this.#services.live, server)
    return config !== undefined && 'onOwnerLoss' in config && config.onOwnerLoss === 'end' ? 'end' : 'carry-on'
  }
}
