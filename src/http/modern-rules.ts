// The rules of the 2026-07-28 (modern, stateless) revision on the client face, as pure functions
// (docs/spec-rules.md §4 and 5.7; docs/architecture.md):
//
// - classifyPost: is a POST body modern (served statelessly, http/modern.ts) or legacy (sessions)?
//   Body first, as the SDKs classify (M-14): the `_meta` envelope claim makes a request modern, a
//   modern MCP-Protocol-Version header without the claim is a malformed modern request.
// - checkModernRequest: the validation ladder, in the SDK's order (the order decides which error a
//   request that breaks several rules gets): envelope (-32602), header/body version and method
//   (-32020), supported version (-32022), required headers and Mcp-Name (-32020), removed methods
//   (404, -32601). Every refusal is HTTP 400 (404 for a removed method).
// - completeResult: what a legacy backend's result needs to be a valid modern one (M-6, M-7, M-12).
import {
  GW_ERR_HEADER_MISMATCH, GW_ERR_INVALID_PARAMS, GW_ERR_INVALID_REQUEST, GW_ERR_METHOD_NOT_FOUND, GW_ERR_VERSION_UNSUPPORTED,
  withData
} from '../core/errors.js'
import type { JsonRpcNotification, JsonRpcRequest } from '../core/jsonrpc.js'
import { isRecord } from '../core/jsonrpc.js'

import {
  MODERN_VERSION, MODERN_VERSIONS, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION, META_SERVER_INFO
} from '../core/protocol-version.js'
import { isLogLevel, LOG_LEVELS, type LogLevel } from '../core/mcp.js'

export {
  MODERN_VERSIONS, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION, META_SERVER_INFO, META_SUBSCRIPTION_ID
} from '../core/protocol-version.js'

export { LOG_LEVELS, type LogLevel } from '../core/mcp.js'

/** Methods of the legacy eras that a modern request cannot use (M-13): 404 + -32601. */
const REMOVED_METHODS = new Set([
  'initialize', 'ping', 'logging/setLevel', 'resources/subscribe', 'resources/unsubscribe',
  // The Tasks extension of this era (io.modelcontextprotocol/tasks) keeps tasks/get and
  // tasks/cancel, adds tasks/update, and removes these two (the result comes inline with tasks/get).
  'tasks/result', 'tasks/list'
])
/** Results that carry caching hints (M-12). */
const CACHEABLE = new Set(['server/discover', 'tools/list', 'prompts/list', 'resources/list', 'resources/templates/list', 'resources/read'])
/** The params field each method's Mcp-Name header mirrors (H-26-2). */
const NAME_SOURCE: Record<string, 'name' | 'uri' | 'taskId'> = {
  'tools/call': 'name',
  'prompts/get': 'name',
  'resources/read': 'uri',
  'tasks/get': 'taskId',
  'tasks/update': 'taskId',
  'tasks/cancel': 'taskId'
}

export function isModernVersion (version: string): boolean {
  return version >= MODERN_VERSION
}

/**
 * The versions named in -32022's `data.supported`: the modern ones, as `server/discover` lists them
 * (a client retries with one of these; the session eras are reached with `initialize` instead).
 */
export function supportedVersions (): string[] {
  return [...MODERN_VERSIONS]
}

/** What a modern request declared about itself in its `_meta` envelope. */
export interface RequestEnvelope {
  protocolVersion: string
  clientCapabilities: Record<string, unknown>
  clientInfo?: Record<string, unknown>
  logLevel?: LogLevel
}

/** The standard headers of a modern POST, already trimmed of surrounding whitespace. */
export interface ModernHeaders {
  protocolVersion?: string | undefined
  method?: string | undefined
  name?: string | undefined
}

export type Classified =
  | { era: 'legacy' }
  | { era: 'modern', kind: 'request', message: JsonRpcRequest }
  | { era: 'modern', kind: 'notification', message: JsonRpcNotification }


function metaOf (value: unknown): Record<string, unknown> | undefined {
  if (!isRecord(value) || !isRecord(value.params)) return undefined
  const meta = value.params._meta
  return isRecord(meta) ? meta : undefined
}

function hasClaim (value: unknown): boolean {
  const meta = metaOf(value)
  return meta !== undefined && META_PROTOCOL_VERSION in meta
}

/** Optional whitespace (space, tab) around a header value is not part of it (RFC 9110). */
export function trimOws (value: string | undefined): string | undefined {
  return value?.replace(/^[ \t]+|[ \t]+$/g, '')
}

/**
 * Classifies a decoded POST body. Throws only for modern bodies that are malformed as a whole
 * (a batch holding a modern request); everything else is checked by checkModernRequest.
 */
export function classifyPost (body: unknown, headers: ModernHeaders): Classified {
  if (Array.isArray(body)) {
    if (body.some(hasClaim)) throw new GW_ERR_INVALID_REQUEST('JSON-RPC batches may not contain requests of protocol revision 2026-07-28 or later')
    return { era: 'legacy' }
  }
  if (!isRecord(body) || typeof body.method !== 'string') return { era: 'legacy' } // responses and invalid bodies
  const headerModern = headers.protocolVersion !== undefined && isModernVersion(headers.protocolVersion)
  const isRequestBody = 'id' in body
  if (isRequestBody && body.method === 'initialize' && !hasValidModernClaim(body)) {
    if (headerModern) throw new GW_ERR_HEADER_MISMATCH('an initialize request (legacy handshake) was sent with a modern MCP-Protocol-Version header')
    return { era: 'legacy' }
  }
  if (hasClaim(body) || headerModern) {
    return isRequestBody
      ? { era: 'modern', kind: 'request', message: body as unknown as JsonRpcRequest }
      : { era: 'modern', kind: 'notification', message: body as unknown as JsonRpcNotification }
  }
  return { era: 'legacy' }
}

function hasValidModernClaim (body: unknown): boolean {
  const meta = metaOf(body)
  const version = meta?.[META_PROTOCOL_VERSION]
  return meta !== undefined && typeof version === 'string' && isModernVersion(version) && envelopeIssue(meta) === undefined
}

/** The first thing wrong with an envelope, or undefined (M-2). */
function envelopeIssue (meta: Record<string, unknown>): string | undefined {
  if (!(META_PROTOCOL_VERSION in meta)) return `${META_PROTOCOL_VERSION}: missing`
  if (!(META_CLIENT_CAPABILITIES in meta)) return `${META_CLIENT_CAPABILITIES}: missing`
  if (typeof meta[META_PROTOCOL_VERSION] !== 'string') return `${META_PROTOCOL_VERSION}: expected a string`
  if (!isRecord(meta[META_CLIENT_CAPABILITIES])) return `${META_CLIENT_CAPABILITIES}: expected an object`
  const info = meta[META_CLIENT_INFO]
  if (info !== undefined && (!isRecord(info) || typeof info.name !== 'string' || typeof info.version !== 'string')) {
    return `${META_CLIENT_INFO}: expected an object with string name and version`
  }
  const level = meta[META_LOG_LEVEL]
  if (level !== undefined && !isLogLevel(level)) return `${META_LOG_LEVEL}: expected one of ${LOG_LEVELS.join(', ')}`
  return undefined
}

/** Decodes an `=?base64?…?=` header value (H-26-2); undefined when the sentinel is malformed. */
export function decodeHeaderValue (value: string): string | undefined {
  if (!(value.startsWith('=?base64?') && value.endsWith('?='))) return value
  const b64 = value.slice(9, -2)
  if (!/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(b64)) return undefined
  const bytes = Buffer.from(b64, 'base64')
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes)
  } catch {
    return undefined
  }
}

/**
 * The validation ladder of a modern request (see the header); returns its envelope. A modern
 * notification needs only a readable version claim, if any.
 */
export function checkModernRequest (request: JsonRpcRequest, headers: ModernHeaders): RequestEnvelope {
  const meta = metaOf(request)
  if (meta === undefined || !(META_PROTOCOL_VERSION in meta)) {
    const missing = meta === undefined ? '_meta' : META_PROTOCOL_VERSION
    throw withData(new GW_ERR_INVALID_PARAMS(`the MCP-Protocol-Version header names a modern revision, but the request lacks ${missing}`), { envelope: { missing: [missing] } })
  }
  const issue = envelopeIssue(meta)
  if (issue !== undefined) throw withData(new GW_ERR_INVALID_PARAMS(`invalid _meta envelope: ${issue}`), { envelope: { problem: issue } })
  const version = meta[META_PROTOCOL_VERSION] as string
  if (headers.protocolVersion !== undefined && headers.protocolVersion !== version) {
    throw new GW_ERR_HEADER_MISMATCH(`the body names protocol version ${version.slice(0, 40)} but the MCP-Protocol-Version header names ${headers.protocolVersion.slice(0, 40)}`)
  }
  if (headers.method !== undefined && headers.method !== request.method) {
    throw new GW_ERR_HEADER_MISMATCH(`the body names method ${request.method.slice(0, 100)} but the Mcp-Method header names ${headers.method.slice(0, 100)}`)
  }
  if (!(MODERN_VERSIONS as readonly string[]).includes(version)) {
    throw withData(new GW_ERR_VERSION_UNSUPPORTED(version.slice(0, 40)), { supported: supportedVersions(), requested: version })
  }
  if (headers.protocolVersion === undefined) throw new GW_ERR_HEADER_MISMATCH('the required MCP-Protocol-Version header is absent')
  if (headers.method === undefined) throw new GW_ERR_HEADER_MISMATCH('the required Mcp-Method header is absent')
  const field = NAME_SOURCE[request.method]
  if (field !== undefined) {
    const raw = isRecord(request.params) ? request.params[field] : undefined
    const bodyValue = typeof raw === 'string' ? raw : undefined
    if (headers.name === undefined) {
      if (bodyValue !== undefined) throw new GW_ERR_HEADER_MISMATCH(`the body carries params.${field} but the required Mcp-Name header is absent`)
    } else {
      const decoded = decodeHeaderValue(headers.name)
      if (decoded === undefined) throw new GW_ERR_HEADER_MISMATCH('the Mcp-Name header carries an invalid Base64 sentinel value')
      if (bodyValue !== undefined && decoded !== bodyValue) throw new GW_ERR_HEADER_MISMATCH(`the body carries params.${field}="${bodyValue.slice(0, 100)}" but the Mcp-Name header names "${decoded.slice(0, 100)}"`)
    }
  }
  if (REMOVED_METHODS.has(request.method)) throw new GW_ERR_METHOD_NOT_FOUND(request.method)
  const envelope: RequestEnvelope = { protocolVersion: version, clientCapabilities: meta[META_CLIENT_CAPABILITIES] as Record<string, unknown> }
  if (isRecord(meta[META_CLIENT_INFO])) envelope.clientInfo = meta[META_CLIENT_INFO]
  if (meta[META_LOG_LEVEL] !== undefined) envelope.logLevel = meta[META_LOG_LEVEL] as LogLevel
  return envelope
}

/** The envelope of a request already checked by checkModernRequest (a retry forwarded from another replica). */
export function envelopeOf (request: JsonRpcRequest): RequestEnvelope {
  const meta = metaOf(request) ?? {}
  const capabilities = meta[META_CLIENT_CAPABILITIES]
  const envelope: RequestEnvelope = {
    protocolVersion: typeof meta[META_PROTOCOL_VERSION] === 'string' ? meta[META_PROTOCOL_VERSION] : MODERN_VERSIONS[0],
    clientCapabilities: isRecord(capabilities) ? capabilities : {}
  }
  if (isRecord(meta[META_CLIENT_INFO])) envelope.clientInfo = meta[META_CLIENT_INFO]
  const logLevel = meta[META_LOG_LEVEL]
  if (isLogLevel(logLevel)) envelope.logLevel = logLevel
  return envelope
}

/** Checks a modern notification's claim (if it has one) against the headers. */
export function checkModernNotification (notification: JsonRpcNotification, headers: ModernHeaders): void {
  const meta = metaOf(notification)
  const version = meta?.[META_PROTOCOL_VERSION]
  if (meta !== undefined && META_PROTOCOL_VERSION in meta && typeof version !== 'string') {
    throw new GW_ERR_INVALID_PARAMS(`invalid _meta envelope: ${META_PROTOCOL_VERSION}: expected a string`)
  }
  if (typeof version === 'string' && headers.protocolVersion !== undefined && headers.protocolVersion !== version) {
    throw new GW_ERR_HEADER_MISMATCH(`the notification names protocol version ${version.slice(0, 40)} but the MCP-Protocol-Version header names ${headers.protocolVersion.slice(0, 40)}`)
  }
  if (headers.method !== undefined && headers.method !== notification.method) {
    throw new GW_ERR_HEADER_MISMATCH(`the notification names method ${notification.method.slice(0, 100)} but the Mcp-Method header names ${headers.method.slice(0, 100)}`)
  }
}

/** Whether a backend log line at `level` reaches a request that asked for `threshold` (M-10). */
export function logPasses (level: unknown, threshold: LogLevel | undefined): boolean {
  if (threshold === undefined) return false
  const at = LOG_LEVELS.indexOf(level as LogLevel)
  return at >= LOG_LEVELS.indexOf(threshold)
}

/** The request's params without the modern envelope keys (what a legacy backend is sent). */
export function legacyParams (params: Record<string, unknown> | undefined): Record<string, unknown> | undefined {
  if (params === undefined || !isRecord(params._meta)) return params
  const meta: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(params._meta)) {
    if (key !== META_PROTOCOL_VERSION && key !== META_CLIENT_CAPABILITIES && key !== META_CLIENT_INFO && key !== META_LOG_LEVEL) meta[key] = value
  }
  const { _meta: _, ...rest } = params
  return Object.keys(meta).length > 0 ? { ...rest, _meta: meta } : rest
}

/**
 * A legacy backend's result made a valid complete modern result: `resultType`, caching hints a
 * shared gateway may not widen (`ttlMs: 0`, `cacheScope: "private"`, M-12) and the server's
 * identity in `_meta` (M-7). What the backend set itself is kept.
 */
export function completeResult (method: string, result: unknown, serverInfo: Record<string, unknown> | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = isRecord(result) ? { ...result } : {}
  out.resultType = 'complete'
  if (CACHEABLE.has(method)) {
    if (typeof out.ttlMs !== 'number' || !Number.isInteger(out.ttlMs) || out.ttlMs < 0) out.ttlMs = 0
    if (out.cacheScope !== 'public' && out.cacheScope !== 'private') out.cacheScope = 'private'
  }
  if (serverInfo !== undefined) out._meta = { ...(isRecord(out._meta) ? out._meta : {}), [META_SERVER_INFO]: serverInfo }
  return out
}
