// Every failure a caller can see: one GW_ERR_* constructor each, with its HTTP status, and its
// JSON-RPC code in JSONRPC_CODE. Gateway-made errors carry
// `data.source = 'gateway'` so a client can tell them from a backend's own errors (J-8).
// JSON-RPC codes used by the gateway stay in -32000..-32019 (implementation-defined in the
// legacy eras; -32020..-32099 are reserved from 2026-07-28 on):
//   -32000 transport-level rejection (header, media type, size, origin …), as the SDK does
//   -32001 session not found (the SDK's code for 404)
//   -32006 backend timeout        -32007 backend connection error (unreachable, exited, overloaded)
//   -32010..-32014 the caller's own credential toward a backend (credentials/: docs/credentials.md)
//   -32042 (2025-11-25's URLElicitationRequiredError) instead of -32014 for a client that declared URL elicitation
// The 2026-07-28 face (http/modern.ts) also answers with the spec's own codes: -32601 (removed or
// unknown method, HTTP 404), -32602 (bad `_meta` envelope or requestState), -32020 (a header does not
// match the body), -32021 (a capability the request did not declare), -32022 (unsupported version).
import createError from '@fastify/error'
import { errorResponse, type JsonRpcFailure, type JsonRpcMessage, type RequestId } from './jsonrpc.js'

export const GW_ERR_PARSE = createError('GW_ERR_PARSE', 'Parse error: %s', 400)
export const GW_ERR_INVALID_REQUEST = createError('GW_ERR_INVALID_REQUEST', 'Invalid Request: %s', 400)
export const GW_ERR_BAD_REQUEST = createError('GW_ERR_BAD_REQUEST', 'Bad Request: %s', 400)
export const GW_ERR_SESSION_REQUIRED = createError('GW_ERR_SESSION_REQUIRED', 'Bad Request: Mcp-Session-Id header is required', 400)
export const GW_ERR_SESSION_NOT_FOUND = createError('GW_ERR_SESSION_NOT_FOUND', 'Session not found', 404)
export const GW_ERR_SERVER_NOT_FOUND = createError('GW_ERR_SERVER_NOT_FOUND', "No MCP server named '%s'", 404)
export const GW_ERR_UNSUPPORTED_PROTOCOL_VERSION = createError('GW_ERR_UNSUPPORTED_PROTOCOL_VERSION', 'Bad Request: %s', 400)
export const GW_ERR_NOT_ACCEPTABLE = createError('GW_ERR_NOT_ACCEPTABLE', 'Not Acceptable: %s', 406)
export const GW_ERR_UNSUPPORTED_MEDIA_TYPE = createError('GW_ERR_UNSUPPORTED_MEDIA_TYPE', 'Unsupported Media Type: %s', 415)
export const GW_ERR_PAYLOAD_TOO_LARGE = createError('GW_ERR_PAYLOAD_TOO_LARGE', 'Payload Too Large: the body exceeds %d bytes', 413)
export const GW_ERR_METRICS_UNAUTHORIZED = createError('GW_ERR_METRICS_UNAUTHORIZED', 'Unauthorized: /metrics needs its bearer token', 401)
export const GW_ERR_ADMIN_UNAUTHORIZED = createError('GW_ERR_ADMIN_UNAUTHORIZED', 'Unauthorized: the admin API needs the admin token', 401)
export const GW_ERR_FORBIDDEN = createError('GW_ERR_FORBIDDEN', 'Forbidden: %s', 403)
export const GW_ERR_UNAUTHORIZED = createError('GW_ERR_UNAUTHORIZED', 'Unauthorized: %s', 401)
export const GW_ERR_INVALID_TOKEN = createError('GW_ERR_INVALID_TOKEN', 'Unauthorized: invalid credential (%s)', 401)
export const GW_ERR_SERVER_NOT_ALLOWED = createError('GW_ERR_SERVER_NOT_ALLOWED', "Forbidden: server '%s' is not available to this tenant", 403)
export const GW_ERR_AUTH_UNAVAILABLE = createError('GW_ERR_AUTH_UNAVAILABLE', 'Credential cannot be checked now: %s', 503)
/** The HTTP parser's refusals (http/edge.ts): a request too slow to arrive, headers too large. */
export const GW_ERR_REQUEST_TIMEOUT = createError('GW_ERR_REQUEST_TIMEOUT', 'Request Timeout: the request did not arrive within %d ms', 408)
export const GW_ERR_HEADERS_TOO_LARGE = createError('GW_ERR_HEADERS_TOO_LARGE', 'Request Header Fields Too Large', 431)
export const GW_ERR_METHOD_NOT_ALLOWED = createError('GW_ERR_METHOD_NOT_ALLOWED', 'Method Not Allowed', 405)
export const GW_ERR_CONFLICT = createError('GW_ERR_CONFLICT', 'Conflict: %s', 409)
/** A tenant's (or subject's) request budget is spent; carries retryAfter (integer seconds). */
export const GW_ERR_RATE_LIMITED = createError('GW_ERR_RATE_LIMITED', 'Too Many Requests: request rate limit reached; retry after %d s', 429)
/** Too many failed authentications from one client address (auth/failure-budget.ts); carries retryAfter. */
export const GW_ERR_AUTH_THROTTLED = createError('GW_ERR_AUTH_THROTTLED', 'Too Many Requests: too many failed authentications from this address; retry after %d s', 429)
/** initialize beyond the tenant's (or subject's) open-session quota; a DELETE or expiry frees a slot. */
export const GW_ERR_SESSION_QUOTA = createError('GW_ERR_SESSION_QUOTA', 'Too Many Requests: the %s quota of %d open sessions is reached', 429)
/**
 * tools/call of a tool the tenant's policy denies. Worded and coded as MCP's unknown tool
 * (-32602), so a tenant cannot tell a denied tool from a missing one; it arrives as the JSON-RPC
 * answer of the call (HTTP 200 on the request's stream), so the status here is nominal.
 */
export const GW_ERR_UNKNOWN_TOOL = createError('GW_ERR_UNKNOWN_TOOL', 'Unknown tool: %s', 404)
export const GW_ERR_BACKEND_CAPACITY = createError('GW_ERR_BACKEND_CAPACITY', "Backend '%s' is at its limit of %d sessions", 503)
/** Every child of a (server, tenant) pool stayed busy for as long as a request may wait for one; carries retryAfter. */
export const GW_ERR_POOL_BUSY = createError('GW_ERR_POOL_BUSY', "Backend '%s' is busy: all %d pooled connections stayed in use for %d ms", 503)
/** More requests at once than the tenant's (or subject's) limits.concurrentRequests; carries retryAfter. */
export const GW_ERR_TOO_MANY_CONCURRENT = createError('GW_ERR_TOO_MANY_CONCURRENT', 'Too Many Requests: the %s limit of %d requests at once is reached', 429)
/** A task-augmented request of a session that already holds as many live tasks as it may. */
export const GW_ERR_TASK_LIMIT = createError('GW_ERR_TASK_LIMIT', 'Too Many Requests: the session holds %d live tasks, the most it may; wait for one to end or cancel one', 429)
export const GW_ERR_BACKEND_UNAVAILABLE = createError('GW_ERR_BACKEND_UNAVAILABLE', "Backend '%s' is unavailable: %s", 502)
/** A request was in flight on a replica that died (or lost the session): its backend went with it. */
export const GW_ERR_BACKEND_LOST = createError('GW_ERR_BACKEND_LOST', "Backend '%s' was lost with the replica running it (%s); the session goes on with a restarted backend, this request was not completed", 502)
export const GW_ERR_BACKEND_TIMEOUT = createError('GW_ERR_BACKEND_TIMEOUT', "Backend '%s' did not answer within %d ms", 504)
/**
 * A request the client cancelled (notifications/cancelled). Never sent: it marks the request's end
 * in its stream's log (cancelledAnswer). 499 is the status proxies log for a client that gave up.
 */
export const GW_ERR_REQUEST_CANCELLED = createError('GW_ERR_REQUEST_CANCELLED', 'Request cancelled by the client', 499)
export const GW_ERR_STORE_UNAVAILABLE = createError('GW_ERR_STORE_UNAVAILABLE', 'Session store unavailable: %s', 503)
export const GW_ERR_SHUTTING_DOWN = createError('GW_ERR_SHUTTING_DOWN', 'The gateway is shutting down', 503)
export const GW_ERR_INTERNAL = createError('GW_ERR_INTERNAL', 'Internal error: %s', 500)
export const GW_ERR_CONFIG_INVALID = createError('GW_ERR_CONFIG_INVALID', 'Invalid configuration: %s', 500)
// A caller's credential toward a backend (credentials/). None names a token or a subject; `data`
// carries the server and, for a refusal, the authorization server's OAuth error code.
/** The authorization server could not be reached, timed out or answered nonsense; carries retryAfter. */
export const GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE = createError('GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE', "The authorization server for backend '%s' is unavailable: %s", 503)
/** The authorization server refused the grant (exchange or client credentials): data.oauthError. */
export const GW_ERR_CREDENTIAL_REFUSED = createError('GW_ERR_CREDENTIAL_REFUSED', "The authorization server refused a credential for backend '%s': %s", 403)
/** The backend refused the credential (401) again after one fresh one. */
export const GW_ERR_CREDENTIAL_REJECTED = createError('GW_ERR_CREDENTIAL_REJECTED', "Backend '%s' rejected the credential obtained for this caller (HTTP 401 after one renewal)", 502)
/** Nothing to obtain a credential from: a token exchange needs the client's JWT on this request. */
export const GW_ERR_CREDENTIAL_REQUIRED = createError('GW_ERR_CREDENTIAL_REQUIRED', "Backend '%s' needs a credential of the caller's own: %s", 401)
/** The user must first authorise the gateway at the authorization server: data.authorizationUrl. */
export const GW_ERR_CREDENTIAL_CONSENT_REQUIRED = createError('GW_ERR_CREDENTIAL_CONSENT_REQUIRED', "Backend '%s' needs this user's consent first: open the authorization URL", 403)
/** The same, to a 2025-11-25 client that declared URL-mode elicitation: the spec's URLElicitationRequiredError, data.elicitations. */
export const GW_ERR_URL_ELICITATION_REQUIRED = createError('GW_ERR_URL_ELICITATION_REQUIRED', "Backend '%s' needs this user's consent first: open the URL given", 403)
// The 2026-07-28 face (docs/spec-rules.md §4 and 5.7); each carries the data the spec names in `data`.
export const GW_ERR_INVALID_PARAMS = createError('GW_ERR_INVALID_PARAMS', 'Invalid params: %s', 400)
export const GW_ERR_METHOD_NOT_FOUND = createError('GW_ERR_METHOD_NOT_FOUND', 'Method not found: %s', 404)
export const GW_ERR_HEADER_MISMATCH = createError('GW_ERR_HEADER_MISMATCH', 'Header mismatch: %s', 400)
export const GW_ERR_MISSING_CAPABILITY = createError('GW_ERR_MISSING_CAPABILITY', 'Missing required client capability: %s', 400)
export const GW_ERR_VERSION_UNSUPPORTED = createError('GW_ERR_VERSION_UNSUPPORTED', 'Unsupported protocol version: %s', 400)

export const JSONRPC_CODE: Record<string, number> = {
  GW_ERR_PARSE: -32700,
  GW_ERR_INVALID_REQUEST: -32600,
  GW_ERR_BAD_REQUEST: -32000,
  GW_ERR_SESSION_REQUIRED: -32000,
  GW_ERR_SESSION_NOT_FOUND: -32001,
  GW_ERR_SERVER_NOT_FOUND: -32000,
  GW_ERR_UNSUPPORTED_PROTOCOL_VERSION: -32000,
  GW_ERR_NOT_ACCEPTABLE: -32000,
  GW_ERR_UNSUPPORTED_MEDIA_TYPE: -32000,
  GW_ERR_PAYLOAD_TOO_LARGE: -32000,
  GW_ERR_METRICS_UNAUTHORIZED: -32000,
  GW_ERR_ADMIN_UNAUTHORIZED: -32000,
  GW_ERR_FORBIDDEN: -32000,
  GW_ERR_UNAUTHORIZED: -32000,
  GW_ERR_INVALID_TOKEN: -32000,
  GW_ERR_SERVER_NOT_ALLOWED: -32000,
  GW_ERR_AUTH_UNAVAILABLE: -32000,
  GW_ERR_REQUEST_TIMEOUT: -32000,
  GW_ERR_HEADERS_TOO_LARGE: -32000,
  GW_ERR_METHOD_NOT_ALLOWED: -32000,
  GW_ERR_CONFLICT: -32000,
  GW_ERR_RATE_LIMITED: -32000,
  GW_ERR_AUTH_THROTTLED: -32000,
  GW_ERR_SESSION_QUOTA: -32000,
  GW_ERR_UNKNOWN_TOOL: -32602,
  GW_ERR_BACKEND_CAPACITY: -32007,
  GW_ERR_POOL_BUSY: -32007,
  GW_ERR_TOO_MANY_CONCURRENT: -32000,
  GW_ERR_TASK_LIMIT: -32000,
  GW_ERR_BACKEND_UNAVAILABLE: -32007,
  GW_ERR_BACKEND_LOST: -32007,
  GW_ERR_BACKEND_TIMEOUT: -32006,
  GW_ERR_REQUEST_CANCELLED: -32000,
  GW_ERR_STORE_UNAVAILABLE: -32000,
  GW_ERR_SHUTTING_DOWN: -32000,
  GW_ERR_INTERNAL: -32603,
  GW_ERR_CONFIG_INVALID: -32603,
  GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE: -32010,
  GW_ERR_CREDENTIAL_REFUSED: -32011,
  GW_ERR_CREDENTIAL_REJECTED: -32012,
  GW_ERR_CREDENTIAL_REQUIRED: -32013,
  GW_ERR_CREDENTIAL_CONSENT_REQUIRED: -32014,
  GW_ERR_URL_ELICITATION_REQUIRED: -32042,
  GW_ERR_INVALID_PARAMS: -32602,
  GW_ERR_METHOD_NOT_FOUND: -32601,
  GW_ERR_HEADER_MISMATCH: -32020,
  GW_ERR_MISSING_CAPABILITY: -32021,
  GW_ERR_VERSION_UNSUPPORTED: -32022
}

/** The shape @fastify/error instances have; what the error handler and the router read. */
export interface GatewayError extends Error {
  code: string
  statusCode?: number
  /** Whole seconds, sent as Retry-After (503, 429) and as `retryAfter` in the JSON-RPC error's data. */
  retryAfter?: number
  /** Sent as WWW-Authenticate (401 challenges, RFC 6750 section 3). */
  wwwAuthenticate?: string
  /** Fields the spec puts in the JSON-RPC error's `data` (e.g. `supported`, `requiredCapabilities`). */
  data?: Record<string, unknown>
}

/** Sets when to come back (whole seconds): sent as Retry-After and as `retryAfter` in the error's data. */
export function withRetryAfter<E extends GatewayError> (err: E, seconds: number): E {
  err.retryAfter = seconds
  return err
}

/** Attaches spec-defined `data` fields to a gateway error (the 2026-07-28 codes carry some). */
export function withData<E extends GatewayError> (err: E, data: Record<string, unknown>): E {
  err.data = data
  return err
}

export function isGatewayError (err: unknown): err is GatewayError {
  return err instanceof Error && typeof (err as GatewayError).code === 'string' && (err as GatewayError).code.startsWith('GW_ERR_')
}

/** Retry-After of a 503 whose error names none, so every 503 tells clients when to come back. */
export const DEFAULT_RETRY_AFTER_S = 1

/** When to come back (whole seconds): the error's own, else DEFAULT_RETRY_AFTER_S for any 503. */
export function retryAfterOf (err: GatewayError): number | undefined {
  return err.retryAfter ?? (err.statusCode === 503 ? DEFAULT_RETRY_AFTER_S : undefined)
}

/** The HTTP headers an error answer carries (Retry-After, WWW-Authenticate), for every path that writes one. */
export function errorHeaders (err: GatewayError): Record<string, string> {
  const headers: Record<string, string> = {}
  const retryAfter = retryAfterOf(err)
  if (retryAfter !== undefined) headers['retry-after'] = String(retryAfter)
  if (err.wwwAuthenticate !== undefined) headers['www-authenticate'] = err.wwwAuthenticate
  return headers
}

export function jsonRpcCodeOf (err: GatewayError): number {
  return JSONRPC_CODE[err.code] ?? -32603
}

/**
 * Renders a gateway error as the JSON-RPC error a client sees. Its retryAfter goes in `data` too:
 * the body is all that reaches the replica writing a forwarded answer (an `mrtr-out` envelope),
 * which makes its Retry-After header from it (http/modern-response.ts).
 */
export function toJsonRpcError (err: GatewayError, id: RequestId | null): JsonRpcFailure {
  const retryAfter = retryAfterOf(err)
  const retry = retryAfter !== undefined ? { retryAfter } : {}
  return errorResponse(id, jsonRpcCodeOf(err), err.message, { ...err.data, ...retry, source: 'gateway', code: err.code })
}

const CREDENTIAL_ERRORS: Record<string, new (...args: unknown[]) => GatewayError> = {
  GW_ERR_CREDENTIAL_ISSUER_UNAVAILABLE,
  GW_ERR_CREDENTIAL_REFUSED,
  GW_ERR_CREDENTIAL_REJECTED,
  GW_ERR_CREDENTIAL_REQUIRED,
  GW_ERR_CREDENTIAL_CONSENT_REQUIRED
}

/**
 * The credential error a JSON-RPC error answer carries (toJsonRpcError's shape: data.source
 * 'gateway', data.code), made typed again: a request the gateway itself sent (a pool's initialize)
 * fails with what the client should see, not with a generic backend error.
 */
export function credentialErrorOf (error: { message: string, data?: unknown }): GatewayError | undefined {
  const data = error.data as Record<string, unknown> | undefined
  if (data?.source !== 'gateway' || typeof data.code !== 'string' || !Object.hasOwn(CREDENTIAL_ERRORS, data.code)) return undefined
  const Make = CREDENTIAL_ERRORS[data.code] as new (...args: unknown[]) => GatewayError
  const err = new Make('', '')
  err.message = error.message
  const { source: _source, code: _code, retryAfter, ...rest } = data
  err.data = rest
  if (typeof retryAfter === 'number') err.retryAfter = retryAfter
  return err
}

/** The member that marks a cancelledAnswer (the relay strips it from a backend's answers). */
export const CANCELLED_MEMBER = 'gateway:cancelled'

/**
 * What a client stream's log gets for a request the client cancelled (notifications/cancelled,
 * U-CAN-1): an answer in shape, so it settles the request as an answer does (its pending
 * marker is taken: no late answer and no deadline error follows, whoever races), and the stream's
 * writer counts it. Writers never send it: the client gets no response to a request it cancelled.
 */
export function cancelledAnswer (id: RequestId): JsonRpcFailure {
  return { ...toJsonRpcError(new GW_ERR_REQUEST_CANCELLED(), id), [CANCELLED_MEMBER]: true } as JsonRpcFailure
}

export function isCancelledAnswer (message: JsonRpcMessage): boolean {
  return (message as unknown as Record<string, unknown>)[CANCELLED_MEMBER] === true
}
