// Task requests of pooled sessions that this replica passed to the replica holding the task with
// no pending marker naming that replica: one that came over the legacy HTTP+SSE transport (its
// stream keeps no markers) or inside a 2025-03-26 batch (the POST's markers name this replica).
// Every request the gateway accepted gets exactly one answer (docs/spec-rules.md, J-4): if the
// holder dies before answering, the answer is -32007 from here, written only when the stream's log
// holds no answer to that request yet (the holder's, had it come first, stays the only one).
// A single-request POST needs none of this: its marker names the holder (PooledSessions.admit).
import type { Logger } from 'pino'
import { GW_ERR_BACKEND_LOST, toJsonRpcError } from '../../core/errors.js'
import type { JsonRpcMessage, RequestId } from '../../core/jsonrpc.js'
import { shortHash } from '../../telemetry/logger.js'

/** How often the holders of the requests passed on are looked at (a heartbeat lapses in a few seconds). */
const WATCH_MS = 1_000

/** One request passed to the replica holding its task. */
export interface ForwardedTaskRequest {
  sid: string
  streamId: string
  id: RequestId
  replica: string
  server: string
  /** When its task's record expires: no answer is owed past it (nor kept track of). */
  until: number
}

export interface ForwardedTaskOptions {
  /** Whether a replica's heartbeat is there now. */
  isAlive: (replica: string) => Promise<boolean>
  /** Appends an answer unless the stream's log holds one to its request already. */
  answerOnce: (sid: string, streamId: string, message: JsonRpcMessage) => Promise<void>
  log: Logger
}

export class ForwardedTaskRequests {
  readonly #options: ForwardedTaskOptions
  readonly #requests = new Set<ForwardedTaskRequest>()
  readonly #timer: NodeJS.Timeout
  #checking = false

  constructor (options: ForwardedTaskOptions) {
    this.#options = options
    this.#timer = setInterval(() => {
      if (this.#checking || this.#requests.size === 0) return
      this.#checking = true
      this.#check().catch(err => { options.log.warn({ err }, 'holders of forwarded task requests not checked') }).finally(() => { this.#checking = false })
    }, WATCH_MS)
    this.#timer.unref()
  }

  /** A request passed on just now (before its envelope is sent: a holder dying meanwhile is seen too). */
  watch (request: ForwardedTaskRequest): void {
    this.#requests.add(request)
  }

  sessionEnded (sid: string): void {
    for (const request of this.#requests) if (request.sid === sid) this.#requests.delete(request)
  }

  stop (): void {
    clearInterval(this.#timer)
    this.#requests.clear()
  }

  async #check (): Promise<void> {
    const now = Date.now()
    const alive = new Map<string, Promise<boolean>>()
    for (const request of [...this.#requests]) {
      if (request.until <= now) { this.#requests.delete(request); continue }
      let holder = alive.get(request.replica)
      if (holder === undefined) alive.set(request.replica, holder = this.#options.isAlive(request.replica))
      if (await holder) continue
      this.#requests.delete(request)
      const answer = toJsonRpcError(new GW_ERR_BACKEND_LOST(request.server, `replica ${request.replica} holding the task is gone`), request.id)
      await this.#options.answerOnce(request.sid, request.streamId, answer).catch(err => {
        this.#options.log.warn({ err, sid: shortHash(request.sid) }, 'answer to a task request of a lost replica not appended')
      })
    }
  }
}
