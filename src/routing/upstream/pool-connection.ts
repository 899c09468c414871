// One connection of a pool (pool.ts decides which request runs on which): a backend the gateway
// opens and initialises itself through the supervisor, behind its own relay (gateway-relay.ts).
//
// - Keys: a request runs under a pool-wide key (`m<n>`) as its id and stream id; the pool's own
//   requests use `i<n>` (initialize, log level, subscriptions) and `l<n>` (list reads, not counted
//   as operations). What the relay addresses to a key goes to that key's sink.
// - One request at a time: what the backend sends without a request id (logs, server-to-client
//   requests) reaches the one sink whose request is in flight; a server-to-client request with no
//   single request waiting is refused to the backend. A request of the pool's own waits for the
//   connection to be idle (whenIdle) so it never shares it with a client's.
// - Crashes: the supervisor restarts a child and replays its initialize; the requests in flight
//   get -32007 at once. A connection whose backend is gone is forgotten by its pool.
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import { filterToolsListOf, type ToolPolicyLookup } from '../../auth/tool-policy.js'
import type { BackendServerConfig, Config } from '../../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE, type GatewayError } from '../../core/errors.js'
import { isRequest, isResponse, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse } from '../../core/jsonrpc.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import type { GatewayMetrics } from '../../telemetry/metrics.js'
import { gatewayRelay, initializeBackend, type BackendInfo } from './gateway-relay.js'
import type { BackendSupervisor, CredentialLookup, UpstreamLookup } from './ports.js'
import type { Relay } from './relay.js'

/** What the client side of a pooled request hears: its answer (id = its key), and what relates to it. */
export interface PoolSink {
  onMessage (message: JsonRpcMessage): void
}

export interface RunOptions {
  /** The session's log level (logging/setLevel params.level): the connection is set to it first when it differs. */
  logLevel?: string | null
}

/** A request running on a pooled connection. */
export interface PooledCall {
  readonly key: string
  /** The connection it runs on (a task it creates lives there: its later requests go to it). */
  readonly connectionId: string
  /** The client went away: the backend is told (notifications/cancelled) and nothing more is delivered. */
  cancel (reason: string): void
  /** Answers one of the backend's server-to-client requests of this call (its opaque id). */
  answer (response: JsonRpcResponse): void
  /** Hands what comes next of this call to another sink (an MRTR retry takes over a parked call). */
  rebind (sink: PoolSink): void
}

/** What every connection of a pool is opened with (part of the pool's options). */
export interface ConnectionSettings {
  replicaId: string
  config: Readonly<Config>
  backends: BackendSupervisor
  log: Logger
  metrics: GatewayMetrics
  upstream?: UpstreamLookup
  /**
   * The credential a connection carries: its subject's when its pool is one subject's (a per-user
   * source, pool.ts), else the tenant's (a per-user source then refuses with GW_ERR_CREDENTIAL_REQUIRED).
   */
  credentials?: CredentialLookup
  toolPolicy?: ToolPolicyLookup
}

/** What a connection needs of the pool it belongs to. */
export interface ConnectionContext extends ConnectionSettings {
  /** The next number of the pool-wide sequence (connection ids, request keys, server request ids). */
  nextSeq (): number
  /** A request on the connection ended: it may serve the next one. */
  released (conn: PoolConnection): void
  /** The connection's backend is gone: the pool stops lending it. */
  forget (conn: PoolConnection): void
  /** A message of the backend's that belongs to no request (list_changed, resources/updated). */
  serverEvent (conn: PoolConnection, message: JsonRpcMessage): void
  /**
   * A notification that may concern a task the connection holds (notifications/tasks/status, or
   * one carrying related-task `_meta`): true when its owner took it, so it never reaches whichever
   * request happens to be in flight.
   */
  taskMessage (conn: PoolConnection, message: JsonRpcMessage): boolean
  /** The connection's backend lost what it held (it stopped or restarted): its tasks are gone. */
  lost (conn: PoolConnection, reason: string): void
}

/** Key prefix of the pool's own requests (initialize, log level, subscriptions). */
const OWN_KEY_PREFIX = 'i'
/** Key prefix of the pool's reads of a list (list_changed checks): not the clients' operations. */
export const LIST_KEY_PREFIX = 'l'
/** Key prefix of the clients' requests. */
const CALL_KEY_PREFIX = 'm'

export class PoolConnection {
  readonly id: string
  readonly server: string
  readonly tenant: string | null
  /** The one subject this connection serves (its credential is that user's); null: the tenant's users. */
  readonly subjectDigest: string | null
  readonly relay: Relay
  lastUsed = performance.now()
  /** Requests that chose this connection and are not delivered yet. */
  claims: number
  /** Live tasks held on this connection (not stopped as idle while > 0). */
  pins = 0
  /** Resource subscriptions of listen streams held on this connection, by uri (a count each). */
  readonly subscriptions = new Map<string, number>()
  /** Lists being compared after a list_changed of this connection (true: announced again meanwhile; list-changes.ts). */
  readonly listChecks = new Map<string, boolean>()
  readonly #context: ConnectionContext
  /** Who hears what the relay addresses to each key. */
  readonly #sinks = new Map<string, PoolSink>()
  /** Requests of the pool's own waiting for the connection to be idle (whenIdle). */
  readonly #deferred: Array<() => void> = []
  /** The level this connection's backend was last set to (logging/setLevel), if any. */
  #logLevel: string | undefined

  /** `claim`: the connection is opened for one request, reserved for it from the start. */
  constructor (context: ConnectionContext, server: string, tenant: string | null, subjectDigest: string | null, config: BackendServerConfig, claim: boolean) {
    this.#context = context
    this.id = `pool.${context.replicaId}.${context.nextSeq()}`
    this.server = server
    this.tenant = tenant
    this.subjectDigest = subjectDigest
    this.claims = claim ? 1 : 0
    const policyOf = context.toolPolicy
    this.relay = gatewayRelay({
      sid: this.id,
      server,
      config,
      clientRequestTimeoutMs: context.config.sessions.clientRequestTimeoutMs,
      host: {
        append: async (_sid, streamId, message) => { this.#toSink(streamId, message) },
        endSession: async (_sid, reason) => { await this.close(new GW_ERR_BACKEND_UNAVAILABLE(server, reason)) },
        nextServerRequestId: () => `s.${context.replicaId}.p${context.nextSeq()}`
      },
      log: context.log.child({ pool: this.id, backend: server }),
      metrics: context.metrics.forSession(server, tenant),
      uncounted: streamId => streamId.startsWith(LIST_KEY_PREFIX),
      ...(policyOf !== undefined ? { filterResult: (method: string, result: unknown) => filterToolsListOf(method, result, policyOf(tenant, server)) } : {})
    })
  }

  /** Requests on the connection: in flight, or about to be. */
  get busy (): number { return this.relay.inFlightCount + this.claims }

  /**
   * Starts the backend through the supervisor and runs the initialize handshake. On failure the
   * caller stops the backend (stopBackend), whatever else it checks before lending the connection.
   */
  async connect (): Promise<BackendInfo> {
    const { backends, upstream, credentials } = this.#context
    const { relay, server } = this
    const credential = credentials?.(this.tenant, this.subjectDigest ?? undefined, server)
    const log = relay.log
    relay.backend = await backends.open(this.id, server, {
      onMessage: message => { relay.fromBackend(message).catch(err => log.error({ err }, 'backend message not routed')) },
      onRestarting: info => {
        log.warn({ reason: info.reason, attempt: info.attempt }, 'pooled backend restarting')
        relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(server, `backend stopped (${info.reason}); restarting`))
        this.#context.lost(this, `the backend stopped (${info.reason})`)
      },
      onGone: reason => {
        log.warn({ reason }, 'pooled backend gone')
        this.#context.forget(this)
        relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE(server, reason))
        this.#context.lost(this, `the backend is gone (${reason})`)
      }
    }, {
      protocolVersion: LATEST_VERSION,
      // Streamable HTTP backends send list_changed on their GET stream: listen streams need it.
      listen: true,
      ...(upstream !== undefined ? { upstream: upstream(this.tenant, server) } : {}),
      ...(credential !== undefined ? { credential } : {})
    })
    const key = `${OWN_KEY_PREFIX}${this.#context.nextSeq()}`
    try {
      return await initializeBackend(relay, key, onMessage => { this.#sinks.set(key, { onMessage }) })
    } finally {
      this.#sinks.delete(key)
    }
  }

  /** Stops the backend without answering anything (a connection that never served). */
  async stopBackend (): Promise<void> {
    await this.#context.backends.stop(this.id).catch(() => {})
  }

  /** The pool lets go of the connection: its requests in flight get `err`, its backend stops. */
  async close (err: GatewayError): Promise<void> {
    this.#context.forget(this)
    this.relay.failAll(err)
    this.#context.lost(this, `the connection was closed (${err.message})`)
    await this.stopBackend()
  }

  /**
   * Runs one client request, taken from `build` under a fresh key, on this connection (claimed for
   * it): the session's log level is set first when it differs. Everything about it reaches `sink`.
   */
  run (build: (key: string) => JsonRpcRequest, sink: PoolSink, options: RunOptions | undefined): PooledCall {
    const key = `${CALL_KEY_PREFIX}${this.#context.nextSeq()}`
    this.#sinks.set(key, sink)
    this.lastUsed = performance.now()
    const send = (): void => {
      this.claims--
      // Cancelled (or its session ended) while the level was set: the connection is free again.
      if (!this.#sinks.has(key)) { this.#context.released(this); return }
      this.relay.deliver(build(key), key)
    }
    const level = options?.logLevel
    if (typeof level === 'string' && level !== this.#logLevel) {
      // The session's own level, for its request only. The request waits for the backend's answer:
      // while two requests are in flight on a connection, what it sends without an id cannot be
      // told apart (a roots/list asked at once by a tool would be refused).
      this.#logLevel = level
      this.request('logging/setLevel', { level }, send)
    } else {
      send()
    }
    const relay = this.relay
    return {
      key,
      connectionId: this.id,
      cancel: reason => {
        if (!this.#sinks.delete(key)) return
        relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: key, reason } }, null)
      },
      answer: response => { relay.deliver(response, null) },
      rebind: next => { if (this.#sinks.has(key)) this.#sinks.set(key, next) }
    }
  }

  /**
   * A request of the pool's own; its answer is logged if it is an error. `then` runs once it is
   * answered (or failed).
   */
  request (method: string, params: Record<string, unknown>, then?: (answer: JsonRpcResponse) => void, prefix = OWN_KEY_PREFIX): void {
    const key = `${prefix}${this.#context.nextSeq()}`
    this.#sinks.set(key, {
      onMessage: message => {
        if (!isResponse(message)) return
        if ('error' in message) this.relay.log.warn({ method, code: message.error.code }, 'pooled backend refused a request of the gateway')
        then?.(message)
      }
    })
    this.relay.deliver({ jsonrpc: '2.0', id: key, method, params }, key)
  }

  /**
   * A request of the pool's own, run while the connection runs nothing else (now, or as soon as
   * its request ends, before anyone waiting): a second request in flight would make what the
   * backend sends without an id ambiguous for the one running.
   */
  whenIdle (method: string, params: Record<string, unknown>, then?: (answer: JsonRpcResponse) => void, prefix = OWN_KEY_PREFIX): void {
    const run = (): void => {
      this.claims++
      this.request(method, params, answer => {
        this.claims--
        this.#context.released(this)
        then?.(answer)
      }, prefix)
    }
    if (this.busy === 0) run()
    else this.#deferred.push(run)
  }

  /** The connection is idle: the first request of the pool's own waiting for it runs (true), if any. */
  runDeferred (): boolean {
    const own = this.#deferred.shift()
    if (own === undefined) return false
    own()
    return true
  }

  /**
   * resources/subscribe upstream for a listen stream's resourceSubscriptions, counted per uri
   * (the pool keeps a connection that holds any from idle stop; a restarted child gets them
   * replayed by its supervised session). The backend's resources/updated reach serverEvent.
   */
  subscribe (uris: readonly string[]): void {
    for (const uri of uris) {
      const count = this.subscriptions.get(uri) ?? 0
      this.subscriptions.set(uri, count + 1)
      if (count === 0) this.whenIdle('resources/subscribe', { uri })
    }
  }

  /** Counts the uris down; `upstream`: the backend is told of those nobody holds any more (the connection is still lent). */
  unsubscribe (uris: readonly string[], upstream: boolean): void {
    for (const uri of uris) {
      const count = (this.subscriptions.get(uri) ?? 1) - 1
      if (count > 0) { this.subscriptions.set(uri, count); continue }
      this.subscriptions.delete(uri)
      if (upstream) this.whenIdle('resources/unsubscribe', { uri })
    }
  }

  /** A message the relay addressed to one request's stream (its key). */
  #toSink (streamId: string, message: JsonRpcMessage): void {
    if (!isRequest(message) && !isResponse(message) && this.#context.taskMessage(this, message)) return
    const sink = this.#sinks.get(streamId)
    if (sink !== undefined) {
      const done = isResponse(message) && message.id === streamId
      if (done) this.#sinks.delete(streamId)
      sink.onMessage(message)
      // Its request is settled in the relay before its answer comes here: the connection may be free.
      if (done) this.#context.released(this)
      return
    }
    if (isRequest(message)) {
      // No request it could belong to (several in flight, or none): the backend hears no.
      this.relay.deliver({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `${message.method} cannot be routed to a client: no single request of this connection is waiting` } }, null)
      return
    }
    // An answer nobody waits for: a cancelled request's end (its sink went with the cancellation).
    if (isResponse(message)) this.#context.released(this)
    else this.#context.serverEvent(this, message)
  }
}
