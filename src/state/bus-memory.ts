// Memory twin of the bus. Several gateway apps in one process (tests, single-process mode) share
// one MemoryBusHub, the in-process stand-in for Redis inbox streams.
import type { Bus, Envelope, EnvelopeHandler } from './bus.js'

/** Registry of the replicas reading an inbox in this process: replicaId -> handler. */
export class MemoryBusHub {
  readonly #handlers = new Map<string, EnvelopeHandler>()

  register (replicaId: string, handler: EnvelopeHandler): void {
    if (this.#handlers.has(replicaId)) throw new Error(`replica ${replicaId} already reads an inbox on this hub`)
    this.#handlers.set(replicaId, handler)
  }

  unregister (replicaId: string, handler: EnvelopeHandler): void {
    if (this.#handlers.get(replicaId) === handler) this.#handlers.delete(replicaId)
  }

  handlerOf (replicaId: string): EnvelopeHandler | undefined {
    return this.#handlers.get(replicaId)
  }
}

export interface MemoryBusOptions {
  /** Called when the handler throws; without it the error is rethrown (uncaught), never lost. */
  onHandlerError?: (err: unknown, envelope: Envelope) => void
}

export class MemoryBus implements Bus {
  readonly ordered = false

  prepareWake (): undefined { return undefined }
  /** One process: no replica of this hub dies while another reads on. */
  async takeUnread (): Promise<[]> { return [] }
  readonly #hub: MemoryBusHub
  readonly #onHandlerError: MemoryBusOptions['onHandlerError']
  #replicaId: string | null = null
  #registered: EnvelopeHandler | null = null

  constructor (hub: MemoryBusHub = new MemoryBusHub(), opts: MemoryBusOptions = {}) {
    this.#hub = hub
    this.#onHandlerError = opts.onHandlerError
  }

  async start (replicaId: string, handler: EnvelopeHandler): Promise<void> {
    if (this.#registered !== null) throw new Error('bus already started')
    const registered: EnvelopeHandler = envelope => {
      try {
        handler(envelope)
      } catch (err) {
        if (this.#onHandlerError === undefined) throw err
        this.#onHandlerError(err, envelope)
      }
    }
    this.#hub.register(replicaId, registered)
    this.#replicaId = replicaId
    this.#registered = registered
  }

  async send (replicaId: string, envelope: Envelope): Promise<void> {
    // A copy, as the Redis twin's JSON round trip makes: sender and receiver never share objects.
    const copy = structuredClone(envelope)
    // Always on a later turn, never inside the sender's call stack (no re-entrancy); the handler
    // is looked up on delivery, so a replica that closed meanwhile gets nothing. An unknown
    // replica is a silent drop, as an inbox nobody reads is in Redis.
    setImmediate(() => this.#hub.handlerOf(replicaId)?.(copy))
  }

  async close (): Promise<void> {
    if (this.#replicaId !== null && this.#registered !== null) this.#hub.unregister(this.#replicaId, this.#registered)
    this.#replicaId = null
    this.#registered = null
  }
}
