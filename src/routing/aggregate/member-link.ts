// An aggregate session's connection to one of its members, and the handshake that opens it:
// - a dedicated member (a stdio server with `sessions: dedicated`, an HTTP or SSE server): a
//   backend connection of the session's own, opened by the supervisor as `<sid>~<member>`, behind
//   an inner Relay (ids, progress tokens, deadlines, server-to-client requests as for any session),
//   initialised by the gateway;
// - a pooled member (`sessions: pooled`): each request borrows a connection of the member's
//   (server, tenant) pool, as a pooled session's does; the pool initialised it.
// Either is the session owner's: a dedicated connection carries the owner's credential toward the
// member (an HTTP member on every request, a stdio child in its environment), and a pooled member
// runs on the owner's own pool where its credential is one user's (docs/credentials.md).
// Whether a member is up, and when it is tried again, is the session's (session-members.ts).
import type { Logger } from 'pino'
import type { ServerSource } from '../../config/live.js'
import { backendConfigOf, serverConfigOf } from '../../config/server-kind.js'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../../core/errors.js'
import { isResponse, type JsonRpcMessage, type JsonRpcNotification, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import type { CallerCredential } from '../../credentials/types.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import type { BackendSupervisor, UpstreamLookup } from '../upstream/ports.js'
import type { BackendInfo, ConnectionPool, PooledCall } from '../upstream/pool.js'
import { GATEWAY_INITIALIZE_PARAMS, gatewayRelay, initializeBackend } from '../upstream/gateway-relay.js'
import type { Relay } from '../upstream/relay.js'

/** What a member sends about one request of the aggregate. */
export interface MemberSink { onMessage (message: JsonRpcMessage): void }

/** One request of the aggregate running on a member. */
export interface MemberCall {
  cancel (reason: string): void
  /** Answers one of the member's server-to-client requests made during this call. */
  answer (response: JsonRpcResponse): void
}

/** The aggregate's connection to one member. */
export interface MemberLink {
  readonly server: string
  /** Opens the connection (initialised) and says what the member is. */
  start (): Promise<BackendInfo>
  run (build: (key: string) => JsonRpcRequest, sink: MemberSink, logLevel: string | null): Promise<MemberCall>
  /** A client notification for the member (roots/list_changed). */
  notify (notification: JsonRpcNotification): void
  close (): Promise<void>
}

/** What a dedicated link needs of the gateway and of the aggregate session it belongs to. */
export interface DedicatedLinkOptions {
  /** The member's server. */
  server: string
  /** The aggregate session's id: the member's connection is `<sid>~<member>`. */
  sid: string
  live: ServerSource
  backends: BackendSupervisor
  tenant: string | null
  upstream: UpstreamLookup | undefined
  gatewayMetrics: GatewayMetrics
  clientRequestTimeoutMs: number
  nextServerRequestId: () => string
  /** The session's logger (the link's is its child). */
  log: Logger
  principal: { tenant: string | null, subject: string }
  /** The session owner's credential toward the member; none when the member's is static. */
  credential: CallerCredential | undefined
  /** The connection is gone for good (its restart cap): the member is down. */
  gone: (reason: string) => void
  /** A message of the connection's own, of no request of the aggregate's (list_changed, a server request). */
  fromConnection: (message: JsonRpcMessage, answer: (response: JsonRpcResponse) => void) => void
}

/** A dedicated member: a backend connection of the session's own behind an inner relay. */
export class DedicatedLink implements MemberLink {
  readonly server: string
  readonly #options: DedicatedLinkOptions
  /** Where each request's messages go, by the key it runs under on the inner relay (its stream id). */
  readonly #sinks = new Map<string, MemberSink>()
  #relay: Relay | null = null
  #seq = 0

  constructor (options: DedicatedLinkOptions) {
    this.#options = options
    this.server = options.server
  }

  get #sid (): string { return `${this.#options.sid}~${this.server}` }

  async start (): Promise<BackendInfo> {
    const options = this.#options
    const config = backendConfigOf(serverConfigOf(options.live, this.server))
    if (config === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not a configured backend server')
    const log = options.log.child({ member: this.server })
    const relay = gatewayRelay({
      sid: this.#sid,
      server: this.server,
      config,
      clientRequestTimeoutMs: options.clientRequestTimeoutMs,
      host: {
        append: async (_sid, streamId, message) => { this.#toSink(streamId, message) },
        endSession: async (_sid, reason) => { options.gone(reason) },
        nextServerRequestId: () => options.nextServerRequestId()
      },
      log,
      metrics: options.gatewayMetrics.forSession(this.server, options.tenant),
      principal: options.principal
    })
    this.#relay = relay
    const initializeParams = GATEWAY_INITIALIZE_PARAMS
    relay.backend = await options.backends.open(this.#sid, this.server, {
      onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'member message not routed')) },
      onRestarting: info => { relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, `backend stopped (${info.reason}); restarting`)) },
      onGone: reason => {
        relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, reason))
        options.gone(reason)
      }
    }, {
      log,
      protocolVersion: LATEST_VERSION,
      initializeParams,
      listen: true,
      ...(options.credential !== undefined ? { credential: options.credential } : {}),
      ...(options.upstream !== undefined ? { upstream: options.upstream(options.tenant, this.server) } : {})
    })
    const key = `i${++this.#seq}`
    return await initializeBackend(relay, key, onMessage => { this.#sinks.set(key, { onMessage }) })
  }

  async run (build: (key: string) => JsonRpcRequest, sink: MemberSink): Promise<MemberCall> {
    const relay = this.#relay
    if (relay === null) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not started')
    const key = `a${++this.#seq}`
    this.#sinks.set(key, sink)
    relay.deliver(build(key), key)
    return {
      cancel: reason => {
        if (!this.#sinks.delete(key)) return
        relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: key, reason } }, null)
      },
      answer: response => { relay.deliver(response, null) }
    }
  }

  notify (notification: JsonRpcNotification): void {
    this.#relay?.deliver(notification, null)
  }

  async close (): Promise<void> {
    const relay = this.#relay
    this.#relay = null
    this.#sinks.clear()
    if (relay === null) return
    relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'session ended'))
    await this.#options.backends.stop(this.#sid)
  }

  #toSink (streamId: string, message: JsonRpcMessage): void {
    const sink = this.#sinks.get(streamId)
    if (sink !== undefined) {
      if (isResponse(message) && message.id === streamId) this.#sinks.delete(streamId)
      sink.onMessage(message)
      return
    }
    // The member connection's own (GET stream): list_changed, or what came while several requests ran.
    if (isResponse(message)) return
    this.#options.fromConnection(message, response => { this.#relay?.deliver(response, null) })
  }
}

/**
 * A pooled member: each request borrows a connection of the member's (server, tenant) pool, or of
 * the session owner's own pool when the member's credential is one user's (the pool decides).
 */
export class PooledLink implements MemberLink {
  readonly server: string
  readonly #pool: ConnectionPool
  readonly #tenant: string | null
  readonly #subject: string | undefined

  constructor (pool: ConnectionPool, server: string, tenant: string | null, subjectDigest: string | undefined) {
    this.#pool = pool
    this.server = server
    this.#tenant = tenant
    this.#subject = subjectDigest
  }

  async start (): Promise<BackendInfo> {
    return await this.#pool.info(this.server, this.#tenant, this.#subject)
  }

  async run (build: (key: string) => JsonRpcRequest, sink: MemberSink, logLevel: string | null): Promise<MemberCall> {
    const call: PooledCall = await this.#pool.call(this.server, this.#tenant, build, sink, { logLevel }, this.#subject)
    return { cancel: reason => { call.cancel(reason) }, answer: response => { call.answer(response) } }
  }

  notify (): void {
    // A pooled connection belongs to no session: roots changes reach it with the next request's asks.
  }

  async close (): Promise<void> {}
}
