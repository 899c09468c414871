// One 2026-07-28 request in front of a legacy backend (docs/architecture.md): what its pooled
// call (routing/upstream/pool.ts) sends goes to the client's response, and the backend's mid-call
// sampling, elicitation or roots requests become `input_required` rounds (M-8): for a
// capability the request did not declare the call is withdrawn with -32021; otherwise the asks
// that arrive together go out as one round, the call is parked (routing/upstream/mrtr.ts) under a signed
// requestState, and the retry's `inputResponses` answer the backend, round after round.
import {
  GW_ERR_MISSING_CAPABILITY, GW_ERR_RATE_LIMITED, withData, withRetryAfter
} from '../core/errors.js'
import {
  isRecord, isRequest, isResponse, type JsonRpcErrorObject, type JsonRpcMessage, type JsonRpcRequest, type JsonRpcResponse, type RequestId
} from '../core/jsonrpc.js'
import type { PoolSink, PooledCall } from '../routing/upstream/pool.js'
import type { InputRequest, ParkedCall, ParkedCalls } from '../routing/upstream/mrtr.js'
import { completeResult, logPasses, type RequestEnvelope } from './modern-rules.js'
import type { ResponseSink } from './modern-response.js'
import { capabilityNeededBy } from '../core/mcp.js'

/** Methods that may answer with `input_required` (M-8); elsewhere a backend's request is refused. */
const MRTR_METHODS = new Set(['tools/call', 'prompts/get', 'resources/read'])
/** Server-to-client requests and the client capability each needs. */
/** Server requests that arrive this close together are handed to the client in one round. */
const ROUND_GATHER_MS = 15
/** Where a legacy backend may name the key of its ask (see inputRequestOf). */
const INPUT_KEY_META = 'mcp-gateway/inputKey'
/** Calls one principal may have parked at once (each holds a backend connection). */
export const MAX_PARKED_PER_PRINCIPAL = 32
const PARKED_RETRY_AFTER_S = 10


/**
 * One client request and its answer: relays what the pooled call sends, turns the backend's
 * server-to-client requests into `input_required` rounds, and parks the call between rounds.
 */
export class Exchange implements PoolSink {
  readonly #parkedCalls: ParkedCalls
  readonly #out: ResponseSink
  readonly #request: JsonRpcRequest
  readonly #envelope: RequestEnvelope
  readonly #server: string
  readonly #principal: string
  readonly #serverInfo: Record<string, unknown>
  readonly #progressToken: RequestId | undefined
  #call: PooledCall | null = null
  /** Server requests gathered for the next input_required round, by the key the client sees. */
  readonly #pending = new Map<string, InputRequest>()
  #gather: NodeJS.Timeout | undefined
  #parked = false
  /** Answers the client sent before being asked (inputResponses without requestState), by key. */
  readonly #preAnswers: Record<string, unknown>

  constructor (parkedCalls: ParkedCalls, out: ResponseSink, request: JsonRpcRequest, envelope: RequestEnvelope, server: string, principal: string,
    serverInfo: Record<string, unknown>, preAnswers: Record<string, unknown>) {
    this.#parkedCalls = parkedCalls
    this.#preAnswers = preAnswers
    this.#out = out
    this.#request = request
    this.#envelope = envelope
    this.#server = server
    this.#principal = principal
    this.#serverInfo = serverInfo
    const meta = isRecord(request.params) && isRecord(request.params._meta) ? request.params._meta : undefined
    const token = meta?.progressToken
    this.#progressToken = typeof token === 'string' || typeof token === 'number' ? token : undefined
    out.onClientGone = () => {
      clearTimeout(this.#gather)
      // Closing the response stream cancels the request (M-11), unless it waits parked for a retry.
      if (!this.#parked) this.#call?.cancel('the client closed the response stream')
    }
  }

  start (call: PooledCall): void {
    this.#call = call
    if (this.#out.done) call.cancel('the client closed the response stream')
  }

  /** A retry: takes over the parked call and answers the backend's requests it carries. */
  resume (parked: ParkedCall, inputResponses: unknown): void {
    this.#call = parked.call
    if (parked.final !== undefined) {
      // The backend answered while the call was parked (it gave up waiting, or failed).
      this.#finish(parked.final)
      return
    }
    parked.call.rebind(this)
    const responses = isRecord(inputResponses) ? inputResponses : {}
    for (const [key, input] of parked.pending) {
      const answer = responses[key]
      // Unknown keys are ignored; a missing or malformed answer is asked again (M-8 SHOULD).
      if (!validInputResponse(input.method, answer)) { this.#pending.set(key, input); continue }
      parked.call.answer({ jsonrpc: '2.0', id: input.opaqueId, result: answer })
    }
    // Inputs the retry did not answer are asked again (SHOULD), with any the backend added meanwhile.
    if (this.#pending.size > 0) this.#scheduleRound(0)
    if (this.#out.done) this.#call.cancel('the client closed the response stream')
  }

  onMessage (message: JsonRpcMessage): void {
    if (isResponse(message)) {
      clearTimeout(this.#gather)
      this.#finish(message)
      return
    }
    if (isRequest(message)) {
      this.#onServerRequest(message)
      return
    }
    if (this.#parked || this.#out.done) return
    const params = isRecord(message.params) ? message.params : {}
    if (message.method === 'notifications/progress') {
      if (this.#progressToken === undefined) return
      this.#out.notify({ ...message, params: { ...params, progressToken: this.#progressToken } })
    } else if (message.method === 'notifications/message') {
      if (logPasses(params.level, this.#envelope.logLevel)) this.#out.notify(message)
    }
  }

  #finish (response: JsonRpcResponse): void {
    const id = this.#request.id
    if ('error' in response) {
      // An unknown method is 404 in this era (H-26-1), the backend's answer says so.
      const status = response.error.code === -32601 ? 404 : 200
      this.#out.finish({ ...response, id, error: modernError(this.#request, response.error) }, status)
      return
    }
    this.#out.finish({ jsonrpc: '2.0', id, result: completeResult(this.#request.method, response.result, this.#serverInfo) })
  }

  #onServerRequest (request: JsonRpcRequest): void {
    const call = this.#call
    if (call === null) return
    const capability = capabilityNeededBy(request.method)
    if (capability === undefined || !MRTR_METHODS.has(this.#request.method)) {
      call.answer({ jsonrpc: '2.0', id: request.id, error: { code: -32601, message: `${request.method} is not available to a ${this.#request.method} request of protocol 2026-07-28` } })
      return
    }
    if (this.#envelope.clientCapabilities[capability] === undefined) {
      // The request did not declare what the backend needs (M-5): -32021, and the call is withdrawn.
      call.answer({ jsonrpc: '2.0', id: request.id, error: { code: -32601, message: `the client did not declare the '${capability}' capability` } })
      this.#parked = false
      call.cancel(`missing client capability ${capability}`)
      this.#out.fail(withData(new GW_ERR_MISSING_CAPABILITY(capability), { requiredCapabilities: { [capability]: {} } }), this.#request.id)
      return
    }
    const input = inputRequestOf(request, this.#pending)
    const early = this.#preAnswers[input.key]
    if (validInputResponse(input.method, early)) {
      delete this.#preAnswers[input.key]
      call.answer({ jsonrpc: '2.0', id: input.opaqueId, result: early })
      return
    }
    this.#pending.set(input.key, input)
    this.#scheduleRound(ROUND_GATHER_MS)
  }

  /** After a short gathering window, hands the pending server requests to the client as one round. */
  #scheduleRound (delayMs: number): void {
    if (this.#gather !== undefined) return
    this.#gather = setTimeout(() => {
      this.#gather = undefined
      this.#round()
    }, delayMs)
    this.#gather.unref()
  }

  #round (): void {
    const call = this.#call
    if (call === null || this.#out.done || this.#pending.size === 0) return
    const pending = new Map(this.#pending)
    this.#pending.clear()
    const inputRequests: Record<string, unknown> = {}
    for (const [key, input] of pending) inputRequests[key] = { method: input.method, params: input.params }
    if (this.#parkedCalls.countOf(this.#principal) >= MAX_PARKED_PER_PRINCIPAL) {
      // Each parked call holds a backend connection: one caller may not hold them all.
      call.cancel('too many calls waiting for input')
      this.#out.fail(withRetryAfter(new GW_ERR_RATE_LIMITED(PARKED_RETRY_AFTER_S), PARKED_RETRY_AFTER_S), this.#request.id)
      return
    }
    const parkedSink = new ParkedSink()
    const parked: ParkedCall = {
      call,
      server: this.#server,
      serverInfo: this.#serverInfo,
      method: this.#request.method,
      pending,
      onExpire: () => { call.cancel('the client did not come back for an input_required result') }
    }
    parkedSink.parked = parked
    call.rebind(parkedSink)
    this.#parked = true
    const requestState = this.#parkedCalls.park(parked, this.#principal)
    this.#out.finish({ jsonrpc: '2.0', id: this.#request.id, result: { resultType: 'input_required', inputRequests, requestState } })
  }
}

/** The key a backend's ask gets in `inputRequests`, and what the client is asked (see inputRequestOf). */
interface KeyedInput extends InputRequest { key: string }

/**
 * A backend's server-to-client request as an input request. Its key is the one the backend named in
 * `_meta["mcp-gateway/inputKey"]` (a gateway extension: a 2025-era request has no such key, and a
 * backend that wants stable keys across retries can name them), else the request's opaque id.
 */
function inputRequestOf (request: JsonRpcRequest, taken: ReadonlyMap<string, InputRequest>): KeyedInput {
  const params = isRecord(request.params) ? { ...request.params } : {}
  let key = String(request.id)
  if (isRecord(params._meta)) {
    const { [INPUT_KEY_META]: named, ...meta } = params._meta
    if (typeof named === 'string' && /^[A-Za-z0-9_.-]{1,64}$/.test(named) && !taken.has(named)) key = named
    if (Object.keys(meta).length > 0) params._meta = meta
    else delete params._meta
  }
  return { key, opaqueId: String(request.id), method: request.method, params }
}

/** Whether a client's input response has the shape its method's result needs (else it is asked again). */
function validInputResponse (method: string, value: unknown): value is Record<string, unknown> {
  if (!isRecord(value)) return false
  switch (method) {
    case 'sampling/createMessage':
      return typeof value.role === 'string' && typeof value.model === 'string' && (isRecord(value.content) || Array.isArray(value.content))
    case 'elicitation/create':
      return value.action === 'accept' || value.action === 'decline' || value.action === 'cancel'
    case 'roots/list':
      return Array.isArray(value.roots)
    default:
      return false
  }
}

/**
 * A backend's error in this era: a resource that does not exist is -32602 (2025's -32002) and
 * names its uri in `data` (SEP-2164).
 */
export function modernError (request: JsonRpcRequest, error: JsonRpcErrorObject): JsonRpcErrorObject {
  if (request.method !== 'resources/read' || (error.code !== -32002 && error.code !== -32602)) return error
  const uri = isRecord(request.params) ? request.params.uri : undefined
  const data = isRecord(error.data) ? error.data : {}
  return { ...error, code: -32602, data: { ...data, uri: data.uri ?? uri } }
}

/**
 * Holds a parked call between rounds: backend requests that arrive meanwhile join its pending
 * inputs (asked in the next round); an answer or error that arrives meanwhile is kept for the retry.
 */
class ParkedSink implements PoolSink {
  parked: ParkedCall | undefined

  onMessage (message: JsonRpcMessage): void {
    const parked = this.parked
    if (parked === undefined) return
    if (isRequest(message) && capabilityNeededBy(message.method) !== undefined) {
      const input = inputRequestOf(message, parked.pending)
      parked.pending.set(input.key, input)
    } else if (isRequest(message)) {
      parked.call.answer({ jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `${message.method} is not available to a modern request` } })
    } else if (isResponse(message)) {
      parked.final = message
    }
    // Notifications of a parked call have no stream to go to: dropped.
  }
}
