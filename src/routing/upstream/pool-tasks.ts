// What the pool keeps for the tasks its connections hold (their records are kinds/pooled-tasks.ts).
// A task lives in the backend child whose connection ran its request, so:
// - the requests about it wait for that one connection, before those that can use any;
// - a connection holding live tasks is pinned: the pool does not stop it as idle, which would lose them;
// - what its backend sends about a task, and its losing them all, reaches whoever holds the tasks
//   (TaskWatcher), never whichever request happens to be in flight.
import { GW_ERR_BACKEND_UNAVAILABLE } from '../../core/errors.js'
import type { JsonRpcMessage } from '../../core/jsonrpc.js'
import type { PoolConnection } from './pool-connection.js'
import { poolBusy, refuseAll, waitInLine, type Waiter } from './pool-waiters.js'

/**
 * Who holds tasks on the pool's connections (kinds/pooled-tasks.ts): it takes the notifications
 * about them, and hears when a connection loses them.
 */
export interface TaskWatcher {
  /** True when the notification concerned one of its tasks on that connection (it was handled). */
  message (connectionId: string, message: JsonRpcMessage): boolean
  lost (connectionId: string, reason: string): void
}

export class TaskConnections {
  /** Requests waiting for one given connection (a task's), first come first served. */
  readonly #waiters = new Map<PoolConnection, Waiter[]>()
  readonly #watchers = new Set<TaskWatcher>()

  /** Waits for `conn` to come free (next()), at most `waitMs`; then GW_ERR_POOL_BUSY. */
  async wait (conn: PoolConnection, waitMs: number): Promise<PoolConnection> {
    const waiters = this.#waiters.get(conn) ?? []
    this.#waiters.set(conn, waiters)
    return await waitInLine(waiters, waitMs, () => poolBusy(conn.server, 1, waitMs), () => {
      if (waiters.length === 0 && this.#waiters.get(conn) === waiters) this.#waiters.delete(conn)
    })
  }

  /** The first request waiting for `conn` alone, taken out of line (its timer still runs). */
  next (conn: PoolConnection): Waiter | undefined {
    const waiters = this.#waiters.get(conn)
    const waiter = waiters?.shift()
    if (waiters?.length === 0) this.#waiters.delete(conn)
    return waiter
  }

  /** `conn` is gone: the requests waiting for it alone are refused. */
  gone (conn: PoolConnection): void {
    const waiters = this.#waiters.get(conn)
    this.#waiters.delete(conn)
    refuseAll(waiters ?? [], new GW_ERR_BACKEND_UNAVAILABLE(conn.server, 'the connection holding the task is gone'))
  }

  /** Keeps `conn` from being stopped as idle while a task lives on it; the returned function lets go. */
  pin (conn: PoolConnection): () => void {
    conn.pins++
    let pinned = true
    return () => {
      if (!pinned) return
      pinned = false
      conn.pins--
    }
  }

  /** Hears about the tasks on the pool's connections (the returned function stops it). */
  watch (watcher: TaskWatcher): () => void {
    this.#watchers.add(watcher)
    return () => { this.#watchers.delete(watcher) }
  }

  /** A notification of `conn` that may concern a task: true when a watcher took it. */
  message (conn: PoolConnection, message: JsonRpcMessage): boolean {
    for (const watcher of this.#watchers) if (watcher.message(conn.id, message)) return true
    return false
  }

  /** `conn`'s backend lost what it held: every watcher hears it. */
  lost (conn: PoolConnection, reason: string): void {
    for (const watcher of this.#watchers) watcher.lost(conn.id, reason)
  }
}
