// A raw SSE reader over fetch for transport-level tests (the SDK client hides the wire).
import { createParser, type EventSourceMessage } from 'eventsource-parser'

export interface SseEvent {
  id: string | undefined
  event: string | undefined
  data: string
}

/** Reads SSE events from a fetch Response body; `retry` values are collected separately. */
export class SseReader {
  readonly events: SseEvent[] = []
  readonly retries: number[] = []
  #waiters: Array<() => void> = []
  #done = false
  readonly finished: Promise<void>

  constructor (res: Response) {
    const parser = createParser({
      onEvent: (e: EventSourceMessage) => { this.events.push({ id: e.id, event: e.event, data: e.data }); this.#notify() },
      onRetry: (ms: number) => { this.retries.push(ms) }
    })
    const body = res.body
    if (body === null) throw new Error('no body')
    if ((res.headers.get('content-type') ?? '').startsWith('application/json')) {
      // A POST answered before anything else came is one JSON body (lazy SSE): its messages are
      // read as data events without ids, as an SSE stream without priming would carry them.
      this.finished = (async () => {
        try {
          const value = JSON.parse(await res.text()) as unknown
          for (const message of Array.isArray(value) ? value : [value]) this.events.push({ id: undefined, event: undefined, data: JSON.stringify(message) })
        } catch {
          // aborted by the test
        } finally {
          this.#done = true
          this.#notify()
        }
      })()
      return
    }
    this.finished = (async () => {
      const decoder = new TextDecoder()
      try {
        for await (const chunk of body) parser.feed(decoder.decode(chunk as Uint8Array, { stream: true }))
      } catch {
        // aborted by the test
      } finally {
        this.#done = true
        this.#notify()
      }
    })()
  }

  get done (): boolean { return this.#done }

  #notify (): void {
    const waiters = this.#waiters
    this.#waiters = []
    for (const w of waiters) w()
  }

  /** Waits until `predicate` holds over the events seen (or the stream ends), up to `ms`. */
  async until (predicate: (events: SseEvent[]) => boolean, ms = 10_000): Promise<SseEvent[]> {
    const deadline = Date.now() + ms
    while (!predicate(this.events)) {
      if (this.#done) throw new Error(`stream ended before the condition held; events: ${JSON.stringify(this.events).slice(0, 500)}`)
      const left = deadline - Date.now()
      if (left <= 0) throw new Error(`timed out; events: ${JSON.stringify(this.events).slice(0, 500)}`)
      await new Promise<void>(resolve => {
        const timer = setTimeout(resolve, left)
        this.#waiters.push(() => { clearTimeout(timer); resolve() })
      })
    }
    return this.events
  }

  /** JSON payloads of the non-empty data events. */
  messages (): Array<Record<string, unknown>> {
    return this.events.filter(e => e.data !== '').map(e => JSON.parse(e.data) as Record<string, unknown>)
  }
}
