// Where the answer of a 2026-07-28 request is written (http/modern.ts, modern-exchange.ts): the
// client's HTTP response on this replica (ModernResponse), or, for an MRTR retry that landed on
// another replica, that replica's response over the bus (RemoteResponse, `mrtr-out` envelopes).
//
// ModernResponse is lazy: JSON when the answer is the first thing to send (one write, and an HTTP
// status for the spec's 400/404 errors), SSE as soon as a notification comes first.
import type { ServerResponse } from 'node:http'
import { toJsonRpcError, type GatewayError } from '../core/errors.js'
import { isRecord, type JsonRpcMessage, type RequestId } from '../core/jsonrpc.js'
import type { Envelope } from '../state/bus.js'

/** What the face needs of the other replicas: an MRTR retry goes to the replica holding its call. */
export interface Peers {
  replicaId: string
  send (replica: string, envelope: Envelope): Promise<void>
  isAlive (replica: string): Promise<boolean>
}

/** Where an exchange writes: the client's HTTP response here, or another replica's (RemoteResponse). */
export interface ResponseSink {
  readonly done: boolean
  onClientGone: (() => void) | undefined
  notify (message: JsonRpcMessage): void
  finish (message: JsonRpcMessage, status?: number): void
  fail (err: GatewayError, id: RequestId | null): void
}

/**
 * One modern response: JSON until something other than the answer must be sent, then SSE. Ends
 * exactly once; after the client went away nothing is written.
 */
export class ModernResponse implements ResponseSink {
  readonly #res: ServerResponse
  readonly #headers: Record<string, string>
  readonly #keepAliveMs: number
  #sse = false
  #done = false
  #keepAlive: NodeJS.Timeout | undefined
  onClientGone: (() => void) | undefined

  /** `keepAliveMs`: the SSE comment keep-alive interval once the response streams (http.keepAliveMs). */
  constructor (res: ServerResponse, headers: Record<string, string>, keepAliveMs: number) {
    this.#res = res
    this.#headers = headers
    this.#keepAliveMs = keepAliveMs
    const socket = res.socket
    // The client may have gone while the request waited for a backend connection.
    if (socket === null || socket.destroyed) this.#done = true
    res.on('close', () => {
      // A client that went away mid-response can leave its socket open and the request unfinished
      // in the server's eyes, which would hold a shutdown for a whole keep-alive timeout.
      if (!res.writableFinished) socket?.destroy()
      if (this.#done) return
      this.#done = true
      clearInterval(this.#keepAlive)
      this.onClientGone?.()
    })
  }

  get done (): boolean { return this.#done }

  notify (message: JsonRpcMessage): void {
    if (this.#done) return
    if (!this.#sse) {
      this.#sse = true
      this.#res.writeHead(200, { ...this.#headers, 'content-type': 'text/event-stream', 'cache-control': 'no-cache, no-transform', 'x-accel-buffering': 'no' })
      this.#keepAlive = setInterval(() => { if (!this.#done) this.#res.write(': keepalive\n\n') }, this.#keepAliveMs)
      this.#keepAlive.unref()
    }
    this.#res.write(`event: message\ndata: ${JSON.stringify(message)}\n\n`)
  }

  /**
   * The final message; `status` applies only while nothing was streamed yet. A 429 or 503 carries
   * the Retry-After its error names (retryAfterOf), whether the error was made here or came over
   * the bus from the replica holding a forwarded call.
   */
  finish (message: JsonRpcMessage, status = 200): void {
    if (this.#done) return
    this.#done = true
    clearInterval(this.#keepAlive)
    const text = JSON.stringify(message)
    if (this.#sse) {
      this.#res.end(`event: message\ndata: ${text}\n\n`)
      return
    }
    const extra = status === 429 || status === 503 ? retryAfterOf(message) : {}
    this.#res.writeHead(status, { ...this.#headers, ...extra, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) })
    this.#res.end(text)
  }

  fail (err: GatewayError, id: RequestId | null): void {
    this.finish(toJsonRpcError(err, id), err.statusCode ?? 500)
  }
}

/** The Retry-After header of a gateway error's answer: from `data.retryAfter` (see toJsonRpcError). */
function retryAfterOf (message: JsonRpcMessage): Record<string, string> {
  const data = 'error' in message && isRecord(message.error.data) ? message.error.data : {}
  const seconds = data.retryAfter
  return typeof seconds === 'number' && Number.isInteger(seconds) && seconds > 0 ? { 'retry-after': String(seconds) } : {}
}

/** A response on another replica: what the exchange writes goes there over the bus (mrtr-out). */
export class RemoteResponse implements ResponseSink {
  readonly #peers: Peers
  readonly #to: string
  readonly #ticket: string
  #done = false
  readonly #onDone: () => void
  onClientGone: (() => void) | undefined

  /** `onDone` runs once, when the response is finished or its client went away. */
  constructor (peers: Peers, to: string, ticket: string, onDone: () => void) {
    this.#peers = peers
    this.#to = to
    this.#ticket = ticket
    this.#onDone = onDone
  }

  get done (): boolean { return this.#done }

  /** The client at the other replica went away (mrtr-cancel). */
  clientGone (): void {
    if (this.#done) return
    this.#done = true
    this.#onDone()
    this.onClientGone?.()
  }

  notify (message: JsonRpcMessage): void {
    if (!this.#done) this.#send('notify', message)
  }

  finish (message: JsonRpcMessage, status = 200): void {
    if (this.#done) return
    this.#done = true
    this.#onDone()
    this.#send('finish', message, status)
  }

  fail (err: GatewayError, id: RequestId | null): void {
    this.finish(toJsonRpcError(err, id), err.statusCode ?? 500)
  }

  #send (op: 'notify' | 'finish', message: JsonRpcMessage, status?: number): void {
    this.#peers.send(this.#to, { kind: 'mrtr-out', ticket: this.#ticket, op, message, ...(status !== undefined ? { status } : {}) }).catch(() => {})
  }
}
