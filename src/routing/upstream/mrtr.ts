// Parked calls of Multi Round-Trip Requests (docs/behaviour.md, "2026-07-28 (stateless) requests"): a legacy
// backend's mid-call server-to-client requests, handed to a modern client as an `input_required`
// result, wait here for the client's retry. The call itself stays in flight on its pooled
// connection (pool.ts); the retry's `inputResponses` answer the backend's requests.
//
// `requestState` is the client's only handle on a parked call, and client input: it is signed
// (HMAC-SHA256) over its content and the caller's principal, so a tampered state, another
// principal's state, an expired one or one already used is refused (-32602). Single use: taking a
// parked call removes it. A call nobody comes back for is cancelled at its expiry.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto'
import { GW_ERR_INVALID_PARAMS } from '../../core/errors.js'
import type { JsonRpcResponse } from '../../core/jsonrpc.js'
import type { PooledCall } from './pool.js'

/** A backend request waiting for the client's answer: its opaque id and what the client is asked. */
export interface InputRequest {
  opaqueId: string
  method: string
  params: Record<string, unknown>
}

export interface ParkedCall {
  call: PooledCall
  server: string
  /** The backend's serverInfo, for the results of the rounds to come. */
  serverInfo: Record<string, unknown>
  /** The method of the original request (a retry must name the same). */
  method: string
  /** Input requests the client has not answered yet, by the key the client sees. */
  pending: Map<string, InputRequest>
  /** The backend's answer, when it came while the call was parked (the retry gets it at once). */
  final?: JsonRpcResponse
  /** Called when the parked call expires unclaimed. */
  onExpire: () => void
}

interface Entry {
  parked: ParkedCall
  principal: string
  timer: NodeJS.Timeout
}

interface StatePayload {
  /** Handle of the parked call. */
  h: string
  /** Replica that parked it. */
  r: string
  /** Expiry, ms since the epoch. */
  e: number
}

export interface ParkedCallsOptions {
  replicaId: string
  /** How long a parked call waits for the client's retry. */
  ttlMs: number
  /** HMAC key; random per process when absent (then a state is only good on this replica). */
  secret?: Buffer
}

export class ParkedCalls {
  readonly #options: ParkedCallsOptions
  readonly #secret: Buffer
  readonly #entries = new Map<string, Entry>()
  #seq = 0

  constructor (options: ParkedCallsOptions) {
    this.#options = options
    this.#secret = options.secret ?? randomBytes(32)
  }

  get size (): number { return this.#entries.size }

  /** Calls parked for one principal now. */
  countOf (principal: string): number {
    let n = 0
    for (const entry of this.#entries.values()) if (entry.principal === principal) n++
    return n
  }

  /** Parks a call for `principal`; returns the signed requestState that claims it. */
  park (parked: ParkedCall, principal: string): string {
    const handle = `${++this.#seq}.${randomBytes(9).toString('base64url')}`
    const ttlMs = this.#options.ttlMs
    const timer = setTimeout(() => {
      if (this.#entries.delete(handle)) parked.onExpire()
    }, ttlMs)
    timer.unref()
    this.#entries.set(handle, { parked, principal, timer })
    const payload: StatePayload = { h: handle, r: this.#options.replicaId, e: Date.now() + ttlMs }
    const body = Buffer.from(JSON.stringify(payload)).toString('base64url')
    return `${body}.${this.#sign(body, principal)}`
  }

  /**
   * The replica a requestState names, unverified (only that replica holds the key): where a retry
   * that landed elsewhere is forwarded. Undefined when it is not a state at all.
   */
  replicaOf (requestState: unknown): string | undefined {
    if (typeof requestState !== 'string' || requestState.length > 1024) return undefined
    try {
      const payload = JSON.parse(Buffer.from(requestState.slice(0, requestState.indexOf('.')), 'base64url').toString('utf8')) as Partial<StatePayload>
      return typeof payload.r === 'string' && /^[A-Za-z0-9_-]{1,100}$/.test(payload.r) ? payload.r : undefined
    } catch {
      return undefined
    }
  }

  /**
   * Verifies a requestState and takes its parked call (single use). Throws -32602 for anything
   * tampered, foreign, expired, replayed or parked on another replica.
   */
  take (requestState: unknown, principal: string): ParkedCall {
    const payload = this.#verify(requestState, principal)
    if (payload.r !== this.#options.replicaId) throw new GW_ERR_INVALID_PARAMS('requestState belongs to a call parked on another replica, which cannot be reached from here')
    const entry = this.#entries.get(payload.h)
    if (entry === undefined) throw new GW_ERR_INVALID_PARAMS('requestState was already used or has expired')
    this.#entries.delete(payload.h)
    clearTimeout(entry.timer)
    return entry.parked
  }

  /** Shutdown: every parked call is cancelled. */
  clear (): void {
    for (const entry of this.#entries.values()) {
      clearTimeout(entry.timer)
      entry.parked.onExpire()
    }
    this.#entries.clear()
  }

  #sign (body: string, principal: string): string {
    return createHmac('sha256', this.#secret).update(body).update('\0').update(principal).digest('base64url')
  }

  #verify (requestState: unknown, principal: string): StatePayload {
    if (typeof requestState !== 'string' || requestState.length > 1024) throw new GW_ERR_INVALID_PARAMS('requestState is not one this gateway issued')
    const dot = requestState.indexOf('.')
    const body = requestState.slice(0, dot)
    const given = Buffer.from(requestState.slice(dot + 1), 'base64url')
    const expected = Buffer.from(this.#sign(body, principal), 'base64url')
    if (dot <= 0 || given.length !== expected.length || !timingSafeEqual(given, expected)) {
      throw new GW_ERR_INVALID_PARAMS('requestState is not one this gateway issued to this caller (tampered or foreign)')
    }
    let payload: StatePayload
    try {
      payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as StatePayload
    } catch {
      throw new GW_ERR_INVALID_PARAMS('requestState is malformed')
    }
    if (typeof payload.h !== 'string' || typeof payload.r !== 'string' || typeof payload.e !== 'number') throw new GW_ERR_INVALID_PARAMS('requestState is malformed')
    if (payload.e < Date.now()) throw new GW_ERR_INVALID_PARAMS('requestState has expired')
    return payload
  }
}
