// Terminal dispatch (ARCHITECTURE.md section 5): a client message goes to the replica that owns
// the session's backend connection; a message for a client is appended to its stream's log and
// the stream's holder is woken. Local first: when owner or holder is this replica, no bus hop.
//
// The router keeps only that decision ("local, owner or holder") and the wiring of the parts:
//   sessions.ts   lifecycle (create, principal-checked lookup, touch, end)
//   streams.ts    client streams held here (append/wake, writers, holder leases)
//   ownership.ts  relays owned here, leases, liveness, takeover of direct sessions
//   relay.ts      one backend session: id mapping, in flight, progress, server requests
import { refusedCall, type ToolPolicyLookup } from '../auth/tool-policy.js'
import {
  GW_ERR_BACKEND_LOST, GW_ERR_SERVER_NOT_FOUND, GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN, GW_ERR_STORE_UNAVAILABLE,
  toJsonRpcError, type GatewayError
} from '../core/errors.js'
import type { ServerSource } from '../config/live.js'
import type { IncomingHttpHeaders } from 'node:http'
import { cancelledRequestOf, isRequest, isResponse, type JsonRpcMessage, type JsonRpcRequest, type RequestId } from '../core/jsonrpc.js'
import type { StreamWriter } from '../http/sse.js'
import type { DeliverEnvelope, Envelope } from '../state/bus.js'
import { LEGACY_STREAM } from '../state/event-log.js'
import type { SessionRecord } from '../state/session-store.js'
import { tracing, type TraceCarrier } from '../telemetry/tracing.js'
import type { ReplicaContext } from './context.js'
import { heartbeatTtl, Ownership, type BackendPool, type UpstreamLookup } from './ownership.js'
import { capabilitiesOf, type Relay } from './relay.js'
import { shortHash } from '../telemetry/logger.js'
import { isValidSessionId, Sessions, type NewSession } from './sessions.js'
import { APPEND_RETRY_MS, ClientStreams, type OpenPostOptions, type OpenStreamOptions } from './streams.js'
import type { ConnectionPool } from './pool.js'
import { PooledRoute, PooledSessions } from './pooled-sessions.js'
import type { StreamKind, UpkeepPass } from '../telemetry/metrics.js'
import { inBatches } from './upkeep.js'

export type { BackendPool } from './ownership.js'
export type { BackendSessionHandle } from './relay.js'

export interface RouterOptions extends ReplicaContext {
  backends: BackendPool
  /** The servers as configured now (live reload); config.servers is the boot-time set. */
  live: ServerSource
  /** Session quotas (auth/quotas.ts): takes a slot for a new session or throws 429. */
  admitSession?: (record: SessionRecord) => Promise<void>
  /** A tenant's upstream headers/env for a server; none without tenants. */
  upstream?: UpstreamLookup
  /** A tenant's tool policy on a server (auth/tool-policy.ts); none without tenants. */
  toolPolicy?: ToolPolicyLookup
  /** The (server, tenant) pools of backend connections: pooled sessions run on them (flow 9). */
  pool: ConnectionPool
}

/**
 * Where a session's messages go: the relay here, or the owner replica's id (routed sessions); the
 * connections a pooled session's POST took (pooled-sessions.ts).
 */
export type Route = Relay | string | PooledRoute

export class Router {
  readonly replicaId: string
  readonly #o: RouterOptions
  readonly #streams: ClientStreams
  readonly #ownership: Ownership
  readonly #sessions: Sessions
  readonly #pooled: PooledSessions
  #tick: NodeJS.Timeout | undefined
  /** Whether a tick is running (#onTick). */
  #ticking = false
  /** The server of sessions whose streams are held here, as last read (#watchOwners). */
  readonly #serverOf = new Map<string, string>()
  #beat: NodeJS.Timeout | undefined
  #storeDown = false
  /** When the heartbeat first failed in the outage going on, if one is. */
  #storeDownSince: number | undefined
  /** `<sid> <replica>`: requests of a lost replica being settled now (#orphansOf). */
  readonly #adopting = new Set<string>()
  /** Requests answered directly while the store was away: their markers are taken once it is back. */
  #answeredWithoutLog: Array<{ sid: string, streamId: string, id: RequestId }> = []
  #seq = 0
  #stopping = false
  /** Envelopes of the 2026-07-28 face (MRTR retries across replicas), handed to it as they come. */
  #modernEnvelopes: ((envelope: Envelope) => void) | undefined
  /** The admin API's envelopes (a reload asked on another replica). */
  #adminEnvelopes: ((envelope: Envelope) => void) | undefined

  constructor (options: RouterOptions) {
    this.#o = options
    this.replicaId = options.replicaId
    const { replicaId, config, store, eventLog, bus, log, metrics } = options
    const endSession = async (sid: string, reason: string): Promise<void> => { await this.#sessions.end(sid, reason) }
    this.#ownership = new Ownership({
      replicaId,
      config,
      store,
      backends: options.backends,
      live: options.live,
      pool: options.pool,
      ...(options.upstream !== undefined ? { upstream: options.upstream } : {}),
      ...(options.toolPolicy !== undefined ? { toolPolicy: options.toolPolicy } : {}),
      log,
      metrics,
      host: {
        append: async (sid, streamId, message, holder) => await this.#streams.append(sid, streamId, message, false, holder),
        endSession,
        nextServerRequestId: () => `s.${replicaId}.${++this.#seq}`
      },
      failOrphans: async (sid, server, reason, from) => await this.#adoptOrphans(sid, server, reason, from),
      redeliver: (envelopes, to) => { this.#redeliver(envelopes, to) }
    })
    this.#streams = new ClientStreams({ replicaId, config, store, eventLog, bus, log, metrics, isAlive: async r => await this.#ownership.isAlive(r), endSession })
    this.#pooled = new PooledSessions({
      replicaId,
      pool: options.pool,
      live: options.live,
      store,
      log,
      append: async (sid, streamId, message) => await this.#streams.append(sid, streamId, message),
      writes: (sid, streamId) => this.#streams.writes(sid, streamId),
      pendingReplicas: async sid => await eventLog.pendingReplicas(sid),
      forward: async (replica, sid, message) => {
        if (await this.#ownership.isAlive(replica)) await bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
      }
    })
    this.#sessions = new Sessions({ replicaId, config, store, eventLog, bus, log, metrics, ownership: this.#ownership, pooled: this.#pooled, streams: this.#streams, stopping: () => this.#stopping, ...(options.admitSession !== undefined ? { admit: options.admitSession } : {}) })
  }

  get #leaseMs (): number { return this.#o.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#o.config.sessions.idleTimeoutMs }

  async start (): Promise<void> {
    await this.#o.bus.start(this.replicaId, envelope => { this.#onEnvelope(envelope) })
    const beatTtl = heartbeatTtl(this.#leaseMs)
    await this.#o.store.heartbeat(this.replicaId, beatTtl).catch(() => {})
    const every = Math.max(250, Math.min(5000, Math.floor(this.#leaseMs / 3), Math.floor(this.#idleMs / 4)))
    this.#tick = setInterval(() => { this.#onTick().catch(err => this.#o.log.warn({ err }, 'router tick failed')) }, every)
    this.#tick.unref()
    let beating = false
    this.#beat = setInterval(() => {
      if (beating) return
      beating = true
      this.#timed('heartbeat', async () => { await this.#onBeat(beatTtl) }).catch(err => this.#o.log.warn({ err }, 'heartbeat failed')).finally(() => { beating = false })
    }, Math.floor(beatTtl / 3))
    this.#beat.unref()
  }

  /** Graceful stop: streams end with a retry hint, leases released, backends stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    clearInterval(this.#tick)
    clearInterval(this.#beat)
    this.#streams.endAll(this.#o.config.http.retryMs)
    this.#pooled.stop()
    await this.#ownership.stopAll(new GW_ERR_SHUTTING_DOWN())
    await this.#o.bus.close()
  }

  get stopping (): boolean { return this.#stopping }

  /** Whether an envelope sent after a log write reaches its replica only once that write is applied (Bus.ordered). */
  get busOrdered (): boolean { return this.#o.bus.ordered }

  /** The 2026-07-28 face's own envelopes (mrtr-*) go to this handler. */
  onModernEnvelope (handler: (envelope: Envelope) => void): void {
    this.#modernEnvelopes = handler
  }

  /** The admin API's own envelopes (admin-*) go to this handler. */
  onAdminEnvelope (handler: (envelope: Envelope) => void): void {
    this.#adminEnvelopes = handler
  }

  /** Puts an envelope in another replica's inbox (the 2026-07-28 face forwards MRTR retries). */
  async sendEnvelope (replica: string, envelope: Envelope): Promise<void> {
    await this.#o.bus.send(replica, envelope)
  }

  /** Whether a replica's heartbeat is current (cached briefly). */
  async isAlive (replica: string): Promise<boolean> {
    return await this.#ownership.isAlive(replica)
  }

  /** Sessions whose backend connection this replica owns, by server (read when metrics are scraped). */
  ownedSessions (): Map<string, number> { return this.#ownership.ownedByServer() }

  /** Pooled sessions created on this replica and still open, by server (read when metrics are scraped). */
  pooledSessions (): Map<string, number> { return this.#pooled.sessionsByServer() }

  /** Whether a server's 2025-era sessions are pooled (flow 9). */
  isPooled (server: string): boolean { return this.#pooled.isPooled(server) }

  /**
   * A session-level notification a pool saw (`forwarded`: another replica's pool): to the pooled
   * sessions whose streams are held here.
   */
  poolEvent (server: string, tenant: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    this.#pooled.onServerEvent(server, tenant, message, forwarded)
    // Aggregate sessions owned here whose pooled member it is (their own replica's pool only).
    if (!forwarded) for (const aggregate of this.#ownership.aggregatesWithPooledMember(server)) aggregate.poolEvent(server, tenant, message)
  }

  /** Client streams this replica writes, by kind (read when metrics are scraped). */
  openStreams (): Map<StreamKind, number> { return this.#streams.countByKind() }

  // ---- what the HTTP faces use -------------------------------------------------------------

  async createSession (input: NewSession, forwardedHeaders?: Record<string, string>): Promise<SessionRecord> {
    // A reload removed the server while the backend was starting: it may have stopped the start
    // (the session was ended while its child waited to be spawned), ended the session already (its
    // relay was registered), or not; either way the client must not get its id, and is told the
    // server is gone (404), not that its backend failed.
    const removed = (): boolean => !Object.hasOwn(this.#o.live.servers, input.server)
    // A pooled session starts no child: the pool answers for its backend (and refuses past maxSessions).
    const pooled = this.#pooled.isPooled(input.server)
    if (pooled) await this.#pooled.prepare(input.server, input.tenant ?? null)
    const record = await this.#sessions.create(input, forwardedHeaders).catch((err: unknown) => {
      throw removed() ? new GW_ERR_SERVER_NOT_FOUND(input.server) : err
    })
    if (removed()) {
      await this.#sessions.end(record.id, 'server removed from the config')
      throw new GW_ERR_SERVER_NOT_FOUND(input.server)
    }
    return record
  }

  /**
   * Live reload: ends the sessions of these servers whose backend connection is here (their
   * clients get 404 next time). Sessions owned by another replica end when that one reloads.
   */
  async endSessionsOf (servers: readonly string[], reason: string): Promise<number> {
    if (servers.length === 0) return 0
    const sids = this.#ownership.sessionsOf(new Set(servers))
    await Promise.all(sids.map(async sid => {
      await this.#sessions.end(sid, reason).catch(err => this.#o.log.warn({ err }, 'session end failed'))
    }))
    return sids.length
  }

  /** `checkedLater`: see Sessions.get. */
  async getSession (sid: string, principal: string, checkedLater = false): Promise<SessionRecord | null> {
    return await this.#sessions.get(sid, principal, checkedLater)
  }

  async updateSession (sid: string, patch: Partial<Omit<SessionRecord, 'id'>>): Promise<void> {
    await this.#sessions.update(sid, patch)
  }

  async endSession (sid: string, reason: string): Promise<void> {
    await this.#sessions.end(sid, reason)
  }

  async append (sid: string, streamId: string, message: JsonRpcMessage | null): Promise<string> {
    return await this.#streams.append(sid, streamId, message)
  }

  /** Opens a POST's stream: its requests pending (exactly one answer each), held here, primed. */
  async openPost (options: OpenPostOptions): Promise<StreamWriter> {
    return await this.#streams.openPost(options)
  }

  /** `record`: the session's, when the stream is its GET or legacy stream (a pooled session's events come to it). */
  async openStream (options: OpenStreamOptions, record?: SessionRecord): Promise<StreamWriter> {
    const writer = await this.#streams.open(options)
    if (record !== undefined) this.#serverOf.set(record.id, record.server)
    if (record !== undefined && this.#pooled.isPooled(record.server)) this.#pooled.listen(record)
    return writer
  }

  async hasLiveStream (sid: string, streamId: string): Promise<boolean> {
    return await this.#streams.hasLive(sid, streamId)
  }

  async streamExists (sid: string, streamId: string): Promise<boolean> {
    return await this.#streams.exists(sid, streamId)
  }

  async streamCursor (sid: string, streamId: string): Promise<string | null> {
    return await this.#streams.cursor(sid, streamId)
  }

  // ---- client -> backend: the one decision -------------------------------------------------

  /**
   * Hands one client message to the session's owner. `streamId` is the client stream that gets
   * the answer (and related messages) of a request; null for notifications and responses.
   * `headers`: the HTTP request's, where a client's trace context may be (tracing on).
   */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, route?: Route, headers?: IncomingHttpHeaders): Promise<void> {
    const sid = record.id
    const trace = tracing === null || streamId === null ? undefined : this.#traceRequest(record, message, streamId, headers)
    const ownership = this.#ownership
    const pooled = route instanceof PooledRoute || this.#pooled.isPooled(record.server)
    if (isResponse(message)) {
      // An answer to a server-to-client request goes to the replica named in its opaque id (flow 3).
      const replica = replicaOfOpaqueId(message.id)
      const local = ownership.local(sid)
      if (replica === this.replicaId || replica === null) {
        if (pooled) this.#pooled.answer(sid, message)
        else if (local !== undefined) this.#deliverLocal(local, message, null)
        return
      }
      // The id is client input: only a live replica gets an envelope (no inbox for made-up names).
      if (await ownership.isAlive(replica)) await this.#o.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
      return
    }
    if (isRequest(message) && streamId !== null && this.#refusedByToolPolicy(record, message, streamId)) {
      if (route instanceof PooledRoute) route.take(message)?.release()
      return
    }
    if (pooled) {
      await this.#pooled.fromClient(record, message, streamId, route instanceof PooledRoute ? route : undefined)
      return
    }
    if (!ownership.isDirect(record.server)) {
      // Routed (stdio, legacy `sse` upstream): everything goes to the owner, which may be taken over.
      const target = route === undefined || route instanceof PooledRoute ? await this.#routeOf(record) : route
      if (typeof target !== 'string') this.#deliverLocal(target, message, streamId, trace)
      else {
        // A request whose stream is written here (its POST's): the answer's wake can go with its append.
        const holder = streamId !== null && isRequest(message) && this.#streams.writes(sid, streamId) ? this.replicaId : undefined
        await this.#o.bus.send(target, { kind: 'deliver', sid, streamId, message, trace, ...(holder !== undefined ? { holder } : {}) })
      }
      return
    }
    const local = ownership.local(sid)
    // Direct sessions send requests from here; their notifications go to the lease holder, whose
    // connection saw initialize and runs the backend's GET stream. A cancellation of a request in
    // flight here is handled here: its stream waits on this relay (Relay, U-CAN-1).
    if (local !== undefined && (local.isOwner || isRequest(message) || this.#cancelsHere(local, message))) { this.#deliverLocal(local, message, streamId, trace); return }
    const direct = record.backendSessionId !== null
    if (isRequest(message) && direct) {
      this.#deliverLocal(await ownership.openDirect(record), message, streamId, trace)
      return
    }
    const owner = await this.#o.store.getOwner(sid)
    if (owner !== null && owner !== this.replicaId && await ownership.isAlive(owner)) {
      await this.#o.bus.send(owner, { kind: 'deliver', sid, streamId, message, trace })
      return
    }
    if (direct) {
      // The lease holder is gone but the backend session lives on: take it over here.
      const opened = local ?? await ownership.openDirect(record)
      await ownership.claimLease(opened)
      this.#deliverLocal(opened, message, streamId, trace)
      return
    }
    // A direct session whose first initialize never completed, and its owner is gone.
    await this.#sessions.end(sid, 'owner replica gone')
    throw new GW_ERR_SESSION_NOT_FOUND()
  }

  /** Starts the SERVER span of a client request (tracing on); its context goes to the owner. */
  #traceRequest (record: SessionRecord, message: JsonRpcMessage, streamId: string, headers: IncomingHttpHeaders | undefined): TraceCarrier | undefined {
    return tracing?.serverRequest(message, {
      sid: record.id,
      streamId,
      server: record.server,
      protocolVersion: record.protocolVersion,
      headers,
      writesAnswer: this.#streams.writes(record.id, streamId)
    })
  }

  /** A tools/call the tenant's tool policy denies is answered here, as an unknown tool (tool-policy.ts). */
  #refusedByToolPolicy (record: SessionRecord, request: JsonRpcRequest, streamId: string): boolean {
    const refusal = refusedCall(this.#o.toolPolicy, { tenant: record.tenant, subject: record.subjectDigest, server: record.server }, request, this.#o.log)
    if (refusal === null) return false
    this.#streams.append(record.id, streamId, refusal).catch(err => this.#o.log.warn({ err }, 'tool policy refusal not delivered'))
    return true
  }

  /**
   * Before a POST opens its response stream: where a routed session's messages go. A session
   * whose owner is gone is taken over here (or, with `onOwnerLoss: end`, ended: a plain 404),
   * so any failure is an HTTP answer, not an empty stream. Direct sessions: undefined.
   */
  async admit (record: SessionRecord, ownerRead?: Promise<string | null>, requests: readonly JsonRpcRequest[] = []): Promise<Route | undefined> {
    // A pooled session: a pool connection for each request, taken before its stream opens.
    if (this.#pooled.isPooled(record.server)) return await this.#pooled.admit(record, requests)
    if (this.#ownership.isDirect(record.server)) return undefined
    return await this.#routeOf(record, ownerRead)
  }

  /**
   * Starts reading the owner of a routed session whose backend does not run here (Redis mode),
   * while the caller reads its record: a POST taken by a replica that does not own the session
   * then waits one round trip for both, not two (issue 10). Hand it to admit(); undefined when
   * admit() would not read the owner.
   */
  prefetchOwner (sid: string | undefined, server: string): Promise<string | null> | undefined {
    if (this.#o.config.redis === undefined || sid === undefined || !isValidSessionId(sid)) return undefined
    if (this.#ownership.isDirect(server) || this.#pooled.isPooled(server) || this.#ownership.local(sid) !== undefined) return undefined
    const read = this.#o.store.getOwner(sid)
    // Awaited by admit(), or dropped when the request fails before (an unknown session: 404).
    read.catch(() => {})
    return read
  }

  /**
   * Whether the requests of a POST leave for the backend from this replica (fromClient), so they
   * need not wait for their mark (ClientStreams.openPost, 'when-needed'): a routed session whose
   * relay is here (`route`, as admit() gave it), or a direct session whose backend session exists
   * or whose connection is here. A direct session still initialising (no backend session id: a
   * stateless or 2026-07-28 backend, or initialize not done) sends them to its lease holder.
   */
  sendsFromHere (record: SessionRecord, route: Route | undefined): boolean {
    if (this.#pooled.isPooled(record.server)) return true
    if (route !== undefined) return typeof route !== 'string'
    return this.#ownership.isDirect(record.server) && (record.backendSessionId !== null || this.#ownership.local(record.id) !== undefined)
  }

  /** Whether a record getSession() gave was read from the store for that request (Sessions.mayBeCached). */
  recordRead (record: SessionRecord): boolean {
    return !this.#sessions.mayBeCached(record.id)
  }

  /** What admit() took and the POST did not use (its stream did not open): given back. */
  release (route: Route | undefined): void {
    if (route instanceof PooledRoute) route.release()
  }

  /**
   * `ownerRead`: the owner as prefetchOwner() started reading it. `lost`: a replica found dead that served the session's requests. When the owner lease lapsed
   * before that replica was known dead (a lease as short as a heartbeat), it is the owner the
   * takeover takes over from, so what it never handed on is read from its inbox and delivered again.
   */
  async #routeOf (record: SessionRecord, ownerRead?: Promise<string | null>, lost?: string): Promise<Relay | string> {
    const sid = record.id
    const ownership = this.#ownership
    // A takeover starting the backend here: its relay is registered before the backend runs, so
    // a request handed to it now would find no backend ("not connected"). Wait for the start.
    const opening = ownership.opening(sid)
    if (opening !== undefined) return await opening
    const local = ownership.local(sid)
    if (local !== undefined) return local
    const owner = await (ownerRead ?? this.#o.store.getOwner(sid))
    if (owner !== null && owner !== this.replicaId && await ownership.isAlive(owner)) return owner
    // The owner is gone and its backend with it (ARCHITECTURE.md 6). A legacy HTTP+SSE client's
    // only stream died with it too, so that session is over; others carry on unless told not to.
    if (record.transport === 'legacy' || this.#onOwnerLoss(record.server) === 'end') {
      await this.#sessions.end(sid, 'owner replica gone')
      throw new GW_ERR_SESSION_NOT_FOUND()
    }
    return await ownership.takeOver(record, owner ?? lost ?? null)
  }

  #onOwnerLoss (server: string): 'carry-on' | 'end' {
    const config = this.#o.live.servers[server]
    return config !== undefined && 'onOwnerLoss' in config && config.onOwnerLoss === 'end' ? 'end' : 'carry-on'
  }

  /**
   * A takeover here (Ownership.takeOver): what the lost owner `dead` never handed on to its backend
   * of the session's messages is taken from its inbox for this replica to deliver again (its
   * markers name this replica now); every other request recorded up to now gets -32007.
   */
  async #adoptOrphans (sid: string, server: string, reason: string, dead: string | null): Promise<DeliverEnvelope[]> {
    const unread = dead === null ? [] : await this.#takeUnread(dead, sid, this.replicaId)
    await this.#failOrphans(sid, server, reason, undefined, this.replicaId)
    return unread
  }

  async #takeUnread (dead: string, sid: string, servedBy: string): Promise<DeliverEnvelope[]> {
    const unread = await this.#o.bus.takeUnread(dead, sid, servedBy).catch((err: unknown) => {
      this.#o.log.warn({ err, sid: shortHash(sid) }, 'unread messages of a lost replica not taken; its requests get -32007')
      return []
    })
    if (unread.length > 0) this.#o.log.info({ sid: shortHash(sid), from: dead, to: servedBy, messages: unread.length }, 'messages a lost replica never handed on are delivered again')
    return unread
  }

  #redeliver (envelopes: DeliverEnvelope[], to: { relay: Relay } | { err: GatewayError }): void {
    for (const { sid, streamId, message, trace, holder } of envelopes) {
      if ('relay' in to) this.#deliverLocal(to.relay, message, streamId, trace, holder)
      else if (isRequest(message) && streamId !== null) {
        this.#streams.append(sid, streamId, toJsonRpcError(to.err, message.id)).catch(err => this.#o.log.warn({ err, sid: shortHash(sid) }, 'error answer not appended'))
      }
    }
  }

  /**
   * Requests served by `dead`, a replica that is gone (found by the POST streams waiting here).
   * Those it never handed on (still in its inbox) never reached a backend: they go to the
   * session's owner now (taken over here if the owner is gone too) and are answered normally. The
   * rest may have reached its backend and get -32007. Direct sessions, and a session whose route is not
   * known (gone, or the cached liveness still says `dead` is alive), only get the -32007.
   */
  async #orphansOf (sid: string, server: string, dead: string, local: Relay | undefined, record: SessionRecord | null): Promise<void> {
    const reason = `replica ${dead} is gone`
    let target: Route | undefined = local
    // A pooled session's requests ran on the dead replica's own pool: nothing of them is left to take over.
    if (target === undefined && record !== null && !this.#ownership.isDirect(record.server) && !this.#pooled.isPooled(record.server)) {
      target = await this.#routeOf(record, undefined, dead).catch((err: unknown) => {
        this.#o.log.warn({ err, sid: shortHash(sid) }, 'no owner found for the requests of a lost replica')
        return undefined
      })
    }
    if (target === undefined || target === dead || (typeof target !== 'string' && target.direct)) {
      await this.#failOrphans(sid, server, reason, dead)
      return
    }
    const unread = await this.#takeUnread(dead, sid, typeof target === 'string' ? target : this.replicaId)
    await this.#failOrphans(sid, server, reason, dead)
    for (const envelope of unread) {
      if (typeof target !== 'string') this.#deliverLocal(target, envelope.message, envelope.streamId, envelope.trace, envelope.holder)
      // Its marker names the owner now: should that one die too, it is found again from there.
      else await this.#o.bus.send(target, envelope).catch(err => this.#o.log.warn({ err, sid: shortHash(sid) }, 'unread message not delivered again'))
    }
  }

  /** Answers every request that was in flight on a lost owner with -32007 (exactly once: claimed). */
  async #failOrphans (sid: string, server: string, reason: string, of?: string, except?: string): Promise<void> {
    const orphans = await this.#o.eventLog.claimOrphans(sid, of, except)
    if (orphans.length === 0) return
    this.#o.log.warn({ sid: shortHash(sid), requests: orphans.length, reason }, 'requests in flight on a lost owner answered with an error')
    const err = new GW_ERR_BACKEND_LOST(server, reason)
    for (const { streamId, id } of orphans) {
      await this.#streams.append(sid, streamId, toJsonRpcError(err, id), true)
        .catch(e => this.#o.log.warn({ err: e, sid: shortHash(sid) }, 'owner-loss error not appended'))
    }
  }

  /** Whether `message` cancels a request in flight on this relay. */
  #cancelsHere (relay: Relay, message: JsonRpcMessage): boolean {
    const id = cancelledRequestOf(message)
    return id !== undefined && relay.inFlight(id)
  }

  /**
   * A direct session's cancellation reached its lease holder, but the request runs on another
   * replica (every replica sends a direct session's requests itself): the replicas its pending
   * markers name get it too, so the one running it settles its stream (its relay tells the
   * backend as well; a second cancellation of one request is ignored, U-CAN-1). A request not
   * marked (answered as one JSON body so far) is not found: it ends at its deadline.
   */
  async #cancelElsewhere (sid: string, message: JsonRpcMessage): Promise<void> {
    for (const replica of await this.#o.eventLog.pendingReplicas(sid)) {
      if (replica !== this.replicaId && await this.#ownership.isAlive(replica)) await this.#o.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
    }
  }

  #deliverLocal (relay: Relay, message: JsonRpcMessage, streamId: string | null, trace?: TraceCarrier, holder?: string): void {
    this.#sessions.touch(relay.sid)
    if (relay.direct && relay.isOwner && this.#o.config.redis !== undefined) {
      const cancelled = cancelledRequestOf(message)
      if (cancelled !== undefined && !relay.inFlight(cancelled)) {
        this.#cancelElsewhere(relay.sid, message).catch(err => this.#o.log.warn({ err, sid: shortHash(relay.sid) }, 'cancellation not passed on'))
      }
    }
    if (isRequest(message) && message.method === 'initialize' && relay.legacy) {
      // A legacy session negotiates on a POST that may have landed on another replica, which
      // stored the outcome: take version and capabilities from the record before forwarding.
      const target = streamId ?? LEGACY_STREAM
      this.#o.store.get(relay.sid).then(record => {
        if (record !== null) relay.setClient(record.protocolVersion, capabilitiesOf(record.initializeParams))
        relay.deliver(message, target, trace, holder)
      }, err => { relay.refuse(message, target, err) })
      return
    }
    relay.deliver(message, streamId, trace, holder)
  }

  // ---- envelopes and upkeep ----------------------------------------------------------------

  #onEnvelope (envelope: Envelope): void {
    switch (envelope.kind) {
      case 'deliver': {
        // A takeover in progress here (its relay is registered before its backend runs): the
        // message waits for the backend it starts.
        const opening = this.#ownership.opening(envelope.sid)
        if (opening !== undefined) {
          opening.then(r => { this.#deliverLocal(r, envelope.message, envelope.streamId, envelope.trace, envelope.holder) }, () => { this.#onEnvelope(envelope) })
          return
        }
        const relay = this.#ownership.local(envelope.sid)
        if (relay !== undefined) { this.#deliverLocal(relay, envelope.message, envelope.streamId, envelope.trace, envelope.holder); return }
        // A pooled session's cancellation or server-request answer, for a call running here.
        if (envelope.streamId === null && this.#pooled.fromEnvelope(envelope.sid, envelope.message)) return
        const message = envelope.message
        if (isRequest(message) && envelope.streamId !== null) {
          this.#streams.append(envelope.sid, envelope.streamId, toJsonRpcError(new GW_ERR_SESSION_NOT_FOUND(), message.id)).catch(() => {})
        }
        return
      }
      case 'wake':
        this.#streams.wake(envelope.sid, envelope.streamId, envelope.entry)
        return
      case 'release':
        this.#streams.release(envelope.sid, envelope.streamId)
        return
      case 'end-session':
        this.#sessions.endLocal(envelope.sid, envelope.reason, envelope.server).catch(err => this.#o.log.error({ err }, 'local session end failed'))
        return
      case 'mrtr-resume':
      case 'mrtr-out':
      case 'mrtr-cancel':
      case 'listen-event':
        this.#modernEnvelopes?.(envelope)
        return
      case 'admin-reload':
        this.#adminEnvelopes?.(envelope)
    }
  }

  /**
   * Every third of a heartbeat: the heartbeat itself, then the watch over the requests this
   * replica's POST streams wait for. An owner found dead means their answers can never come: they
   * get -32007 now (ARCHITECTURE.md 6). While the store is unreachable nothing can be appended or
   * read, so every waiting request here is answered directly with an error.
   */
  async #onBeat (ttlMs: number): Promise<void> {
    const { store, log } = this.#o
    let beat = true
    await store.heartbeat(this.replicaId, ttlMs).catch(() => { beat = false })
    if (!beat || !store.isReady()) {
      // A blink, a restart or a failover is a delay (issue 28): the answers on their way are
      // tried again across the reconnect for as long (ClientStreams, APPEND_RETRY_MS). Only an
      // outage longer than that answers the requests waiting here with an error.
      const since = this.#storeDownSince ??= Date.now()
      if (Date.now() - since < APPEND_RETRY_MS) return
      if (!this.#storeDown) log.warn('session store unreachable; answering waiting requests with an error')
      this.#storeDown = true
      const err = new GW_ERR_STORE_UNAVAILABLE('the session store became unreachable while this request was in flight')
      this.#answeredWithoutLog.push(...this.#streams.failAwaiting(id => toJsonRpcError(err, id)))
      return
    }
    this.#storeDown = false
    this.#storeDownSince = undefined
    // Those requests got their answer: a late one from the backend must not be written after it.
    for (const { sid, streamId, id } of this.#answeredWithoutLog.splice(0)) await this.#o.eventLog.claim(sid, streamId, id, this.#idleMs).catch(() => {})
    for (const sid of this.#streams.awaitingSessions()) {
      if (this.#ownership.opening(sid) !== undefined) continue
      const local = this.#ownership.local(sid)
      const record = local === undefined || local.direct ? await store.get(sid) : null
      const server = local?.server ?? record?.server
      if (server === undefined) continue
      // Each marker names the replica that serves its request (the one that took a direct
      // session's POST; a routed session's owner as routed to). Requests served by a replica that
      // is gone died with it, whoever owns the session now: a replica that kept serving a session
      // another one had taken over (its lease not yet found lost) and then died is one case.
      let adopting = false
      /** A replica serving some of these requests still has a heartbeat. */
      let servedByLive = false
      for (const replica of await this.#o.eventLog.pendingReplicas(sid)) {
        if (replica === this.replicaId) continue
        if (await store.isAlive(replica)) { servedByLive = true; continue }
        adopting = true
        // Not awaited: it may take the session over and start its backend, which must not hold
        // up this replica's own heartbeat (a beat skipped for that long would look like a death).
        const key = `${sid} ${replica}`
        if (this.#adopting.has(key)) continue
        this.#adopting.add(key)
        this.#orphansOf(sid, server, replica, local, record)
          .catch(err => log.warn({ err, sid: shortHash(sid) }, 'requests of a lost replica not settled'))
          .finally(() => this.#adopting.delete(key))
      }
      // Settled there, with what the lost replica never handed on delivered again (not failed below).
      if (adopting) continue
      // A routed session whose backend runs here: its answers come from here.
      if (local !== undefined && !local.direct) continue
      // Direct and pooled sessions have no owner whose loss ends their requests (pending markers above).
      if (record === null || this.#ownership.isDirect(record.server) || this.#pooled.isPooled(record.server)) continue
      if (this.#ownership.has(sid)) continue
      const owner = await store.getOwner(sid)
      if (owner === this.replicaId || (owner !== null && await store.isAlive(owner))) continue
      // A lease shorter than a heartbeat (redis.leaseMs under 3 s) lapses before its dead holder
      // is known dead: the replica serving the requests is found gone on a later beat, and what it
      // never handed on is delivered again then (above), not failed now.
      if (owner === null && servedByLive) continue
      await this.#failOrphans(sid, record.server, owner === null ? 'owner lease expired' : `replica ${owner} is gone`)
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
    const ownership = this.#ownership
    this.#sessions.sweep()
    const { expired, leaseLost } = await this.#timed('owner_leases', async () => await ownership.renew())
    // Idle timeout reached (or deleted elsewhere): stop the backend (idle reaping).
    for (const sid of expired) await this.#sessions.end(sid, 'idle timeout')
    // Another replica took the session over (it thought this one dead): only the backend stops
    // here; the client's streams held here go on.
    // All at once: each drop takes its relay out at once, then waits for its backend to stop; one
    // after another, the last relays would go on serving sessions owned elsewhere for seconds.
    await Promise.all(leaseLost.map(async sid => {
      const server = ownership.local(sid)?.server ?? '?'
      await ownership.drop(sid, new GW_ERR_BACKEND_LOST(server, 'another replica took the session over'))
    }))
    const held = await this.#timed('stream_leases', async () => await this.#streams.renew())
    await this.#timed('owner_watch', async () => { await this.#watchOwners(held) })
  }

  /**
   * Sessions whose streams are held here and whose backend runs elsewhere: an owner found gone is
   * acted on. Pooled sessions have no owner: known by their server (learnt once per session, and
   * never stored: a reload may change a server's mode), they cost nothing here.
   */
  async #watchOwners (held: Set<string>): Promise<void> {
    const { store } = this.#o
    const ownership = this.#ownership
    for (const sid of this.#serverOf.keys()) if (!held.has(sid)) this.#serverOf.delete(sid)
    const watched = [...held].filter(sid => {
      if (ownership.has(sid)) return false
      const server = this.#serverOf.get(sid)
      return server === undefined || !this.#pooled.isPooled(server)
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
        if (record !== null) this.#serverOf.set(sid, record.server)
        // A pooled session has no owner: nothing of it was lost.
        if (record === null || this.#pooled.isPooled(record.server)) continue
        if (ownership.isDirect(record.server) && record.backendSessionId !== null) {
          // The backend session outlives the replica: this one, serving the client's stream, takes it over.
          await ownership.claimLease(await ownership.openDirect(record))
        } else if (record.transport === 'legacy' || ownership.isDirect(record.server) || this.#onOwnerLoss(record.server) === 'end') {
          // The owner died with its children and the session is not carried on: end it now so the
          // client re-initialises instead of waiting on a stream nothing will ever write to.
          await this.#sessions.end(sid, 'owner replica gone')
        }
        // Otherwise the session carries on: its next request, on any replica, takes it over.
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
      this.#o.metrics.upkeepPass(pass, ms / 1000)
      if (ms > this.#leaseMs / 3) this.#o.log.warn({ pass, ms: Math.round(ms), leaseMs: this.#leaseMs }, 'upkeep pass took longer than a third of the lease')
    }
  }
}

/** The replica named in an opaque server-to-client request id `s.<replica>.<seq>`. */
export function replicaOfOpaqueId (id: RequestId | null | undefined): string | null {
  if (typeof id !== 'string') return null
  // `p<seq>`: a pooled connection's (pool.ts), asked of a pooled session's client.
  const match = /^s\.([A-Za-z0-9_-]{1,100})\.p?\d{1,15}$/.exec(id)
  return match?.[1] ?? null
}
