// Upkeep passes over every stream, relay or session of this replica (the upkeep tick of
// replica-watch.ts: holder and owner leases, the watch over lost owners). A pass must neither hold
// the event loop (10,000 idle streams held requests up for hundreds of ms per tick) nor outlast
// the leases it renews (a pass that awaited one store call per stream, with a yield between them,
// took longer than a lease under load and ended streams nobody else could hold). So a pass works
// in batches (one store call each: one round trip with Redis, pipelined) and gives the loop back
// whenever it has used a slice of it.
import { setImmediate as nextTurn } from 'node:timers/promises'

/** Items handled between two yields: a slice of a few milliseconds. */
export const UPKEEP_SLICE = 200

/** Items per store call of a batched pass: one pipelined round trip with Redis. */
export const UPKEEP_BATCH = 500

/** CPU time a pass may use before it lets I/O and timers run. */
export const UPKEEP_SLICE_MS = 8

/** Call with the loop's index: every UPKEEP_SLICE items, lets I/O and timers run. */
export async function breathe (index: number): Promise<void> {
  if (index > 0 && index % UPKEEP_SLICE === 0) await nextTurn()
}

/** This process's CPU time so far, in ms. */
const cpuMs = (): number => {
  const { user, system } = process.cpuUsage()
  return (user + system) / 1000
}

/** Batches of one pass in flight at once: with Redis, their round trips overlap. */
export const UPKEEP_WINDOW = 4

/**
 * Runs `work` over `items` in batches of UPKEEP_BATCH, up to UPKEEP_WINDOW at once, yielding to
 * the event loop between batches once the pass has used UPKEEP_SLICE_MS of CPU since the last
 * yield. CPU, not wall time, and round trips that overlap: on a loaded machine every turn of the
 * loop waits for the whole backlog of other work (a burst of notifications to thousands of
 * streams), and a pass that waited a turn per batch took minutes for 10,000 streams. The yield
 * keeps requests moving meanwhile; the pass's own cost is what it is bounded by.
 */
export async function inBatches<T> (items: readonly T[], work: (batch: T[]) => Promise<void>): Promise<void> {
  let since = cpuMs()
  const running: Array<Promise<void>> = []
  for (let i = 0; i < items.length; i += UPKEEP_BATCH) {
    running.push(work(items.slice(i, i + UPKEEP_BATCH)))
    if (running.length >= UPKEEP_WINDOW) await Promise.all(running.splice(0))
    if (i + UPKEEP_BATCH < items.length && cpuMs() - since >= UPKEEP_SLICE_MS) {
      await nextTurn()
      since = cpuMs()
    }
  }
  await Promise.all(running)
}
