// HTTP plumbing shared by the HTTP backends: the upstream connection pools and small helpers to
// read bodies, SSE streams and network errors. No MCP here.
import type { IncomingHttpHeaders } from 'node:http'
import { Pool, type Dispatcher } from 'undici'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
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

export async function drain (body: Body): Promise<void> {
  await body.dump({ limit: 65_536 }).catch(() => {})
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

/** Backoff for reconnect attempt n (0-based): exponential, capped, half jitter (STYLE.md 8). */
export function backoff (attempt: number, baseMs: number, maxMs: number): number {
  const exp = Math.min(maxMs, baseMs * 2 ** attempt)
  return exp / 2 + Math.random() * exp / 2
}

/**
 * Feeds an SSE body through eventsource-parser and calls `done` once: with null when the body
 * ended, or with what ended it otherwise (the body's error, a close before its end, a handler that
 * threw, a message above MAX_BODY_BYTES). Stream callbacks rather than `for await`, so a stream
 * that stays idle for hours holds no async iterator, promises or parked frames (issue 10).
 */
export function readSse (body: Body, onEvent: (event: EventSourceMessage) => void, onRetry: (ms: number) => void, done: (err: Error | null) => void): void {
  const decoder = new TextDecoder()
  const parser = createParser({ onEvent, onRetry, maxBufferSize: MAX_BODY_BYTES })
  let over = false
  const finish = (err: Error | null): void => {
    if (over) return
    over = true
    body.off('data', onData).off('end', onEnd).off('error', finish).off('close', onClose)
    done(err)
  }
  // As for await did: a throw stops the read and releases the body. Past the parser's buffer limit,
  // feed() throws, so an oversized message ends the stream.
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
