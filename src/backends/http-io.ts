// HTTP plumbing shared by the HTTP backends: the upstream connection pools and small helpers to
// read bodies, SSE streams and network errors. No MCP here.
import type { IncomingHttpHeaders } from 'node:http'
import { TextDecoder } from 'node:util'
import { Pool, type Dispatcher } from 'undici'
import { createParser, type EventSourceMessage, type EventSourceParser } from 'eventsource-parser'
import { classify } from '../core/jsonrpc.js'

/** Largest message or body read from a backend; beyond it the reply counts as garbage. */
export const MAX_BODY_BYTES = 16 * 1024 * 1024

// ---------------------------------------------------------------------------------------------
// Dispatchers: one Pool per origin, shared by every session of every backend on that origin.
// Request/response POSTs use a pool bounded by config.connections; long-lived SSE streams (the
// standalone GET, legacy SSE, resumptions) use an unbounded pool of the same origin, so a
// thousand idle GET streams can never starve the POSTs of their connections.

const dispatchers = new Map<string, Pool>()

export function dispatcherFor (origin: string, connections: number | null, connectTimeoutMs: number): Pool {
  const key = `${origin} ${connections ?? 'streams'} ${connectTimeoutMs}`
  let pool = dispatchers.get(key)
  if (pool === undefined || pool.closed || pool.destroyed) {
    pool = new Pool(origin, {
      connections,
      connect: { timeout: connectTimeoutMs },
      // Deadlines are per request (see #request); these are the fallbacks.
      headersTimeout: 300_000,
      bodyTimeout: 0
    })
    dispatchers.set(key, pool)
  }
  return pool
}

/** Closes every shared upstream pool (shutdown, tests). Later connections create new pools. */
export async function closeHttpDispatchers (): Promise<void> {
  const pools = [...dispatchers.values()]
  dispatchers.clear()
  await Promise.all(pools.map(async pool => await pool.destroy().catch(() => {})))
}

// ---------------------------------------------------------------------------------------------
// Small helpers

export type Body = Dispatcher.ResponseData['body']

export function headerValue (headers: IncomingHttpHeaders, name: string): string | undefined {
  const v = headers[name]
  return Array.isArray(v) ? v[0] : v
}

export function mediaType (headers: IncomingHttpHeaders): string {
  return (headerValue(headers, 'content-type') ?? '').split(';')[0]?.trim().toLowerCase() ?? ''
}

/** The `data:` payloads of an SSE body read whole, one per line, in order. */
export function sseDataLines (text: string): string[] {
  return text.split('\n').filter(l => l.startsWith('data:')).map(l => l.slice(5).trim())
}

/** What drain() reads of a body it does not want before it drops the connection instead. */
const DRAIN_LIMIT = 65_536
/**
 * How long an SseExchange drains an answer it does not read before it drops the connection instead.
 * Its status is all that is used, and a refusal's body comes with its headers: one still open a
 * second later (bodyTimeout is 0 on a stream) would hold the exchange, and its owner, for ever.
 */
export const DRAIN_TIMEOUT_MS = 1000

export async function drain (body: Body): Promise<void> {
  await body.dump({ limit: DRAIN_LIMIT }).catch(() => {})
}

export async function readText (body: Body, max: number): Promise<string> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of body) {
    const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk as Buffer
    size += buf.length
    if (size > max) {
      body.destroy()
      throw new Error(`the body exceeds ${max} bytes`)
    }
    chunks.push(buf)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/** Reads a small error body and keeps the backend's JSON-RPC error, if it sent one. */
export async function errorDetail (body: Body): Promise<Record<string, unknown>> {
  try {
    const value: unknown = JSON.parse(await readText(body, 65_536))
    const c = classify(value)
    if (c.kind === 'response' && 'error' in c.message) {
      return { backendError: { code: c.message.error.code, message: c.message.error.message } }
    }
  } catch {}
  return {}
}

/** A short, log- and client-safe description of a network error (undici codes). */
export function describe (err: unknown): string {
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code
    const inner = err instanceof AggregateError ? err.errors.find((e: unknown) => e instanceof Error) as Error | undefined : undefined
    const message = inner?.message ?? err.message
    return code !== undefined && !message.includes(code) ? `${code}: ${message}` : message
  }
  return String(err)
}

/** Backoff for reconnect attempt n (0-based): exponential, capped, half jitter. */
export function backoff (attempt: number, baseMs: number, maxMs: number): number {
  const exp = Math.min(maxMs, baseMs * 2 ** attempt)
  return exp / 2 + Math.random() * exp / 2
}

/**
 * Feeds an SSE body through eventsource-parser and calls `done` once: with null when the body
 * ended, or with what ended it otherwise (the body's error, a close before its end, a handler that
 * threw, a message above MAX_BODY_BYTES). Stream callbacks rather than `for await`, so a stream
 * that stays idle for hours holds no async iterator, promises or parked frames (heap per idle
 * session: docs/performance.md).
 */
export function readSse (body: Body, onEvent: (event: EventSourceMessage) => void, onRetry: (ms: number) => void, done: (err: Error | null) => void): void {
  const decoder = new TextDecoder()
  const parser = boundedParser(onEvent, onRetry)
  let over = false
  const finish = (err: Error | null): void => {
    if (over) return
    over = true
    body.off('data', onData).off('end', onEnd).off('error', finish).off('close', onClose)
    done(err)
  }
  // As for await did: a throw stops the read and releases the body. feed() throws on an event
  // above the limit too (boundedParser), so an oversized message ends the stream in the chunk that
  // crosses the limit.
  const fail = (err: unknown): void => {
    // The body reports its destruction as an error after our listener is gone: keep it from being uncaught.
    body.on('error', noop).destroy()
    finish(asError(err))
  }
  const onData = (chunk: Buffer | string): void => {
    try {
      parser.feed(typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true }))
    } catch (err) {
      fail(err)
    }
  }
  const onEnd = (): void => {
    try {
      parser.feed(decoder.decode())
    } catch (err) {
      fail(err)
      return
    }
    finish(null)
  }
  // undici reports a body destroyed before its end as an error; a bare 'close' would otherwise leave the reader waiting forever.
  const onClose = (): void => { finish(prematureClose()) }
  if (body.closed) {
    // Nothing more will be emitted: settle as for await would, but not inside the caller's frame.
    const err = body.errored ?? (body.readableEnded ? null : prematureClose())
    queueMicrotask(() => { finish(err) })
    return
  }
  body.on('data', onData).on('end', onEnd).on('error', finish).on('close', onClose)
}

/**
 * An eventsource-parser whose feed() throws, in the chunk that crosses it, on an event above
 * MAX_BODY_BYTES (counted in characters, as the parser counts). eventsource-parser 3.1.1 does not:
 * past its maxBufferSize it only reports to onError and refuses the next feed(), so onError throws
 * here; and it checks the limit on what it still holds after dispatching, so an event that the
 * crossing chunk also completes would be dispatched whole, which onEvent refuses.
 */
function boundedParser (onEvent: (event: EventSourceMessage) => void, onRetry: (ms: number) => void): EventSourceParser {
  return createParser({
    onEvent: event => {
      if (event.data.length > MAX_BODY_BYTES) throw new Error(`an SSE event exceeds ${MAX_BODY_BYTES} characters`)
      onEvent(event)
    },
    onRetry,
    // The other parse errors (an unknown field, a bad retry) are skipped, as the spec says.
    onError: err => { if (err.type === 'max-buffer-size-exceeded') throw err },
    maxBufferSize: MAX_BODY_BYTES
  })
}

/** readSse as a promise: resolves when the body ends, rejects with what ended it otherwise. */
export function pumpSse (body: Body, onEvent: (event: EventSourceMessage) => void, onRetry: (ms: number) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    readSse(body, onEvent, onRetry, err => { if (err === null) resolve(); else reject(err) })
  })
}

function noop (): void {}

function asError (err: unknown): Error {
  return err instanceof Error ? err : new Error(String(err), { cause: err })
}

function prematureClose (): Error {
  return Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' })
}

/** What an SseExchange reports to its owner; each call names the exchange, so a stale one can be told apart. */
export interface SseHandler {
  /** The answer arrived: true reads its body as SSE; false drains it (as drain() does, for DRAIN_TIMEOUT_MS at most) before onSseEnd. */
  onSseResponse (exchange: SseExchange, status: number, headers: IncomingHttpHeaders): boolean
  onSseEvent (exchange: SseExchange, event: EventSourceMessage): void
  onSseRetry (exchange: SseExchange, ms: number): void
  /**
   * Called once, unless abort() came first: null when the body ended, or what ended it (undici's error,
   * as request() rejects with; a throw of the handler; a message above MAX_BODY_BYTES). Must not throw.
   */
  onSseEnd (exchange: SseExchange, err: Error | null): void
}

/**
 * One long-lived SSE request dispatched on an undici pool with this object as its handler, where
 * request() with a signal adds a RequestHandler, a BodyReadable with its listeners and an
 * AbortController per stream, all held for as long as the stream stays idle (readSse reads the
 * bodies that request() returns). The text goes through eventsource-parser as in readSse.
 *
 * It speaks undici's v2 handler API (onRequestStart ...), the only one undici 8 keeps; undici 7
 * adapts it with a controller that would keep the answer's raw header Buffers for the stream's whole
 * life (~1.4 KB per stream, measured), so onResponseStart lets go of them.
 */
export class SseExchange implements Dispatcher.DispatchHandler {
  readonly #handler: SseHandler
  #controller: Dispatcher.DispatchController | null = null
  /** Ended or abandoned: whatever undici still reports is ignored. */
  #over = false
  #status = 0
  #streaming = false
  /**
   * The parser and decoder of the events being read: made by the first chunk after an event boundary
   * and dropped at the next (endsEvent), so an idle stream that has sent nothing, or only whole
   * events and comments, holds neither (~0.9 KB per stream). Between events
   * eventsource-parser keeps no state but its first-chunk flag (#newParser), so a new one reads on
   * exactly as the old one would have.
   */
  #parser: EventSourceParser | null = null
  #decoder: TextDecoder | null = null
  /** A parser was made before: the stream's start, where a BOM is stripped, is behind us. */
  #begun = false
  /** Inside start(): a failure reported now is passed on after start() returned. */
  #starting = false
  /** An answer that is drained, not read: its bytes so far and its deadline (DRAIN_TIMEOUT_MS). */
  #drain: { bytes: number, timer: NodeJS.Timeout } | null = null

  constructor (handler: SseHandler) {
    this.#handler = handler
  }

  /** The answer's status; 0 until onSseResponse took it (and for an exchange that failed before, or there). */
  get status (): number {
    return this.#status
  }

  /** Whether the answer is read as SSE (onSseResponse said so). */
  get streaming (): boolean {
    return this.#streaming
  }

  /**
   * Sends the request. A failure to dispatch it is reported through onSseEnd too, never from
   * inside start(): undici reports some (a bad header value, a destroyed pool) at once, and a
   * caller that gives up on the first failure would otherwise see its owner ended before start()
   * returned (a constructor, say).
   */
  start (dispatcher: Dispatcher, options: Dispatcher.DispatchOptions): void {
    this.#starting = true
    try {
      dispatcher.dispatch(options, this)
    } catch (err) {
      this.#lost(asError(err))
    } finally {
      this.#starting = false
    }
  }

  /** Ends the exchange from our side, releasing its connection; onSseEnd is not called. Idempotent. */
  abort (): void {
    if (this.#over) return
    this.#over = true
    this.#release()
    // Before onRequestStart (queued or connecting) there is nothing to abort yet: it aborts then.
    this.#controller?.abort(abandoned())
  }

  onRequestStart (controller: Dispatcher.DispatchController): void {
    this.#controller = controller
    if (this.#over) controller.abort(abandoned())
  }

  onResponseStart (controller: Dispatcher.DispatchController, status: number, headers: IncomingHttpHeaders): void {
    // 1xx answers are informational; the real one follows.
    if (this.#over || status < 200) return
    try {
      controller.rawHeaders = null
    } catch {
      // A controller whose rawHeaders is getter-only (a later undici) keeps them itself: nothing to let go of.
    }
    try {
      this.#streaming = this.#handler.onSseResponse(this, status, headers)
    } catch (err) {
      // Status 0: the owner sees a failure with the handler's error, not an answer it refused.
      this.#fail(err)
      return
    }
    // Only now: onSseEnd reads status and streaming together as the handler's verdict on this answer.
    this.#status = status
    // Unless the handler ended the exchange meanwhile. Unref'd: a drain alone does not keep the process up.
    if (!this.#streaming && !this.#over) this.#drain = { bytes: 0, timer: setTimeout(() => { this.#dropDrained() }, DRAIN_TIMEOUT_MS).unref() }
  }

  /** Stops draining (limit or deadline): the connection is dropped and the answer reported as ended. */
  #dropDrained (): void {
    if (this.#over) return
    this.#over = true
    this.#controller?.abort(abandoned())
    this.#ended(null)
  }

  onResponseData (_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#over) return
    if (!this.#streaming) {
      // As drain(): past the limit the connection is dropped rather than read to its end.
      const drain = this.#drain
      if (drain !== null && (drain.bytes += chunk.length) > DRAIN_LIMIT) this.#dropDrained()
      return
    }
    try {
      // As in readSse: a throw (boundedParser's on an oversized event, or a handler's) ends the read.
      const parser = this.#parser ?? this.#newParser()
      parser.feed(this.#decoder!.decode(chunk, { stream: true }))
      // Unless a handler ended the exchange meanwhile, or a new parser replaced this one.
      if (this.#parser === parser && endsEvent(chunk)) this.#release()
    } catch (err) {
      this.#fail(err)
    }
  }

  #newParser (): EventSourceParser {
    const first = !this.#begun
    this.#begun = true
    // TextDecoder strips a BOM at the start of what it decodes: right for the stream's start only.
    this.#decoder = first ? new TextDecoder() : new TextDecoder('utf-8', { ignoreBOM: true })
    const parser = boundedParser(event => { this.#handler.onSseEvent(this, event) }, ms => { this.#handler.onSseRetry(this, ms) })
    // eventsource-parser looks for a BOM in its first chunk: one past the stream's start must not.
    if (!first) parser.feed('')
    this.#parser = parser
    return parser
  }

  onResponseEnd (): void {
    if (this.#over) return
    try {
      // No parser: the body ended on an event boundary, with nothing left to decode.
      if (this.#parser !== null) this.#parser.feed(this.#decoder!.decode())
    } catch (err) {
      this.#fail(err)
      return
    }
    this.#over = true
    this.#ended(null)
  }

  onResponseError (_controller: Dispatcher.DispatchController, err: Error): void {
    this.#lost(err)
  }

  #lost (err: Error): void {
    if (this.#over) return
    this.#over = true
    if (this.#starting) queueMicrotask(() => { this.#ended(err) })
    else this.#ended(err)
  }

  #fail (err: unknown): void {
    if (this.#over) return
    this.#over = true
    const error = asError(err)
    this.#controller?.abort(error)
    this.#ended(error)
  }

  #ended (err: Error | null): void {
    this.#release()
    this.#handler.onSseEnd(this, err)
  }

  #release (): void {
    this.#parser = null
    this.#decoder = null
    if (this.#drain !== null) {
      clearTimeout(this.#drain.timer)
      this.#drain = null
    }
  }
}

const LF = 0x0a
const CR = 0x0d

/**
 * Whether a chunk ends with an empty line, after which eventsource-parser has dispatched (or
 * dropped) the event and holds nothing: its last line ending (LF or CRLF) follows another line
 * ending. It must end in LF: a CR at the end may be half a CRLF, which the parser waits for. A
 * boundary split across chunks goes unseen and the parser is kept, which costs memory only.
 */
export function endsEvent (chunk: Uint8Array): boolean {
  let end = chunk.length
  if (end === 0 || chunk[end - 1] !== LF) return false
  end--
  if (end > 0 && chunk[end - 1] === CR) end--
  if (end === 0) return false
  const before = chunk[end - 1]
  return before === LF || before === CR
}

function abandoned (): Error {
  return new Error('the SSE exchange was abandoned')
}
