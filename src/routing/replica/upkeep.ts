// Upkeep loops over every stream or session of this replica (the router tick) yield to the event
// loop every few hundred items: with the memory twins each await resolves at once, so without a
// yield 10,000 idle streams held requests up for hundreds of ms per tick (issue 10: no stall over
// 50 ms).
import { setImmediate as nextTurn } from 'node:timers/promises'

/** Items handled between two yields: a slice of a few milliseconds. */
export const UPKEEP_SLICE = 200

/** Call with the loop's index: every UPKEEP_SLICE items, lets I/O and timers run. */
export async function breathe (index: number): Promise<void> {
  if (index > 0 && index % UPKEEP_SLICE === 0) await nextTurn()
}
