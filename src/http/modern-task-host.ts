// A 2026-07-28 tools/call the gateway may turn into a task it hosts (Tasks extension,
// io.modelcontextprotocol/tasks, docs/behaviour.md "2026-07-28 Tasks"): the exchange writes to this
// sink as to the client's response; while the call answers within `hostAfterMs` it passes straight
// through. Past that, the task's record is written first (a task handle is returned only once any
// replica's tasks/get finds it, M-19), the client gets the handle (`resultType: "task"`), and the call
// goes on here: its answer, or error, becomes the record's outcome. A pooled call whose backend asks
// the client for input after that makes the task `input_required` with the asks as its
// `inputRequests`; tasks/update answers them (ModernTasks resumes the parked call into this sink).
import { randomBytes } from 'node:crypto'
import { toJsonRpcError, type GatewayError } from '../core/errors.js'
import { isRecord, type JsonRpcMessage, type JsonRpcRequest, type RequestId } from '../core/jsonrpc.js'
import type { TaskHostingConfig } from '../config/schema.js'
import type { TaskOutcome, TaskRecord } from '../state/task-store.js'
import type { ResponseSink } from './modern-response.js'
import type { RequestEnvelope } from './modern-rules.js'

/** What the host needs to know of the request and of the gateway around it. */
export interface HostedRequest {
  /** The configured server the client addressed. */
  server: string
  tenant: string | null
  subjectDigest: string | null
  /** The principal's key: what a parked call of the request is bound to. */
  principal: string
  request: JsonRpcRequest
  envelope: RequestEnvelope
  settings: TaskHostingConfig
  /**
   * Whether an input_required round after the handle went out can be answered with tasks/update
   * (a pooled call, parked here); else the task fails.
   */
  resumable: boolean
  /** What else a cancel stops (a bridged call: the backend's own task). */
  onCancel?: () => void
}

/** What the host asks of the task registry (ModernTasks). */
export interface HostRegistry {
  readonly replicaId: string
  /** Writes the record; throws when it could not be written (then no handle is given). */
  create (record: TaskRecord): Promise<void>
  /** The call now runs as task `taskId` here; `cancel` stops it (tasks/cancel). */
  running (taskId: string, cancel: () => void): void
  /** The call ended: its outcome is stored, the task leaves this replica's table. */
  ended (taskId: string, outcome: TaskOutcome, task: Record<string, unknown>): void
  /** A 2025 backend described its own task again (bridged): the record's task becomes `task`. */
  described (taskId: string, task: Record<string, unknown>): void
  /** The call is parked under `requestState` until tasks/update answers its asks. */
  waiting (taskId: string, requestState: unknown, task: Record<string, unknown>, sink: HostingSink): void
  /** A parked call that cannot be resumed (see HostedRequest.resumable): dropped. */
  drop (requestState: unknown, principal: string): void
  warn (err: unknown, msg: string): void
}

const RELATED_TASK = 'io.modelcontextprotocol/related-task'

/** An unguessable task id (SEP-2663: ids may serve as bearer handles). */
export const mintTaskId = (): string => `gwt-${randomBytes(24).toString('base64url')}`

/** The task as the client sees it (2026-07-28 `Task`), with `status` and an updated stamp. */
export function taskWith (task: Record<string, unknown>, status: string, statusMessage?: string): Record<string, unknown> {
  const next: Record<string, unknown> = { ...task, status, lastUpdatedAt: new Date().toISOString() }
  if (status !== 'input_required') delete next.inputRequests
  if (statusMessage !== undefined) next.statusMessage = statusMessage
  else delete next.statusMessage
  return next
}

export class HostingSink implements ResponseSink {
  readonly #out: ResponseSink
  readonly #request: HostedRequest
  readonly #registry: HostRegistry
  #state: 'direct' | 'creating' | 'hosted' | 'waiting' | 'ended' = 'direct'
  #timer: NodeJS.Timeout | undefined
  #task: Record<string, unknown> | undefined
  /** The answer that came while the record was being written. */
  #early: JsonRpcMessage | undefined
  /** What a bridged backend last said of its own task (notifications/tasks/status). */
  #said: { status: unknown, statusMessage: string | undefined } | undefined
  /** Set by the exchange: cancels the call (the client went away, or the task was cancelled). */
  onClientGone: (() => void) | undefined

  constructor (out: ResponseSink, request: HostedRequest, registry: HostRegistry) {
    this.#out = out
    this.#request = request
    this.#registry = registry
    out.onClientGone = () => { if (this.#state === 'direct') this.onClientGone?.() }
    this.#timer = setTimeout(() => { this.#host().catch(err => { registry.warn(err, 'hosted task not created') }) }, request.settings.hostAfterMs)
    this.#timer.unref()
  }

  get done (): boolean {
    return this.#state === 'direct' || this.#state === 'creating' ? this.#out.done : this.#state !== 'hosted'
  }

  /** The request the task was made of (a resumed exchange answers for it). */
  get hosted (): HostedRequest { return this.#request }

  /** tasks/update resumes the parked call into this sink. */
  rearm (): void {
    if (this.#state !== 'waiting' || this.#task === undefined) return
    this.#state = 'hosted'
    this.#task = taskWith(this.#task, 'working')
  }

  /**
   * A bridged 2025 backend's status of its own task: its statusMessage becomes the task's while the
   * task is live. The status itself follows what reaches the gateway on the task's `tasks/result`
   * (input_required once the backend's asks arrive, its result or error at the end), so a task never
   * says input_required without the inputRequests to answer.
   */
  said (status: unknown, statusMessage: unknown): void {
    const message = typeof statusMessage === 'string' ? statusMessage : undefined
    this.#said = { status, statusMessage: message }
    const task = this.#task
    // A terminal status comes with the task's result, on its tasks/result.
    if (task === undefined || task.statusMessage === message || status === 'completed' || status === 'failed' || status === 'cancelled') return
    if (this.#state === 'hosted') this.#task = taskWith(task, 'working', message)
    else if (this.#state === 'waiting' && status === 'input_required') this.#task = { ...taskWith(task, 'input_required', message), inputRequests: task.inputRequests }
    else return
    this.#registry.described(String(task.taskId), this.#task)
  }

  notify (message: JsonRpcMessage): void {
    // A task's progress and log lines have no stream once the handle went out (SEP-2663).
    if (this.#state === 'direct') this.#out.notify(message)
  }

  finish (message: JsonRpcMessage, status?: number): void {
    switch (this.#state) {
      case 'direct':
        clearTimeout(this.#timer)
        this.#state = 'ended'
        this.#out.finish(message, status)
        return
      case 'creating':
        this.#early ??= message
        return
      case 'hosted':
        this.#settle(message)
    }
  }

  fail (err: GatewayError, id: RequestId | null): void {
    this.finish(toJsonRpcError(err, id), err.statusCode ?? 500)
  }

  async #host (): Promise<void> {
    if (this.#state !== 'direct' || this.#out.done) return
    this.#state = 'creating'
    const { settings } = this.#request
    const now = Date.now()
    const at = new Date(now).toISOString()
    const id = mintTaskId()
    const task = { taskId: id, status: 'working', createdAt: at, lastUpdatedAt: at, ttlMs: settings.ttlMs, pollIntervalMs: settings.pollIntervalMs }
    try {
      await this.#registry.create({
        id,
        tenant: this.#request.tenant,
        subjectDigest: this.#request.subjectDigest,
        sessionId: null,
        server: this.#request.server,
        replica: this.#registry.replicaId,
        connectionId: null,
        backendTaskId: null,
        task,
        createdAt: now,
        expiresAt: now + settings.ttlMs
      })
    } catch (err) {
      // No record, no handle: the client keeps waiting for the call itself.
      this.#state = 'direct'
      const early = this.#early
      if (early !== undefined) this.finish(early)
      throw err
    }
    this.#task = task
    this.#state = 'hosted'
    this.#registry.running(id, () => {
      this.#state = 'ended'
      this.onClientGone?.()
      this.#request.onCancel?.()
    })
    this.#out.finish({ jsonrpc: '2.0', id: this.#request.request.id, result: { resultType: 'task', ...task } })
    const early = this.#early
    if (early !== undefined) this.#settle(early)
  }

  /** The call's answer after the handle went out: completed (a result, isError included) or failed (an error). */
  #settle (message: JsonRpcMessage): void {
    const task = this.#task
    if (task === undefined) return
    this.#state = 'ended'
    if ('error' in message) {
      this.#registry.ended(String(task.taskId), { error: message.error }, taskWith(task, 'failed'))
      return
    }
    if (!('result' in message)) return
    const result = isRecord(message.result) ? { ...message.result } : {}
    if (result.resultType === 'input_required' && this.#request.resumable) {
      // The backend asks the client something: the task says so, tasks/update answers.
      this.#state = 'waiting'
      const asked = this.#said?.status === 'input_required' ? this.#said.statusMessage : undefined
      this.#task = { ...taskWith(task, 'input_required', asked), inputRequests: isRecord(result.inputRequests) ? result.inputRequests : {} }
      this.#registry.waiting(String(task.taskId), result.requestState, this.#task, this)
      return
    }
    if (result.resultType === 'input_required') {
      // A 2026-07-28 backend's round: its state is the backend's, no tasks/update can carry it.
      this.#registry.drop(result.requestState, this.#request.principal)
      const error = { code: -32603, message: "the tool asked for client input after the gateway made the call a task; a 2026-07-28 backend's input rounds are not relayed to hosted tasks" }
      this.#registry.ended(String(task.taskId), { error }, taskWith(task, 'failed', error.message))
      return
    }
    // A 2025 backend's task result names its task; the 2026-07-28 task carries its id at the top.
    if (isRecord(result._meta) && RELATED_TASK in result._meta) {
      const { [RELATED_TASK]: _, ...meta } = result._meta
      result._meta = meta
    }
    this.#registry.ended(String(task.taskId), { result }, taskWith(task, 'completed'))
  }
}
