// Pieces both client-facing transports share: header reading, Accept checks, body decoding
// into classified JSON-RPC messages, and the request decoration the error handler reads.
import { isUtf8 } from 'node:buffer'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { ServerSource } from '../config/live.js'
import {
  GW_ERR_INVALID_REQUEST, GW_ERR_NOT_ACCEPTABLE, GW_ERR_PARSE, GW_ERR_SERVER_NOT_FOUND, GW_ERR_UNSUPPORTED_MEDIA_TYPE
} from '../core/errors.js'
import { classify, type JsonRpcMessage, type RequestId } from '../core/jsonrpc.js'
import { ANONYMOUS_PRINCIPAL, type Principal } from '../auth/principal.js'

declare module 'fastify' {
  interface FastifyRequest {
    /** The JSON-RPC id of the request being handled, once decoded: errors echo it (J-4). */
    jsonRpcId: RequestId | null
  }
}

/** Deepest JSON nesting accepted in a request body. */
export const MAX_JSON_DEPTH = 256

/** Whether a parsed JSON value nests deeper than `limit` (iterative: no recursion to overflow). */
export function depthExceeds (value: unknown, limit: number): boolean {
  const stack: Array<[unknown, number]> = [[value, 1]]
  while (stack.length > 0) {
    const [current, depth] = stack.pop() as [unknown, number]
    if (typeof current !== 'object' || current === null) continue
    if (depth > limit) return true
    for (const child of Array.isArray(current) ? current : Object.values(current)) {
      if (typeof child === 'object' && child !== null) stack.push([child, depth + 1])
    }
  }
  return false
}

export function header (req: FastifyRequest, name: string): string | undefined {
  const value = req.headers[name]
  return Array.isArray(value) ? value[0] : value
}

/** What a POST must accept (H-POST-1) and what a GET must (H-GET-1). */
export const POST_ACCEPTS: readonly string[] = Object.freeze(['application/json', 'text/event-stream'])
export const GET_ACCEPTS: readonly string[] = Object.freeze(['text/event-stream'])

/**
 * The last Accept value allowed, per list of types: a client sends the same header on every
 * request, so it is parsed once per new value, not per request.
 */
const acceptedLast = new WeakMap<readonly string[], string>()

/** Accept must list every given type; `*\/*` and `type/*` count (H-POST-1, H-GET-1). */
export function checkAccept (req: FastifyRequest, types: readonly string[]): void {
  const raw = header(req, 'accept') ?? ''
  if (acceptedLast.get(types) === raw) return
  const listed = raw.toLowerCase().split(',').map(part => (part.split(';')[0] ?? '').trim())
  const missing = types.filter(type => !listed.some(l => l === type || l === '*/*' || l === `${type.split('/')[0] ?? ''}/*`))
  if (missing.length > 0) throw new GW_ERR_NOT_ACCEPTABLE(`Accept must include ${types.join(' and ')}`)
  acceptedLast.set(types, raw)
}

/**
 * Registers the JSON body parser: strict UTF-8 (J-1), JSON.parse errors become -32700, and
 * the body limit comes from config (413 is mapped by the error handler).
 *
 * Only a POST carries a message. Fastify parses DELETE (and PUT, PATCH, OPTIONS) bodies too, and
 * the Python SDK sends `content-type: application/json` with an empty body on its DELETE: such a
 * body, of any type, is read (within the limit) and ignored, never an error.
 */
export function registerJsonParser (app: FastifyInstance): void {
  app.decorateRequest('jsonRpcId', null)
  // Fastify refuses object defaults on decorations (they would be shared); the hook sets it.
  app.decorateRequest('principal', null as unknown as Principal)
  app.addHook('onRequest', (req, _reply, done) => { req.principal = ANONYMOUS_PRINCIPAL; done() })
  // Only JSON bodies: Fastify's built-in text/plain parser would let other types through (415).
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body, done) => {
    if (req.method !== 'POST') { done(null, undefined); return }
    const bytes = body as Buffer
    if (!isUtf8(bytes)) {
      done(new GW_ERR_PARSE('body is not valid UTF-8'), undefined)
      return
    }
    const text = bytes.toString('utf8')
    let value: unknown
    try {
      value = JSON.parse(text)
    } catch (err) {
      done(new GW_ERR_PARSE(err instanceof Error ? err.message : 'invalid JSON'), undefined)
      return
    }
    // Deep nesting would overflow the stack wherever the message is later copied or serialised.
    // Each level takes an opening and a closing bracket: a shorter body cannot nest that deep.
    if (bytes.length > 2 * MAX_JSON_DEPTH && depthExceeds(value, MAX_JSON_DEPTH)) {
      done(new GW_ERR_INVALID_REQUEST(`JSON nested deeper than ${MAX_JSON_DEPTH} levels`), undefined)
      return
    }
    done(null, value)
  })
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (req, _body, done) => {
    if (req.method === 'POST') done(new GW_ERR_UNSUPPORTED_MEDIA_TYPE('Content-Type must be application/json'), undefined)
    else done(null, undefined)
  })
}

export interface DecodedBody {
  messages: JsonRpcMessage[]
  batch: boolean
}

/** Classifies a POST body; an invalid message is -32600 with its id when readable (J-2, J-4). */
export function decodeBody (req: FastifyRequest, allowBatch: boolean): DecodedBody {
  const body: unknown = req.body
  const batch = Array.isArray(body)
  if (batch && !allowBatch) throw new GW_ERR_INVALID_REQUEST('JSON-RPC batches are not supported here')
  const items: unknown[] = batch ? body : [body]
  if (items.length === 0) throw new GW_ERR_INVALID_REQUEST('empty batch')
  const messages: JsonRpcMessage[] = []
  for (const item of items) {
    const c = classify(item)
    if (c.kind === 'invalid') {
      req.jsonRpcId = batch ? null : c.id
      throw new GW_ERR_INVALID_REQUEST(c.reason)
    }
    messages.push(c.message)
  }
  if (!batch && messages[0] !== undefined && 'id' in messages[0] && messages[0].id !== null && messages[0].id !== undefined) {
    req.jsonRpcId = messages[0].id
  }
  return { messages, batch }
}

/** The client's headers as strings; an HTTP backend forwards only the names its config lists. */
export function clientHeaders (req: FastifyRequest): Record<string, string> {
  const headers: Record<string, string> = {}
  for (const [name, value] of Object.entries(req.headers)) {
    if (typeof value === 'string') headers[name] = value
    else if (Array.isArray(value)) headers[name] = value.join(', ')
  }
  return headers
}

/** The configured server a route's `:server` names (as configured now: live reload); 404 for any other name. */
export function serverOf (config: ServerSource, req: FastifyRequest<{ Params: { server: string } }>): string {
  const server = req.params.server
  if (!Object.hasOwn(config.servers, server)) throw new GW_ERR_SERVER_NOT_FOUND(server.slice(0, 64))
  return server
}

/**
 * Headers already set on a reply (CORS, by @fastify/cors), for a response written after
 * reply.hijack(), which bypasses Fastify's own header handling.
 */
export function replyHeaders (reply: FastifyReply, extra: Record<string, string> = {}): Record<string, string> {
  const headers: Record<string, string> = {}
  // for…in over the two plain objects: no entry arrays and no second copy per POST.
  const set = reply.getHeaders()
  for (const name in set) {
    const value = set[name]
    if (typeof value === 'string') headers[name] = value
    else if (typeof value === 'number') headers[name] = String(value)
    else if (Array.isArray(value)) headers[name] = value.join(', ')
  }
  for (const name in extra) headers[name] = extra[name] as string
  return headers
}
