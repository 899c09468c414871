// Dispatch (docs/architecture.md, "Flows"): a client message goes where the session's kind sends
// it (kinds/), a message for a client is appended to its stream's log and the stream's holder is
// woken. Local first: when owner or holder is this replica, no bus hop.
//
// The router asks no session what kind it is: kinds/kinds.ts picks the kind of each message from
// the live config, and the kind decides. What stays here is the wiring of the parts and the bus's
// envelopes:
//   sessions.ts              lifecycle (create, principal-checked lookup, touch, end)
//   replica/streams.ts       client streams held here (open, append/wake, writers)
//   replica/ownership.ts     relays owned here, leases, liveness, takeover
//   replica/replica-watch.ts the heartbeat and lease upkeep that find a lost replica or store
//   kinds/                   routed, aggregate, direct and pooled sessions
import type { ToolPolicyLookup } from '../auth/tool-policy.js'
import { refusedCall } from '../auth/tool-policy.js'
import {
  GW_ERR_SERVER_NOT_FOUND, GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN, toJsonRpcError
} from '../core/errors.js'
import type { ServerSource } from '../config/live.js'
import type { IncomingHttpHeaders } from 'node:http'
import { isRequest, isResponse, type JsonRpcMessage, type JsonRpcRequest, type RequestId } from '../core/jsonrpc.js'
import type { ClientWriter, WriterFactory } from './replica/writer.js'
import type { Envelope } from '../state/bus.js'
import type { SessionRecord } from '../state/session-store.js'
import { tracing, type TraceCarrier } from '../telemetry/tracing.js'
import type { ReplicaContext } from './replica/context.js'
import { Ownership } from './replica/ownership.js'
import { ReplicaWatch } from './replica/replica-watch.js'
import type { BackendSupervisor, CredentialLookup, UpstreamLookup } from './upstream/ports.js'
import type { RelayHost } from './upstream/relay.js'
import { isValidSessionId, Sessions, type NewSession } from './sessions.js'
import { ClientStreams, type OpenPostOptions, type OpenStreamOptions } from './replica/streams.js'
import { TaskEvents } from './replica/task-events.js'
import type { SessionTasks } from '../state/session-tasks.js'
import { MemorySessionTasks } from '../state/session-tasks-memory.js'
import type { ConnectionPool } from './upstream/pool.js'
import { PooledSessions } from './kinds/pooled-sessions.js'
import type { StreamKind } from '../telemetry/metrics.js'
import { Delivery } from './kinds/delivery.js'
import { SessionKinds } from './kinds/kinds.js'
import { serverConfigOf, type KindName, type Route, type SessionKind } from './kinds/kind.js'

export type { BackendSupervisor } from './upstream/ports.js'
export type { BackendSessionHandle } from './upstream/relay.js'
export type { Route } from './kinds/kind.js'

export interface RouterOptions extends ReplicaContext {
  backends: BackendSupervisor
  /** Makes a client stream's writer: the HTTP layer's, handed down so routing never imports it. */
  newWriter: WriterFactory
  /** The servers as configured now (live reload); config.servers is the boot-time set. */
  live: ServerSource
  /** Session quotas (auth/quotas.ts): takes a slot for a new session or throws 429. */
  admitSession?: (record: SessionRecord) => Promise<void>
  /** A tenant's upstream headers/env for a server; none without tenants. */
  upstream?: UpstreamLookup
  /** Each session owner's own credential toward a server (credentials/); none when static. */
  credentials?: CredentialLookup
  /** A tenant's tool policy on a server (auth/tool-policy.ts); none without tenants. */
  toolPolicy?: ToolPolicyLookup
  /** The (server, tenant) pools of backend connections: pooled sessions run on them (docs/architecture.md, "A pooled call"). */
  pool: ConnectionPool
  /** The sessions' task view the console reads (a memory twin of its own when not given). */
  sessionTasks?: SessionTasks
}

/** What admit() found for one POST: the kind its messages are of, and where they go. */
export interface Admission {
  readonly kind: SessionKind
  readonly route: Route | undefined
  /** The owner replica that serves its requests, when it is another one (a marker names it). */
  readonly servedBy: string | undefined
  /** Whether its requests leave for the backend from this replica (ClientStreams.openPost's `mark`). */
  readonly sendsFromHere: boolean
}

export class Router {
  readonly replicaId: string
  readonly #services: RouterOptions
  readonly #streams: ClientStreams
  readonly #ownership: Ownership
  readonly #sessions: Sessions
  readonly #pooled: PooledSessions
  readonly #delivery: Delivery
  readonly #kinds: SessionKinds
  readonly #watch: ReplicaWatch
  readonly #taskEvents: TaskEvents
  #seq = 0
  #stopping = false
  /** Envelopes of the 2026-07-28 face (MRTR retries across replicas), handed to it as they come. */
  #modernEnvelopes: ((envelope: Envelope) => void) | undefined
  #replicaGone: ((replica: string) => void) | undefined
  /** The admin API's envelopes (a reload asked on another replica). */
  #adminEnvelopes: ((envelope: Envelope) => void) | undefined

  constructor (options: RouterOptions) {
    this.#services = options
    this.replicaId = options.replicaId
    const { replicaId, config, store, eventLog, bus, log, metrics, tasks } = options
    const endSession = async (sid: string, reason: string): Promise<void> => { await this.#sessions.end(sid, reason) }
    const host: RelayHost = {
      append: async (sid, streamId, message, holder) => await this.#streams.append(sid, streamId, message, false, holder),
      endSession,
      nextServerRequestId: () => `s.${replicaId}.${++this.#seq}`
    }
    this.#ownership = new Ownership({
      replicaId,
      config,
      store,
      tasks,
      backends: options.backends,
      live: options.live,
      ...(options.upstream !== undefined ? { upstream: options.upstream } : {}),
      ...(options.credentials !== undefined ? { credentials: options.credentials } : {}),
      ...(options.toolPolicy !== undefined ? { toolPolicy: options.toolPolicy } : {}),
      log,
      metrics,
      host,
      failOrphans: async (sid, server, reason, from) => await this.#delivery.adoptOrphans(sid, server, reason, from),
      redeliver: (envelopes, to) => { this.#delivery.redeliver(envelopes, to) }
    })
    this.#taskEvents = new TaskEvents({ store, tasks: options.sessionTasks ?? new MemorySessionTasks(), metrics, log, ttlMs: config.sessions.idleTimeoutMs })
    this.#streams = new ClientStreams({ replicaId, config, store, tasks, eventLog, bus, log, metrics, isAlive: async r => await this.#ownership.isAlive(r), endSession, newWriter: options.newWriter, taskEvents: this.#taskEvents })
    this.#delivery = new Delivery({ ...options, ownership: this.#ownership, streams: this.#streams, touch: sid => { this.#sessions.touch(sid) } })
    this.#pooled = new PooledSessions({
      replicaId,
      pool: options.pool,
      live: options.live,
      store,
      log,
      append: async (sid, streamId, message) => await this.#streams.append(sid, streamId, message),
      answerOnce: async (sid, streamId, message) => await this.#streams.append(sid, streamId, message, false, undefined, true),
      writes: (sid, streamId) => this.#streams.writes(sid, streamId),
      pendingReplicas: async sid => await eventLog.pendingReplicas(sid),
      tasks,
      isAlive: async replica => await store.isAlive(replica),
      forward: async (replica, sid, message, streamId) => {
        // A request whose stream is written here (its POST's): the answer's wake can go with its append.
        const holder = streamId !== undefined && this.#streams.writes(sid, streamId) ? { holder: replicaId } : {}
        if (await this.#ownership.isAlive(replica)) await bus.send(replica, { kind: 'deliver', sid, streamId: streamId ?? null, message, ...holder })
      }
    })
    this.#kinds = new SessionKinds({
      ...options,
      ownership: this.#ownership,
      streams: this.#streams,
      delivery: this.#delivery,
      endSession,
      host,
      upstream: options.upstream,
      toolPolicy: options.toolPolicy
    }, this.#pooled)
    this.#sessions = new Sessions({ replicaId, config, store, tasks, eventLog, bus, log, metrics, ownership: this.#ownership, kinds: this.#kinds, pooled: this.#pooled, streams: this.#streams, stopping: () => this.#stopping, ended: sid => { this.#taskEvents.ended(sid) }, ...(options.admitSession !== undefined ? { admit: options.admitSession } : {}) })
    this.#watch = new ReplicaWatch({
      replicaId,
      config,
      store,
      tasks,
      eventLog,
      bus,
      log,
      metrics,
      ownership: this.#ownership,
      streams: this.#streams,
      kindOf: server => this.#kinds.of(server),
      failOrphans: async (sid, server, reason) => { await this.#delivery.failOrphans(sid, server, reason) },
      sweepSessions: () => { this.#sessions.sweep() },
      replicaGone: replica => { this.#replicaGone?.(replica) },
      endSession
    })
  }

  async start (): Promise<void> {
    await this.#services.bus.start(this.replicaId, envelope => { this.#onEnvelope(envelope) })
    await this.#watch.start()
  }

  /**
   * Before a graceful stop closes the pool: the tasks of pooled sessions held here end failed (their
   * connections stop with the pool), written to the store while it is still there.
   */
  async failTasksHere (): Promise<void> {
    await this.#pooled.shutdownTasks()
  }

  /** Graceful stop: streams end with a retry hint, leases released, backends stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    this.#watch.stop()
    this.#streams.endAll(this.#services.config.http.retryMs)
    this.#pooled.stop()
    await this.#ownership.stopAll(new GW_ERR_SHUTTING_DOWN())
    await this.#services.bus.close()
  }

  get stopping (): boolean { return this.#stopping }

  /** Whether an envelope sent after a log write reaches its replica only once that write is applied (Bus.ordered). */
  get busOrdered (): boolean { return this.#services.bus.ordered }

  /** The heartbeat watch found a replica gone (what the 2026-07-28 face hosted there is settled). */
  onReplicaGone (handler: (replica: string) => void): void {
    this.#replicaGone = handler
  }

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
    await this.#services.bus.send(replica, envelope)
  }

  /** Whether a replica's heartbeat is current (cached briefly). */
  async isAlive (replica: string): Promise<boolean> {
    return await this.#ownership.isAlive(replica)
  }

  /** Sessions whose backend connection this replica owns, by server (read when metrics are scraped). */
  ownedSessions (): Map<string, number> { return this.#ownership.ownedByServer() }

  /** Pooled sessions created on this replica and still open, by server (read when metrics are scraped). */
  pooledSessions (): Map<string, number> { return this.#pooled.sessionsByServer() }

  /** The kind of a server's sessions now, by name (what the console shows). */
  kindNameOf (server: string): KindName { return this.#kinds.of(server).name }

  /**
   * A session-level notification a pool saw (`forwarded`: another replica's pool): to the
   * sessions it concerns (SessionKinds.poolEvent).
   */
  poolEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    this.#kinds.poolEvent(server, tenant, subject, message, forwarded)
  }

  /** Client streams this replica writes, by kind (read when metrics are scraped). */
  openStreams (): Map<StreamKind, number> { return this.#streams.countByKind() }

  // ---- what the HTTP faces use -------------------------------------------------------------

  async createSession (input: NewSession, forwardedHeaders?: Record<string, string>): Promise<SessionRecord> {
    // A reload removed the server while the backend was starting: it may have stopped the start
    // (the session was ended while its child waited to be spawned), ended the session already (its
    // relay was registered), or not; either way the client must not get its id, and is told the
    // server is gone (404), not that its backend failed.
    const removed = (): boolean => serverConfigOf(this.#services.live, input.server) === undefined
    // A pooled session starts no child: the pool answers for its backend (and refuses past maxSessions).
    await this.#kinds.of(input.server).prepare(input.server, input.tenant ?? null, input.subjectDigest)
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
      await this.#sessions.end(sid, reason).catch(err => this.#services.log.warn({ err }, 'session end failed'))
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
  async openPost (options: OpenPostOptions): Promise<ClientWriter> {
    return await this.#streams.openPost(options)
  }

  /** `record`: the session's, when the stream is its GET or legacy stream (a pooled session's events come to it). */
  async openStream (options: OpenStreamOptions, record?: SessionRecord): Promise<ClientWriter> {
    const writer = await this.#streams.open(options)
    if (record !== undefined) {
      this.#watch.streamHeld(record.id, record.server)
      this.#kinds.of(record.server).listen(record)
    }
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
   * Hands one client message to where the session's kind sends it. `streamId` is the client
   * stream that gets the answer (and related messages) of a request; null for notifications and
   * responses. `admission`: what admit() found for the POST carrying it. `headers`: the HTTP
   * request's, where a client's trace context may be (tracing on).
   */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, admission?: Admission, headers?: IncomingHttpHeaders): Promise<void> {
    const sid = record.id
    const kind = admission?.kind ?? this.#kinds.of(record.server)
    if (isResponse(message)) {
      // An answer to a server-to-client request goes to the replica named in its opaque id (docs/architecture.md, "A backend message").
      const replica = replicaOfOpaqueId(message.id)
      if (replica === this.replicaId || replica === null) { kind.answer(record, message); return }
      // The id is client input: only a live replica gets an envelope (no inbox for made-up names).
      if (await this.#ownership.isAlive(replica)) await this.#services.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
      return
    }
    this.#taskEvents.fromClient(record, message)
    if (isRequest(message) && streamId !== null && this.#refusedByToolPolicy(record, message, streamId)) {
      kind.release(admission?.route, message)
      return
    }
    const trace = tracing === null || streamId === null ? undefined : this.#traceRequest(record, message, streamId, headers)
    await kind.fromClient(record, message, streamId, admission?.route, trace)
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
    const refusal = refusedCall(this.#services.toolPolicy, { tenant: record.tenant, subject: record.subjectDigest, server: record.server }, request, this.#services.log)
    if (refusal === null) return false
    this.#streams.append(record.id, streamId, refusal).catch(err => this.#services.log.warn({ err }, 'tool policy refusal not delivered'))
    return true
  }

  /**
   * Before a POST opens its response stream: where its messages go, as the session's kind finds
   * (it may refuse: then the failure is an HTTP answer, not an empty stream).
   */
  async admit (record: SessionRecord, ownerRead?: Promise<string | null>, requests: readonly JsonRpcRequest[] = []): Promise<Admission> {
    const kind = this.#kinds.of(record.server)
    const route = await kind.admit(record, ownerRead, requests)
    return { kind, route, servedBy: typeof route === 'string' ? route : undefined, sendsFromHere: kind.sendsFromHere(record, route) }
  }

  /**
   * Starts reading the owner of a session whose backend does not run here (Redis mode), while the
   * caller reads its record: a POST taken by a replica that does not own the session then waits
   * one round trip for both, not two. Hand it to admit(); undefined when admit() would not read it.
   */
  prefetchOwner (sid: string | undefined, server: string): Promise<string | null> | undefined {
    if (this.#services.config.redis === undefined || sid === undefined || !isValidSessionId(sid)) return undefined
    return this.#kinds.of(server).prefetchOwner(sid)
  }

  /** Whether a record getSession() gave was read from the store for that request (Sessions.mayBeCached). */
  recordRead (record: SessionRecord): boolean {
    return !this.#sessions.mayBeCached(record.id)
  }

  /** What admit() took and the POST did not use (its stream did not open): given back. */
  release (admission: Admission | undefined): void {
    admission?.kind.release(admission.route)
  }

  // ---- envelopes ----------------------------------------------------------------

  #onEnvelope (envelope: Envelope): void {
    switch (envelope.kind) {
      case 'deliver': {
        // A takeover in progress here (its relay is registered before its backend runs): the
        // message waits for the backend it starts.
        const opening = this.#ownership.opening(envelope.sid)
        if (opening !== undefined) {
          opening.then(r => { this.#delivery.toRelay(r, envelope.message, envelope.streamId, envelope.trace, envelope.holder) }, () => { this.#onEnvelope(envelope) })
          return
        }
        const relay = this.#ownership.local(envelope.sid)
        if (relay !== undefined) { this.#delivery.toRelay(relay, envelope.message, envelope.streamId, envelope.trace, envelope.holder); return }
        // A pooled session's cancellation or server-request answer, for a call running here, or a
        // request about a task held here.
        if (this.#pooled.fromEnvelope(envelope.sid, envelope.message, envelope.streamId)) return
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
        this.#sessions.endLocal(envelope.sid, envelope.reason, envelope.server).catch(err => this.#services.log.error({ err }, 'local session end failed'))
        return
      case 'mrtr-resume':
      case 'mrtr-out':
      case 'mrtr-cancel':
      case 'listen-event':
      case 'task-cancel':
      case 'task-update':
        this.#modernEnvelopes?.(envelope)
        return
      case 'admin-reload':
        this.#adminEnvelopes?.(envelope)
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
