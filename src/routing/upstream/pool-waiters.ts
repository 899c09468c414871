// Requests waiting in line for a pool connection (pool.ts): for any connection of a (server,
// tenant) pool at poolMax, or for the one connection that holds a task (pool-tasks.ts). A line is
// bounded in length and each wait in time, so a pool that stays busy answers GW_ERR_POOL_BUSY (503,
// Retry-After) rather than holding requests without end.
import { GW_ERR_POOL_BUSY, withRetryAfter, type GatewayError } from '../../core/errors.js'
import type { PoolConnection } from './pool-connection.js'

/** Requests that may wait in one line; past it a request is refused at once. */
const MAX_WAITERS = 4096
/** Retry-After of a request that found the pool busy. */
const POOL_BUSY_RETRY_AFTER_S = 1

export interface Waiter {
  resolve: (conn: PoolConnection) => void
  reject: (err: GatewayError) => void
  timer: NodeJS.Timeout
}

/** GW_ERR_POOL_BUSY with its Retry-After, for a request that waited `waitMs` past `connections` busy ones. */
export function poolBusy (server: string, connections: number, waitMs: number): GatewayError {
  return withRetryAfter(new GW_ERR_POOL_BUSY(server, connections, waitMs), POOL_BUSY_RETRY_AFTER_S)
}

/**
 * Waits at the end of `line` for a connection handed over by whoever frees one (they take the
 * waiter out of line and clear its timer). After `waitMs` it leaves the line (`left` runs) and fails
 * with `busy()`; a full line fails at once.
 */
export async function waitInLine (line: Waiter[], waitMs: number, busy: () => GatewayError, left?: () => void): Promise<PoolConnection> {
  if (line.length >= MAX_WAITERS) throw busy()
  return await new Promise<PoolConnection>((resolve, reject) => {
    const waiter: Waiter = {
      resolve,
      reject,
      timer: setTimeout(() => {
        const at = line.indexOf(waiter)
        if (at >= 0) line.splice(at, 1)
        left?.()
        reject(busy())
      }, waitMs)
    }
    waiter.timer.unref()
    line.push(waiter)
  })
}

/** Everyone in `line` is refused with `err` (the line is emptied). */
export function refuseAll (line: Waiter[], err: GatewayError): void {
  for (const waiter of line.splice(0)) {
    clearTimeout(waiter.timer)
    waiter.reject(err)
  }
}
