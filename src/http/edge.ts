// What reaches a client before a route does: errors of the HTTP parser (Node's clientError),
// the router's own (Fastify's frameworkErrors), and the body a refused request still carries.
// Whatever a client sends, it is answered in the gateway's JSON-RPC error format (docs/operating.md,
// what hostile input costs a client).
import { STATUS_CODES, type IncomingMessage } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyBaseLogger } from 'fastify'
import {
  GW_ERR_BAD_REQUEST, GW_ERR_HEADERS_TOO_LARGE, GW_ERR_REQUEST_TIMEOUT, GW_ERR_SERVER_NOT_FOUND, toJsonRpcError, type GatewayError
} from '../core/errors.js'
import type { GatewayMetrics } from '../telemetry/metrics.js'

/**
 * A refused body is read and dropped up to this many bytes past what arrived before the refusal,
 * or for DRAIN_MS, before the connection closes. Closing a socket with unread data makes the
 * kernel send a reset, which can destroy the 413 before the client reads it (undici's fetch sees
 * EPIPE; a proxy answers 502). Beyond the bound the reset is the price of the client's excess.
 */
export const DRAIN_MAX_BYTES = 16 * 1024 * 1024
export const DRAIN_MS = 5_000

/**
 * Reads and drops what is left of a request's body (bounded), then calls `then` once: when the
 * body has ended, the bound is reached, or the connection is gone. A request already complete
 * calls it at once.
 */
export function drainBody (req: IncomingMessage, then: () => void): void {
  if (req.complete || req.destroyed) { then(); return }
  let drained = 0
  let done = false
  const finish = (): void => {
    if (done) return
    done = true
    clearTimeout(timer)
    req.removeListener('data', onData)
    req.removeListener('end', finish)
    req.removeListener('close', finish)
    req.removeListener('error', finish)
    then()
  }
  const onData = (chunk: Buffer): void => {
    drained += chunk.length
    if (drained > DRAIN_MAX_BYTES) finish()
  }
  const timer = setTimeout(finish, DRAIN_MS)
  timer.unref()
  req.on('data', onData)
  req.once('end', finish)
  req.once('close', finish)
  req.once('error', finish)
  req.resume()
}

/** The server name of an MCP path (`/mcp/<name>`, `/sse/<name>…`), as far as a 404 may echo it. */
function serverNameOf (url: string | undefined): string {
  const m = /^\/(?:mcp|sse)\/([^/?]*)/.exec(url ?? '')
  return (m?.[1] ?? '').slice(0, 64)
}

/**
 * Fastify's errors raised before any route runs (its `frameworkErrors`), as gateway errors.
 * A name longer than the router's parameter limit (100) is as unknown as a 100-character one: 404.
 */
export function frameworkError (err: Error & { code?: string }, url: string | undefined): GatewayError | undefined {
  switch (err.code) {
    case 'FST_ERR_BAD_URL': return new GW_ERR_BAD_REQUEST('malformed percent-encoding in the URL')
    case 'FST_ERR_MAX_PARAM_LENGTH': return new GW_ERR_SERVER_NOT_FOUND(serverNameOf(url))
  }
  return undefined
}

/** What Node's HTTP parser refuses, as the gateway's error (Fastify's default handler's statuses). */
function clientErrorOf (code: string | undefined, requestTimeoutMs: number): GatewayError {
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return new GW_ERR_REQUEST_TIMEOUT(requestTimeoutMs)
  if (code === 'HPE_HEADER_OVERFLOW') return new GW_ERR_HEADERS_TOO_LARGE()
  return new GW_ERR_BAD_REQUEST('malformed HTTP request')
}

/** How long a connection refused by the parser may take to read its answer before it is destroyed. */
const CLIENT_ERROR_LINGER_MS = 1000

/**
 * Node's `clientError` (a request the HTTP parser refuses, or one too slow to arrive): a JSON-RPC
 * error in the gateway's format, then the connection closes, as HTTP/1.1 requires after a framing
 * error. Written only when no response is under way on that socket (Node's own rule).
 */
export function clientErrorHandler (metrics: GatewayMetrics, log: FastifyBaseLogger, requestTimeoutMs: number) {
  return (err: Error & { code?: string }, socket: Socket): void => {
    if (err.code === 'ECONNRESET' || socket.destroyed) return
    const error = clientErrorOf(err.code, requestTimeoutMs)
    const status = error.statusCode ?? 400
    metrics.httpRefusal(status, error.code)
    log.debug({ code: err.code, status }, 'client error')
    const pending = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage
    if (!socket.writable || pending?.headersSent === true) { socket.destroy(); return }
    const body = JSON.stringify(toJsonRpcError(error, null))
    socket.end(`HTTP/1.1 ${status} ${STATUS_CODES[status] ?? ''}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`)
    setTimeout(() => { socket.destroy() }, CLIENT_ERROR_LINGER_MS).unref()
  }
}
