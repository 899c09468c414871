// Terminal dispatch (ARCHITECTURE.md section 5): a client message goes to the replica that owns
// the session's backend connection; a message for a client is appended to its stream's log and
// the stream's holder is woken. Local first: when owner or holder is this replica, no bus hop.
//
// The router keeps only that decision ("local, owner or holder") and the wiring of the parts:
//   sessions.ts   lifecycle (create, principal-checked lookup, touch, end)
//   streams.ts    client streams held here (append/wake, writers, holder leases)
//   ownership.ts  relays owned here, leases, liveness, takeover of direct sessions
//   relay.ts      one backend session: id mapping, in flight, progress, server requests
import { GW_ERR_SESSION_NOT_FOUND, GW_ERR_SHUTTING_DOWN, toJsonRpcError } from '../core/errors.js'
import { isRequest, isResponse, type JsonRpcMessage, type RequestId } from '../core/jsonrpc.js'
import type { StreamWriter } from '../http/sse.js'
import type { Envelope } from '../state/bus.js'
import { LEGACY_STREAM } from '../state/event-log.js'
import type { SessionRecord } from '../state/session-store.js'
import type { ReplicaContext } from './context.js'
import { Ownership, type BackendPool } from './ownership.js'
import { capabilitiesOf, type Relay } from './relay.js'
import { Sessions, type NewSession } from './sessions.js'
import { ClientStreams, type OpenStreamOptions } from './streams.js'

export type { BackendPool } from './ownership.js'
export type { BackendSessionHandle } from './relay.js'

export interface RouterOptions extends ReplicaContext {
  backends: BackendPool
}

export class Router {
  readonly replicaId: string
  readonly #o: RouterOptions
  readonly #streams: ClientStreams
  readonly #ownership: Ownership
  readonly #sessions: Sessions
  #tick: NodeJS.Timeout | undefined
  #seq = 0
  #stopping = false

  constructor (options: RouterOptions) {
    this.#o = options
    this.replicaId = options.replicaId
    const { replicaId, config, store, eventLog, bus, log } = options
    const endSession = async (sid: string, reason: string): Promise<void> => { await this.#sessions.end(sid, reason) }
    this.#ownership = new Ownership({
      replicaId,
      config,
      store,
      backends: options.backends,
      log,
      host: {
        append: async (sid, streamId, message) => await this.#streams.append(sid, streamId, message),
        endSession,
        nextServerRequestId: () => `s.${replicaId}.${++this.#seq}`
      }
    })
    this.#streams = new ClientStreams({ replicaId, config, store, eventLog, bus, log, isAlive: async r => await this.#ownership.isAlive(r), endSession })
    this.#sessions = new Sessions({ replicaId, config, store, eventLog, bus, log, ownership: this.#ownership, streams: this.#streams, stopping: () => this.#stopping })
  }

  get #leaseMs (): number { return this.#o.config.redis?.leaseMs ?? 10_000 }
  get #idleMs (): number { return this.#o.config.sessions.idleTimeoutMs }

  async start (): Promise<void> {
    await this.#o.bus.start(this.replicaId, envelope => { this.#onEnvelope(envelope) })
    await this.#o.store.heartbeat(this.replicaId, this.#leaseMs).catch(() => {})
    const every = Math.max(250, Math.min(5000, Math.floor(this.#leaseMs / 3), Math.floor(this.#idleMs / 4)))
    this.#tick = setInterval(() => { this.#onTick().catch(err => this.#o.log.warn({ err }, 'router tick failed')) }, every)
    this.#tick.unref()
  }

  /** Graceful stop: streams end with a retry hint, leases released, backends stopped. */
  async stop (): Promise<void> {
    this.#stopping = true
    clearInterval(this.#tick)
    this.#streams.endAll(this.#o.config.http.retryMs)
    await this.#ownership.stopAll(new GW_ERR_SHUTTING_DOWN())
    await this.#o.bus.close()
  }

  get stopping (): boolean { return this.#stopping }

  // ---- what the HTTP faces use -------------------------------------------------------------

  async createSession (input: NewSession, forwardedHeaders?: Record<string, string>): Promise<SessionRecord> {
    return await this.#sessions.create(input, forwardedHeaders)
  }

  async getSession (sid: string, principal: string): Promise<SessionRecord | null> {
    return await this.#sessions.get(sid, principal)
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

  async openStream (options: OpenStreamOptions): Promise<StreamWriter> {
    return await this.#streams.open(options)
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
   */
  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null): Promise<void> {
    const sid = record.id
    const ownership = this.#ownership
    if (isResponse(message)) {
      // An answer to a server-to-client request goes to the replica named in its opaque id (flow 3).
      const replica = replicaOfOpaqueId(message.id)
      const local = ownership.local(sid)
      if (replica === this.replicaId || replica === null) { if (local !== undefined) this.#deliverLocal(local, message, null); return }
      // The id is client input: only a live replica gets an envelope (no inbox for made-up names).
      if (await ownership.isAlive(replica)) await this.#o.bus.send(replica, { kind: 'deliver', sid, streamId: null, message })
      return
    }
    const local = ownership.local(sid)
    // Direct sessions send requests from here; their notifications go to the lease holder, whose
    // connection saw initialize and runs the backend's GET stream.
    if (local !== undefined && (local.isOwner || isRequest(message))) { this.#deliverLocal(local, message, streamId); return }
    const direct = ownership.isDirect(record.server) && record.backendSessionId !== null
    if (isRequest(message) && direct) {
      this.#deliverLocal(await ownership.openDirect(record), message, streamId)
      return
    }
    const owner = await this.#o.store.getOwner(sid)
    if (owner !== null && owner !== this.replicaId && await ownership.isAlive(owner)) {
      await this.#o.bus.send(owner, { kind: 'deliver', sid, streamId, message })
      return
    }
    if (direct) {
      // The lease holder is gone but the backend session lives on: take it over here.
      const opened = local ?? await ownership.openDirect(record)
      await ownership.claimLease(opened)
      this.#deliverLocal(opened, message, streamId)
      return
    }
    // The owner is gone: a stdio child (or legacy SSE upstream) died with it, so the session
    // is over (ARCHITECTURE.md 6).
    await this.#sessions.end(sid, 'owner replica gone')
    throw new GW_ERR_SESSION_NOT_FOUND()
  }

  #deliverLocal (relay: Relay, message: JsonRpcMessage, streamId: string | null): void {
    this.#sessions.touch(relay.sid)
    if (isRequest(message) && message.method === 'initialize' && relay.legacy) {
      // A legacy session negotiates on a POST that may have landed on another replica, which
      // stored the outcome: take version and capabilities from the record before forwarding.
      const target = streamId ?? LEGACY_STREAM
      this.#o.store.get(relay.sid).then(record => {
        if (record !== null) relay.setClient(record.protocolVersion, capabilitiesOf(record.initializeParams))
        relay.deliver(message, target)
      }, err => { relay.refuse(message, target, err) })
      return
    }
    relay.deliver(message, streamId)
  }

  // ---- envelopes and upkeep ----------------------------------------------------------------

  #onEnvelope (envelope: Envelope): void {
    switch (envelope.kind) {
      case 'deliver': {
        const relay = this.#ownership.local(envelope.sid)
        if (relay !== undefined) { this.#deliverLocal(relay, envelope.message, envelope.streamId); return }
        const message = envelope.message
        if (isRequest(message) && envelope.streamId !== null) {
          this.#streams.append(envelope.sid, envelope.streamId, toJsonRpcError(new GW_ERR_SESSION_NOT_FOUND(), message.id)).catch(() => {})
        }
        return
      }
      case 'wake':
        this.#streams.wake(envelope.sid, envelope.streamId)
        return
      case 'release':
        this.#streams.release(envelope.sid, envelope.streamId)
        return
      case 'end-session':
        this.#sessions.endLocal(envelope.sid, envelope.reason).catch(err => this.#o.log.error({ err }, 'local session end failed'))
    }
  }

  async #onTick (): Promise<void> {
    const { store } = this.#o
    const ownership = this.#ownership
    await store.heartbeat(this.replicaId, this.#leaseMs)
    this.#sessions.sweep()
    const { expired, leaseLost } = await ownership.renew()
    // Idle timeout reached (or deleted elsewhere): stop the backend (idle reaping).
    for (const sid of expired) await this.#sessions.end(sid, 'idle timeout')
    for (const sid of leaseLost) await this.#sessions.endLocal(sid, 'owner lease lost')
    const held = await this.#streams.renew()
    for (const sid of held) {
      if (ownership.has(sid)) continue
      const owner = await store.getOwner(sid)
      if (owner !== null && await store.isAlive(owner)) continue
      const record = await store.get(sid)
      if (record !== null && ownership.isDirect(record.server) && record.backendSessionId !== null) {
        // The backend session outlives the replica: this one, serving the client's stream, takes it over.
        await ownership.claimLease(await ownership.openDirect(record))
      } else {
        // The owner died with its children: end the session now so the client re-initialises
        // instead of waiting on a stream nothing will ever write to (ARCHITECTURE.md section 6).
        await this.#sessions.end(sid, 'owner replica gone')
      }
    }
  }
}

/** The replica named in an opaque server-to-client request id `s.<replica>.<seq>`. */
export function replicaOfOpaqueId (id: RequestId | null | undefined): string | null {
  if (typeof id !== 'string') return null
  const match = /^s\.([A-Za-z0-9_-]{1,100})\.\d{1,15}$/.exec(id)
  return match?.[1] ?? null
}
