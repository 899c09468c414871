// Pooled sessions (docs/architecture.md, "A pooled call"): a session of a `sessions: pooled` stdio
// server holds no child; each request borrows a connection of the (server, tenant) pool on the
// replica that received it (kinds/pooled-sessions.ts). No owner: losing a replica loses only the
// requests it was running.
import type { JsonRpcMessage, JsonRpcRequest, JsonRpcResponse } from '../../core/jsonrpc.js'
import type { SessionRecord } from '../../state/session-store.js'
import { PoolReservations, type PooledSessions } from './pooled-sessions.js'
import type { Delivery } from './delivery.js'
import type { KindName, Route, SessionKind } from './kind.js'

export class PooledKind implements SessionKind {
  readonly name: KindName = 'pooled'
  readonly hasOwner = false
  readonly leased = false
  readonly #sessions: PooledSessions
  readonly #delivery: Delivery

  constructor (sessions: PooledSessions, delivery: Delivery) {
    this.#sessions = sessions
    this.#delivery = delivery
  }

  /** The pool can describe its backend (a child started once per pool), and maxSessions is not reached. */
  async prepare (server: string, tenant: string | null, subject?: string): Promise<void> {
    await this.#sessions.prepare(server, tenant, subject)
  }

  async open (record: SessionRecord): Promise<void> {
    this.#sessions.created(record)
  }

  /**
   * A pool connection for each request, taken before its stream opens: a busy pool is a 503. A
   * request about a task another replica holds is routed there instead (that replica's id).
   */
  async admit (record: SessionRecord, _ownerRead: Promise<string | null> | undefined, requests: readonly JsonRpcRequest[]): Promise<Route> {
    return await this.#sessions.admit(record, requests)
  }

  prefetchOwner (): undefined { return undefined }

  sendsFromHere (_record: SessionRecord, route: Route | undefined): boolean { return typeof route !== 'string' }

  release (route: Route | undefined, request?: JsonRpcRequest): void {
    if (!(route instanceof PoolReservations)) return
    if (request !== undefined) route.take(request)?.release()
    else route.release()
  }

  async fromClient (record: SessionRecord, message: JsonRpcMessage, streamId: string | null, route: Route | undefined): Promise<void> {
    await this.#sessions.fromClient(record, message, streamId, route instanceof PoolReservations ? route : undefined, typeof route === 'string' ? route : undefined)
  }

  answer (record: SessionRecord, response: JsonRpcResponse): void {
    this.#sessions.answer(record.id, response)
  }

  listen (record: SessionRecord): void {
    this.#sessions.listen(record)
  }

  /** Its requests ran on the lost replica's own pool: nothing of them is left to take over (-32007). */
  async orphansOf (sid: string, server: string, dead: string): Promise<void> {
    await this.#delivery.failOrphans(sid, server, `replica ${dead} is gone`, dead)
  }

  /** A pooled session has no owner: nothing of it was lost. */
  async ownerGone (): Promise<void> {}

  cachesRecord (): boolean { return false }
}
