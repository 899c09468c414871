// Keep-alives of every open SSE stream of this process from one timer per interval: an idle stream
// lives for hours, and a timer of its own cost each one about 250 bytes (heap per idle session) and
// a timer to create and clear. The streams sharing an interval are spread over SLOTS slots, one
// visited per tick, so 10,000 streams are never written to in one turn of the event loop (that
// would stall every request behind it).

/** What the timer calls for a stream, about every interval. */
export interface KeepAliveTarget {
  keepAlive (): void
}

/** Where a target waits for its keep-alives (startKeepAlive); opaque to callers. */
export type KeepAliveSlot = Set<KeepAliveTarget>

/** Slots per interval: a tick writes to about 1/SLOTS of the streams. */
export const SLOTS = 16

class Ring {
  readonly #slots: Array<Set<KeepAliveTarget>> = Array.from({ length: SLOTS }, () => new Set())
  #next = 0
  #size = 0
  #timer: NodeJS.Timeout | undefined
  readonly #intervalMs: number
  readonly #onEmpty: () => void

  constructor (intervalMs: number, onEmpty: () => void) {
    this.#intervalMs = intervalMs
    this.#onEmpty = onEmpty
  }

  get size (): number { return this.#size }

  /** Adds a stream to the slot visited last: its first keep-alive comes one whole interval later. */
  add (target: KeepAliveTarget): KeepAliveSlot {
    const slot = this.#slots[(this.#next + SLOTS - 1) % SLOTS] as Set<KeepAliveTarget>
    slot.add(target)
    this.#size++
    if (this.#timer === undefined) {
      this.#timer = setInterval(() => { this.#tick() }, Math.max(1, Math.floor(this.#intervalMs / SLOTS)))
      this.#timer.unref()
    }
    return slot
  }

  remove (target: KeepAliveTarget, slot: KeepAliveSlot): void {
    if (!slot.delete(target)) return
    if (--this.#size > 0) return
    clearInterval(this.#timer)
    this.#timer = undefined
    this.#onEmpty()
  }

  #tick (): void {
    const slot = this.#slots[this.#next] as Set<KeepAliveTarget>
    this.#next = (this.#next + 1) % SLOTS
    // A snapshot: a keep-alive may end its stream, which leaves the slot meanwhile.
    for (const target of [...slot]) target.keepAlive()
  }
}

const rings = new Map<number, Ring>()

/**
 * Calls `target.keepAlive()` about every `intervalMs` until stopKeepAlive. Returns the slot the
 * target is in, which stopKeepAlive takes back (the caller keeps it instead of a handle object).
 */
export function startKeepAlive (intervalMs: number, target: KeepAliveTarget): KeepAliveSlot {
  let ring = rings.get(intervalMs)
  if (ring === undefined) {
    const made: Ring = new Ring(intervalMs, () => { if (rings.get(intervalMs) === made) rings.delete(intervalMs) })
    ring = made
    rings.set(intervalMs, made)
  }
  return ring.add(target)
}

/** Takes a target out of its interval's timer; a second call does nothing. */
export function stopKeepAlive (intervalMs: number, target: KeepAliveTarget, slot: KeepAliveSlot): void {
  rings.get(intervalMs)?.remove(target, slot)
}

/** How many targets the timers hold (tests). */
export function keepAliveCount (): number {
  let count = 0
  for (const ring of rings.values()) count += ring.size
  return count
}
