// This replica's backend connections: one per client session, keyed by the session id, with a
// capacity limit per server (503 with Retry-After beyond it). Each connection is a
// SupervisedSession (supervised-session.ts), which holds the restart policy.
//
// Idle reaping is not here: the router decides idleness from the session store and calls stop().
// What is here is giving back the child of a session idle past its server's childIdleMs (the
// session stays; supervised-session.ts starts and replays a child on its next message).
import { performance } from 'node:perf_hooks'
import type { Logger } from 'pino'
import type { BackendFactory } from './backend.js'
import type { ServerConfig } from '../config/schema.js'
import type { ServerSource } from '../config/live.js'
import { countsTowardMaxSessions } from '../config/server-kind.js'
import {
  GW_ERR_BACKEND_CAPACITY,
  GW_ERR_BACKEND_UNAVAILABLE,
  GW_ERR_CONFLICT,
  GW_ERR_SERVER_NOT_FOUND,
  GW_ERR_SHUTTING_DOWN,
  type GatewayError,
  withRetryAfter
} from '../core/errors.js'
import { shortHash } from '../telemetry/logger.js'
import { SupervisedSession } from './supervised-session.js'
import type { BackendSession, StopOptions, SupervisedHandlers, SupervisedOpenOptions } from './supervised-types.js'

export { restartDelay, RESTART_QUEUE_LIMIT } from './supervised-session.js'
export type { BackendSession, StopOptions, SupervisedHandlers, SupervisedOpenOptions } from './supervised-types.js'

/** Seconds a client is told to wait (Retry-After) when a server is at its session limit. */
export const CAPACITY_RETRY_AFTER_S = 5
/** How often sessions are checked for a child idle past childIdleMs. */
const PARK_SWEEP_MS = 1000

type Transport = ServerConfig['transport']

/** Ids of the pools' connections (routing/pool.ts): their idleness is the pool's to judge. */
const POOL_ID_PREFIX = 'pool.'

export interface SupervisorOptions {
  /** The servers as configured now (live reload): read at each open, so a session keeps the settings it opened with. */
  config: ServerSource
  log: Logger
  /** One factory per transport; the HTTP ones are plugged in by app.ts. */
  factories: Partial<Record<Transport, BackendFactory>>
}


export class Supervisor {
  readonly #config: ServerSource
  readonly #log: Logger
  readonly #factories: Partial<Record<Transport, BackendFactory>>
  readonly #sessions = new Map<string, SupervisedSession>()
  /** Sessions counted against maxSessions, starting ones included. */
  readonly #perServer = new Map<string, number>()
  /** Closes still in progress (stop or gone), so stopAll() waits for every child. */
  readonly #closing = new Set<Promise<void>>()
  #shuttingDown = false
  /**
   * Told by every session when it ends (stop or gone): one function for all of them, where a closure
   * per session kept open()'s whole scope alive (~140 B per idle session). A session is in
   * #sessions from its construction until it ends, and its sid cannot be opened again meanwhile, so
   * finding it there is what makes the release happen once.
   */
  readonly #ended = (session: SupervisedSession, closing: Promise<void>): void => {
    if (this.#sessions.get(session.sid) !== session) return
    this.#sessions.delete(session.sid)
    this.#perServer.set(session.server, (this.#perServer.get(session.server) ?? 1) - 1)
    this.#closing.add(closing)
    void closing.finally(() => this.#closing.delete(closing))
  }

  readonly #parkSweep: NodeJS.Timeout

  constructor (options: SupervisorOptions) {
    this.#config = options.config
    this.#log = options.log
    this.#factories = options.factories
    this.#parkSweep = setInterval(() => { this.#parkIdle() }, PARK_SWEEP_MS)
    this.#parkSweep.unref()
  }

  /** Gives back the children of dedicated sessions idle past their server's childIdleMs (the pools keep their own). */
  #parkIdle (): void {
    const now = performance.now()
    for (const session of this.#sessions.values()) {
      const idleMs = session.childIdleMs
      if (idleMs > 0 && !session.sid.startsWith(POOL_ID_PREFIX)) session.park(idleMs, now)
    }
  }

  /** Starts a backend connection for a client session. */
  async open (sid: string, server: string, handlers: SupervisedHandlers, options: SupervisedOpenOptions = {}): Promise<BackendSession> {
    if (this.#shuttingDown) throw new GW_ERR_SHUTTING_DOWN()
    const servers = this.#config.servers
    const config = Object.hasOwn(servers, server) ? servers[server] : undefined
    if (config === undefined) throw new GW_ERR_SERVER_NOT_FOUND(server)
    const factory = this.#factories[config.transport]
    if (factory === undefined) throw new GW_ERR_BACKEND_UNAVAILABLE(server, `no factory for transport '${config.transport}'`)
    if (this.#sessions.has(sid)) throw new GW_ERR_CONFLICT('the session already has a backend connection')
    const live = this.#perServer.get(server) ?? 0
    if (live >= config.maxSessions && countsTowardMaxSessions(config)) {
      throw withRetryAfter(new GW_ERR_BACKEND_CAPACITY(server, config.maxSessions), CAPACITY_RETRY_AFTER_S)
    }

    // One logger per session, shared with its relay when given (heap per idle session).
    const log = options.log ?? this.#log.child({ sid: shortHash(sid) })
    const session = new SupervisedSession(server, sid, config, factory, handlers, options, log, this.#ended)
    // Reserve the slot before the first await, so concurrent opens cannot overshoot the limit.
    this.#perServer.set(server, live + 1)
    this.#sessions.set(sid, session)
    try {
      await session.connect()
      if (options.takeOver !== undefined) await session.resume()
    } catch (err) {
      await session.stop()
      if (this.#shuttingDown) throw new GW_ERR_SHUTTING_DOWN()
      // A credential's own failure (consent needed, refused, nothing to exchange) keeps its code:
      // the client must learn what to do, not that the backend is down.
      const code = err instanceof Error ? (err as GatewayError).code : undefined
      throw code === 'GW_ERR_BACKEND_UNAVAILABLE' || code?.startsWith('GW_ERR_CREDENTIAL_') === true
        ? err
        : new GW_ERR_BACKEND_UNAVAILABLE(server, (err as Error).message, { cause: err })
    }
    return session
  }

  get (sid: string): BackendSession | undefined {
    return this.#sessions.get(sid)
  }

  /** Stops one session's connection; resolves at once when there is none. */
  async stop (sid: string): Promise<void> {
    await this.#sessions.get(sid)?.stop()
  }

  /** Graceful shutdown: refuses new sessions, stops every connection in parallel, waits for all. */
  async stopAll (options: StopOptions = {}): Promise<void> {
    this.#shuttingDown = true
    clearInterval(this.#parkSweep)
    await Promise.all([...this.#sessions.values()].map(async s => await s.stop(options)))
    await Promise.all([...this.#closing])
  }

  /** Live sessions of one server on this replica (those starting included). */
  count (server: string): number {
    return this.#perServer.get(server) ?? 0
  }

  /** stdio children running now, by server (a restarting session has none). */
  childrenByServer (): Map<string, number> {
    const counts = new Map<string, number>()
    for (const session of this.#sessions.values()) {
      if (session.pid !== undefined) counts.set(session.server, (counts.get(session.server) ?? 0) + 1)
    }
    return counts
  }

  /** stdio children of the pools (ids `pool.*`, routing/upstream/pool.ts) running now, by server. */
  pooledChildrenByServer (): Map<string, number> {
    const counts = new Map<string, number>()
    for (const session of this.#sessions.values()) {
      if (session.pid !== undefined && session.sid.startsWith(POOL_ID_PREFIX)) counts.set(session.server, (counts.get(session.server) ?? 0) + 1)
    }
    return counts
  }

  * sessions (): IterableIterator<string> {
    yield * this.#sessions.keys()
  }
}
