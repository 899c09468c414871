// Upkeep passes over every stream, relay or session of this replica (the router tick: holder and
// owner leases, the watch over lost owners). A pass must neither hold the event loop (10,000 idle
// streams held requests up for hundreds of ms per tick, issue 10) nor outlast the leases it renews
// (a pass that awaited one store call per stream, with a yield between them, took longer than a
// lease under load and ended streams nobody else could hold, issue 32). So a pass works in
// batches (one store call each: one round trip with Redis, pipelined) and gives the loop back
// whenever it has used a slice of it.
import { setImmediate as nextTurn } from 'node:timers/promises'

/** Items handled between two yields: a slice of a few milliseconds. */
export const UPKEEP_SLICE = 200

/** Items per store call of a batched pass: one pipelined round trip with Redis. */
export const UPKEEP_BATCH = 500

/** Loop time a pass may use before it lets I/O and timers run. */
export const UPKEEP_SLICE_MS = 8

/** Call with the loop's index: every UPKEEP_SLICE items, lets I/O and timers run. */
export async function breathe (index: number): Promise<void> {
  if (index > 0 && index % UPKEEP_SLICE === 0) await nextTurn()
}

/**
 * Runs `work` over `items` in batches of UPKEEP_BATCH, one after another, yielding to the event
 * loop between batches once UPKEEP_SLICE_MS have passed since the last yield.
 */
export async function inBatches<T> (items: readonly T[], work: (batch: T[]) => Promise<void>): Promise<void> {
  let since = performance.now()
  for (let i = 0; i < items.length; i += UPKEEP_BATCH) {
    await work(items.slice(i, i + UPKEEP_BATCH))
    if (performance.now() - since >= UPKEEP_SLICE_MS) {
      await nextTurn()
      since = performance.now()
    }
  }
}
