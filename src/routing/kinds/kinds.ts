// The session kinds of one replica, and the one place that picks a message's kind: of(server),
// from the live config on every call.
import type { ServerSource } from '../../config/live.js'
import type { JsonRpcMessage } from '../../core/jsonrpc.js'
import type { PooledSessions } from './pooled-sessions.js'
import { AggregateKind, type AggregateKindOptions } from './aggregate.js'
import { DirectKind } from './direct.js'
import { kindNameOf, serverConfigOf, type KindName, type SessionKind } from './kind.js'
import { PooledKind } from './pooled.js'
import { RoutedKind } from './routed.js'

export class SessionKinds {
  /** The servers as configured now: each message's kind is read from them. */
  readonly #live: ServerSource
  readonly #pooledSessions: PooledSessions
  readonly #aggregate: AggregateKind
  readonly #byName: Record<KindName, SessionKind>

  constructor (options: AggregateKindOptions, pooledSessions: PooledSessions) {
    this.#live = options.live
    this.#pooledSessions = pooledSessions
    this.#aggregate = new AggregateKind(options)
    this.#byName = {
      routed: new RoutedKind(options),
      aggregate: this.#aggregate,
      direct: new DirectKind(options),
      pooled: new PooledKind(pooledSessions, options.delivery)
    }
  }

  /** The kind of a server's sessions now (a reload may change it between two messages). */
  of (server: string): SessionKind {
    return this.#byName[kindNameOf(serverConfigOf(this.#live, server))]
  }

  /**
   * A session-level notification a (server, tenant) pool saw (`forwarded`: another replica's
   * pool): to the pooled sessions whose streams are held here, and to the aggregates owned here
   * that have the server as a pooled member (their own replica's pool only). `subject`: the one
   * subject whose pool it was (a per-user credential): only that subject's sessions hear it.
   */
  poolEvent (server: string, tenant: string | null, subject: string | null, message: JsonRpcMessage, forwarded: boolean): void {
    this.#pooledSessions.onServerEvent(server, tenant, subject, message, forwarded)
    if (!forwarded) this.#aggregate.poolEvent(server, tenant, subject, message)
  }
}
