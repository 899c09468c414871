// One client session's supervised backend connection: restarts a crashed child and re-initialises
// it transparently (the supervisor, supervisor.ts, owns the set of them and the capacity limits).
//
// Restart policy (IO-6, docs/architecture.md):
// - A stdio child that dies without stop() being called is a crash. onRestarting is called at
//   once, so the router can answer every in-flight request of the session with a JSON-RPC error
//   (in-flight requests are lost with the child; the client may retry them).
// - The child is then restarted after a jittered exponential delay (restartDelay, with
//   config.restart.baseDelayMs / maxDelayMs). At most config.restart.maxRestarts restarts are
//   allowed within config.restart.windowMs; one more crash (or any crash with maxRestarts 0)
//   calls onGone: the session ends, the client gets 404 and re-initialises, which is the spec's
//   recovery path.
// - A restart re-initialises the new child transparently with what the client had established:
//   the client's own `initialize` params (request id 'gw-init-<n>'; the router only sends numeric
//   ids, so these never collide), `notifications/initialized` if the client had sent it, then the
//   last `logging/setLevel` and every `resources/subscribe` not later unsubscribed ('gw-replay-<n>'
//   ids, answers swallowed). A failed or timed-out re-initialisation counts as another crash.
//   If the new child negotiates another protocol version than the client had, the session is
//   gone: the client would otherwise speak a version its backend does not.
// - Responses to 'gw-' ids never reach onMessage. While restarting, messages from the client are
//   queued (bounded) and flushed in order after re-initialisation; each further onRestarting
//   (a failed attempt) empties the queue, because the router has just failed those requests.
// - A restart never happens while stopping: stop() cancels a pending restart timer and any
//   re-initialisation in progress.
// HTTP backends reconnect inside their own connection (streamable-http.ts, legacy-sse.ts); when one
// reports an exit, the session is gone.
//
// Idle children (stdio, config.childIdleMs): a session with nothing in flight either way (its
// requests answered or cancelled, the child's requests to the client answered), no resource
// subscription and no message for that long gives its child back (park()). The session stays; its
// next message starts a child and replays the session into it as after a crash (not counted as
// one), then is delivered. Clients that never send DELETE so cost memory only while they are used.
// A GET stream alone is not use: while parked, the child sends nothing (no list_changed).
//
// A lapsed credential (stdio with a credentials block, stdio-credential.ts): the child's environment
// holds the token it started with. The first request after that token's expiry, with nothing in
// flight, parks the child and starts another, with a fresh token of the same owner, as above.
import { performance } from 'node:perf_hooks'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Logger } from 'pino'
import type { BackendConnection, BackendExit, BackendFactory } from './backend.js'
import type { ServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../core/errors.js'
import { idKey, isNotification, isRecord, isRequest, isResponse, type JsonRpcMessage, type JsonRpcRequest, type RequestId } from '../core/jsonrpc.js'
import type { BackendSession, StopOptions, SupervisedHandlers, SupervisedOpenOptions } from './supervised-types.js'
import type { EstablishedState } from '../state/session-store.js'
import { credentialLapsed } from './stdio-credential.js'

/** Jittered exponential backoff: between half and all of min(maxMs, baseMs * 2^attempt). */
export const restartDelay = (attempt: number, baseMs = 250, maxMs = 30_000): number => {
  const exp = Math.min(maxMs, baseMs * 2 ** attempt)
  return exp / 2 + Math.random() * exp / 2
}

/** Messages held for a session while its child restarts. */
export const RESTART_QUEUE_LIMIT = 1000

type State = 'running' | 'restarting' | 'parked' | 'stopping' | 'gone'

interface Queued {
  msg: JsonRpcMessage
  resolve: () => void
  reject: (err: Error) => void
}

interface GwPending {
  resolve: (msg: JsonRpcMessage) => void
  reject: (err: Error) => void
}

export class SupervisedSession implements BackendSession {
  readonly server: string
  readonly sid: string
  readonly #config: ServerConfig
  readonly #factory: BackendFactory
  readonly #handlers: SupervisedHandlers
  readonly #options: SupervisedOpenOptions
  readonly #log: Logger
  readonly #onEnd: (session: SupervisedSession, closing: Promise<void>) => void
  #state: State = 'running'
  #conn: BackendConnection | null = null
  /** Bumped for every connection, so callbacks of a dead one are ignored. */
  #generation = 0
  /** When the recent restarts happened (stdio); made by the first crash, as #queue by the first restart. */
  #restarts: number[] | undefined
  #timer: NodeJS.Timeout | undefined
  /** Messages held while restarting (and while flushing them); undefined when none (heap per idle session). */
  #queue: Queued[] | undefined
  #flushing = false
  #stopping: Promise<void> | null = null
  /** Aborted by stop(): ends a restart in progress. Made when a restart first needs it. */
  #stopSignal: AbortController | undefined
  #stopRequested = false
  #gwSeq = 0
  /** Made on first use, as #subscriptions: most sessions never need them (heap per idle session). */
  #gwPending: Map<string, GwPending> | undefined
  /** When a message last went either way (performance.now()): the child's idleness. */
  #lastActive = performance.now()
  /** Requests sent to the child and not answered, and the child's requests not answered, by idKey. */
  #open: Set<string> | undefined

  // What the client established, replayed into a restarted child.
  #initParams: JsonRpcRequest['params'] | undefined
  #initId: RequestId | undefined
  #initialized = false
  #negotiatedVersion: string | undefined
  #logLevel: JsonRpcRequest['params'] | undefined
  #subscriptions: Set<string> | undefined

  constructor (server: string, sid: string, config: ServerConfig, factory: BackendFactory, handlers: SupervisedHandlers,
    options: SupervisedOpenOptions, log: Logger, onEnd: (session: SupervisedSession, closing: Promise<void>) => void) {
    this.server = server
    this.sid = sid
    this.#config = config
    this.#factory = factory
    this.#handlers = handlers
    this.#options = options
    this.#log = log
    this.#onEnd = onEnd
    const takeOver = options.takeOver
    if (takeOver !== undefined) {
      // Taking over from a replica that died: what the client had established there is replayed.
      this.#initParams = takeOver.initializeParams
      const state = takeOver.established
      this.#initialized = state?.initialized ?? true
      this.#logLevel = state?.logLevel ?? undefined
      for (const uri of state?.subscriptions ?? []) (this.#subscriptions ??= new Set()).add(uri)
      this.#negotiatedVersion = state?.backendVersion ?? undefined
    }
  }

  /**
   * Initialises a freshly connected backend with what the client had established (a takeover
   * from a replica that died); rejects when that fails, so the takeover fails.
   */
  async resume (): Promise<void> {
    const conn = this.#conn
    if (conn === null) throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'not connected')
    await this.#reinitialise(conn)
    if (this.#state !== 'running') throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'the new backend could not resume the session')
  }

  #established (): void {
    const report = this.#options.onEstablished
    if (report === undefined) return
    const state: EstablishedState = {
      initialized: this.#initialized,
      logLevel: (this.#logLevel as Record<string, unknown> | undefined) ?? null,
      subscriptions: [...this.#subscriptions ?? []],
      backendVersion: this.#negotiatedVersion ?? null
    }
    this.#call('onEstablished', () => report(state))
  }

  setListening (listening: boolean, fromEventId?: string | null): void {
    const conn = this.#conn as (BackendConnection & { startListening?: (from?: string | null) => void, stopListening?: () => void }) | null
    if (listening) conn?.startListening?.(fromEventId)
    else conn?.stopListening?.()
  }

  get pid (): number | undefined {
    return this.#conn?.pid
  }

  /** How long the session may idle before its child is given back (0: never). */
  get childIdleMs (): number {
    return this.#config.transport === 'stdio' ? this.#config.childIdleMs ?? 0 : 0
  }

  /**
   * Gives the child back if the session has been idle `idleMs` (nothing in flight either way, no
   * subscription, no replay running); the next message starts one again. True when it did.
   */
  park (idleMs: number, now = performance.now(), why = 'idle'): boolean {
    if (this.#state !== 'running' || this.#flushing || this.#conn === null || this.#initParams === undefined) return false
    if ((this.#open?.size ?? 0) > 0 || (this.#gwPending?.size ?? 0) > 0 || (this.#subscriptions?.size ?? 0) > 0) return false
    if (now - this.#lastActive < idleMs) return false
    this.#generation++ // the stopped child's exit is not a crash
    const conn = this.#conn
    this.#conn = null
    this.#state = 'parked'
    this.#log.info({ pid: conn.pid, idleMs: Math.round(now - this.#lastActive), why }, 'backend child given back; the session stays')
    conn.close().catch(err => this.#log.warn({ err }, 'closing an idle backend failed'))
    return true
  }

  /** Keeps count of what is in flight on the connection, either way (park()). */
  #track (msg: JsonRpcMessage, toBackend: boolean): void {
    this.#lastActive = performance.now()
    if (isRequest(msg)) {
      (this.#open ??= new Set()).add((toBackend ? 'c' : 'b') + idKey(msg.id))
    } else if (isResponse(msg)) {
      if (msg.id !== null && msg.id !== undefined) this.#settle((toBackend ? 'b' : 'c') + idKey(msg.id))
    } else if (msg.method === 'notifications/cancelled' && isRecord(msg.params)) {
      const id = msg.params.requestId
      if (typeof id === 'string' || typeof id === 'number') this.#settle((toBackend ? 'c' : 'b') + idKey(id))
    }
  }

  #settle (key: string): void {
    if (this.#open?.delete(key) === true && this.#open.size === 0) this.#open = undefined
  }

  /** Opens a connection whose callbacks are bound to a new generation. */
  async connect (): Promise<BackendConnection> {
    const generation = ++this.#generation
    const conn = await this.#factory({
      server: this.server,
      config: this.#config,
      sid: this.sid,
      log: this.#log,
      backendSessionId: this.#options.backendSessionId ?? null,
      ...(this.#options.protocolVersion !== undefined ? { protocolVersion: this.#options.protocolVersion } : {}),
      ...(this.#options.forwardedHeaders !== undefined ? { forwardedHeaders: this.#options.forwardedHeaders } : {}),
      ...(this.#options.initializeParams != null ? { initializeParams: this.#options.initializeParams } : {}),
      ...(this.#options.listen !== undefined ? { listen: this.#options.listen } : {}),
      ...(this.#options.getStreamLastEventId != null ? { getStreamLastEventId: this.#options.getStreamLastEventId } : {}),
      ...(this.#options.upstream !== undefined ? { upstream: this.#options.upstream } : {}),
      ...(this.#options.credential !== undefined ? { credential: this.#options.credential } : {}),
      handlers: {
        onMessage: msg => { if (generation === this.#generation) this.#fromBackend(msg) },
        onExit: exit => { if (generation === this.#generation) this.#crashed(exit) },
        ...(this.#options.onBackendSessionId !== undefined ? { onBackendSessionId: this.#options.onBackendSessionId } : {}),
        ...(this.#options.onGetStreamEventId !== undefined ? { onGetStreamEventId: this.#options.onGetStreamEventId } : {}),
        ...(this.#options.onBackendProtocolVersion !== undefined ? { onBackendProtocolVersion: this.#options.onBackendProtocolVersion } : {})
      }
    })
    if (generation !== this.#generation || this.#state === 'stopping' || this.#state === 'gone') {
      // stop() (or a newer attempt) overtook this one while the factory ran.
      await conn.close().catch(() => {})
      throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'session stopped while starting')
    }
    this.#conn = conn
    return conn
  }

  #fromBackend (msg: JsonRpcMessage): void {
    this.#track(msg, false)
    if (isResponse(msg)) {
      const id = msg.id
      // Only answers to the supervisor's own requests are kept back: a client may use a 'gw-' id
      // too (direct HTTP sessions pass client ids through), and its answer must reach it.
      const pending = typeof id === 'string' ? this.#gwPending?.get(id) : undefined
      if (typeof id === 'string' && pending !== undefined) {
        this.#gwPending?.delete(id)
        if ('error' in msg && id.startsWith('gw-replay')) this.#log.warn({ id, error: msg.error }, 'backend rejected a replayed request')
        pending.resolve(msg)
        return
      }
      if (id !== undefined && id !== null && id === this.#initId && 'result' in msg) {
        const version = (msg.result as { protocolVersion?: unknown } | null)?.protocolVersion
        if (typeof version === 'string') { this.#negotiatedVersion = version; this.#established() }
      }
    }
    this.#call('onMessage', () => this.#handlers.onMessage(msg))
  }

  #call (name: string, fn: () => void): void {
    try {
      fn()
    } catch (err) {
      this.#log.error({ err, handler: name }, 'supervised handler threw')
    }
  }

  /** Remembers the session state the client sets, to replay it into a restarted child. */
  #capture (msg: JsonRpcMessage): void {
    if (isRequest(msg)) {
      const params = msg.params
      const uri = params !== undefined && !Array.isArray(params) && typeof params.uri === 'string' ? params.uri : undefined
      switch (msg.method) {
        case 'initialize':
          this.#initParams = params
          this.#initId = msg.id
          break
        case 'logging/setLevel':
          this.#logLevel = params
          this.#established()
          break
        case 'resources/subscribe':
          if (uri !== undefined) { (this.#subscriptions ??= new Set()).add(uri); this.#established() }
          break
        case 'resources/unsubscribe':
          if (uri !== undefined && this.#subscriptions?.delete(uri) === true) this.#established()
          break
      }
    } else if (isNotification(msg) && msg.method === 'notifications/initialized') {
      if (!this.#initialized) { this.#initialized = true; this.#established() }
    }
  }

  async send (msg: JsonRpcMessage): Promise<void> {
    switch (this.#state) {
      case 'running': {
        // A child whose credential lapsed is replaced, fresh credential in its environment, for the
        // next request (when nothing is in flight on it; else it serves this one still).
        if (!this.#flushing && isRequest(msg) && credentialLapsed(this.#conn?.credentialExpiresAt) && this.park(0, performance.now(), 'credential lapsed')) {
          await this.send(msg)
          return
        }
        if (!this.#flushing) {
          this.#capture(msg)
          this.#track(msg, true)
          await this.#conn!.send(msg)
          return
        }
        // Still flushing what waited during the restart: stay behind it, in order.
        await new Promise<void>((resolve, reject) => (this.#queue ??= []).push({ msg, resolve, reject }))
        return
      }
      case 'restarting': {
        // A response answers a request of the dead child: the new one never asked.
        if (isResponse(msg)) {
          this.#log.debug({ id: msg.id }, 'dropped a response addressed to a restarted child')
          return
        }
        if ((this.#queue?.length ?? 0) >= RESTART_QUEUE_LIMIT) {
          throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'restarting, and too many messages are waiting')
        }
        // Captured when flushed, not now: a queued initialize must not also be replayed.
        await new Promise<void>((resolve, reject) => (this.#queue ??= []).push({ msg, resolve, reject }))
        return
      }
      case 'parked': {
        // Nothing was in flight when the child was given back: a response answers nothing.
        if (isResponse(msg)) return
        // A child again, the session replayed into it (as after a crash, not counted as one),
        // then this message; what comes meanwhile waits behind it.
        this.#state = 'restarting'
        const delivered = new Promise<void>((resolve, reject) => (this.#queue ??= []).push({ msg, resolve, reject }))
        this.#log.info('backend child started again for an idle session')
        this.#restart().catch(err => this.#log.error({ err }, 'restart failed unexpectedly'))
        await delivered
        return
      }
      default:
        throw new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'session ended')
    }
  }

  #rejectQueue (err: Error): void {
    const queue = this.#queue
    this.#queue = undefined
    for (const q of queue ?? []) q.reject(err)
  }

  #rejectGwPending (err: Error): void {
    for (const p of this.#gwPending?.values() ?? []) p.reject(err)
    this.#gwPending?.clear()
  }

  #restartPolicy (): { maxRestarts: number, windowMs: number, baseDelayMs: number, maxDelayMs: number } | null {
    return this.#config.transport === 'stdio' ? this.#config.restart : null
  }

  /** The connection died (or a restart attempt failed) while nobody asked it to stop. */
  #crashed (exit: BackendExit): void {
    if (this.#state === 'stopping' || this.#state === 'gone') return
    this.#generation++ // late callbacks of the dead connection are ignored from here on
    const dead = this.#conn
    this.#conn = null
    // A connection that failed re-initialisation may still be running: make sure it goes.
    dead?.close().catch(() => {})
    this.#rejectGwPending(new GW_ERR_BACKEND_UNAVAILABLE(this.server, exit.reason))

    const policy = this.#restartPolicy()
    if (policy === null) {
      this.#gone(`backend connection ended: ${exit.reason}`)
      return
    }
    const now = Date.now()
    // What was in flight died with the child (the router fails it).
    this.#open = undefined
    const restarts = (this.#restarts ?? []).filter(t => now - t < policy.windowMs)
    this.#restarts = restarts
    if (restarts.length >= policy.maxRestarts) {
      this.#gone(`backend crashed ${restarts.length + 1} times within ${policy.windowMs} ms: ${exit.reason}`)
      return
    }
    restarts.push(now)
    const attempt = restarts.length
    const delayMs = Math.round(restartDelay(attempt - 1, policy.baseDelayMs, policy.maxDelayMs))
    this.#state = 'restarting'
    // The router fails the in-flight requests, queued ones included: drop them here too.
    this.#rejectQueue(new GW_ERR_BACKEND_UNAVAILABLE(this.server, exit.reason))
    this.#log.warn({ ...exit, attempt, delayMs }, 'backend restarting')
    this.#call('onRestarting', () => this.#handlers.onRestarting({ ...exit, attempt, delayMs }))
    if (this.#state !== 'restarting') return // a handler stopped the session
    // A ref'd timer: a pending restart is work in progress, and stop() clears it.
    this.#timer = setTimeout(() => {
      this.#timer = undefined
      this.#restart().catch(err => this.#log.error({ err }, 'restart failed unexpectedly'))
    }, delayMs)
  }

  async #restart (): Promise<void> {
    if (this.#state !== 'restarting') return
    let conn: BackendConnection
    try {
      conn = await this.connect()
    } catch (err) {
      if (this.#state !== 'restarting') return
      this.#crashed({ reason: `restart failed: ${(err as Error).message}` })
      return
    }
    const generation = this.#generation
    try {
      await this.#reinitialise(conn)
    } catch (err) {
      if (this.#state !== 'restarting' || generation !== this.#generation) return
      this.#crashed({ reason: `re-initialisation failed: ${(err as Error).message}` })
      return
    }
    if (this.#state !== 'restarting' || generation !== this.#generation) return
    this.#state = 'running'
    this.#log.info({ pid: conn.pid }, 'backend restarted and re-initialised')
    await this.#flush(conn)
  }

  async #gwRequest (conn: BackendConnection, kind: 'init' | 'replay', method: string, params: JsonRpcRequest['params']): Promise<JsonRpcMessage> {
    const id = `gw-${kind}-${++this.#gwSeq}`
    const pending = this.#gwPending ??= new Map()
    const answered = new Promise<JsonRpcMessage>((resolve, reject) => pending.set(id, { resolve, reject }))
    answered.catch(() => {}) // replays are not awaited; a rejection must not go unhandled
    const msg: JsonRpcRequest = params === undefined ? { jsonrpc: '2.0', id, method } : { jsonrpc: '2.0', id, method, params }
    try {
      await conn.send(msg)
    } catch (err) {
      pending.delete(id)
      throw err
    }
    return await answered
  }

  #stopSignalOf (): AbortSignal {
    this.#stopSignal ??= new AbortController()
    if (this.#stopRequested) this.#stopSignal.abort()
    return this.#stopSignal.signal
  }

  async #reinitialise (conn: BackendConnection): Promise<void> {
    if (this.#initParams === undefined) return // the client never initialised: nothing to replay
    const timeoutMs = this.#config.requestTimeoutMs
    const done = new AbortController()
    const signal = AbortSignal.any([done.signal, this.#stopSignalOf()])
    const timeout = sleep(timeoutMs, 'timeout' as const, { ref: false, signal }).catch(() => 'stopped' as const)
    let answer: JsonRpcMessage | 'timeout' | 'stopped'
    try {
      answer = await Promise.race([this.#gwRequest(conn, 'init', 'initialize', this.#initParams), timeout])
    } finally {
      done.abort()
    }
    if (answer === 'timeout') throw new Error(`no initialize response within ${timeoutMs} ms`)
    if (answer === 'stopped') throw new Error('stopped')
    if ('error' in answer) throw new Error(`initialize failed: ${answer.error.message}`)
    const version = 'result' in answer ? (answer.result as { protocolVersion?: unknown } | null)?.protocolVersion : undefined
    if (this.#negotiatedVersion !== undefined && version !== this.#negotiatedVersion) {
      this.#gone(`restarted backend negotiated protocol version ${String(version)}, the client has ${this.#negotiatedVersion}`)
      return
    }
    if (this.#initialized) await conn.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
    if (this.#logLevel !== undefined) void this.#gwRequest(conn, 'replay', 'logging/setLevel', this.#logLevel).catch(() => {})
    for (const uri of this.#subscriptions ?? []) void this.#gwRequest(conn, 'replay', 'resources/subscribe', { uri }).catch(() => {})
  }

  async #flush (conn: BackendConnection): Promise<void> {
    this.#flushing = true
    try {
      while (this.#state === 'running' && this.#conn === conn) {
        const q = this.#queue?.shift()
        if (q === undefined) break
        try {
          this.#capture(q.msg)
          this.#track(q.msg, true)
          await conn.send(q.msg)
          q.resolve()
        } catch (err) {
          q.reject(err as Error)
        }
      }
    } finally {
      this.#flushing = false
      if (this.#queue?.length === 0) this.#queue = undefined
    }
  }

  #gone (reason: string): void {
    if (this.#state === 'stopping' || this.#state === 'gone') return
    this.#state = 'gone'
    clearTimeout(this.#timer)
    this.#generation++
    const conn = this.#conn
    this.#conn = null
    const err = new GW_ERR_BACKEND_UNAVAILABLE(this.server, reason)
    this.#rejectQueue(err)
    this.#rejectGwPending(err)
    this.#log.warn({ reason }, 'backend session gone')
    // Closed in the background; the supervisor tracks the promise so stopAll() still waits for it.
    this.#stopping = (conn?.close() ?? Promise.resolve()).catch(err => this.#log.warn({ err }, 'closing a gone backend failed'))
    this.#onEnd(this, this.#stopping)
    this.#call('onGone', () => this.#handlers.onGone(reason))
  }

  async stop (options: StopOptions = {}): Promise<void> {
    if (this.#stopping !== null) return await this.#stopping
    this.#state = 'stopping'
    this.#stopRequested = true
    this.#stopSignal?.abort()
    clearTimeout(this.#timer)
    this.#timer = undefined
    this.#generation++
    const conn = this.#conn
    this.#conn = null
    const err = new GW_ERR_BACKEND_UNAVAILABLE(this.server, 'session stopped')
    this.#rejectQueue(err)
    this.#rejectGwPending(err)
    const detachable = conn as (BackendConnection & { detach?: () => Promise<void> }) | null
    const closing = options.detach === true && detachable?.detach !== undefined ? detachable.detach() : conn?.close()
    this.#stopping = (closing ?? Promise.resolve()).catch(err => this.#log.warn({ err }, 'closing a backend failed'))
    this.#onEnd(this, this.#stopping)
    return await this.#stopping
  }
}
