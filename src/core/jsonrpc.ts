// JSON-RPC 2.0 message types and strict classification (J-1 … J-6).
// MCP narrows JSON-RPC: request ids are strings or integers, never null (J-2).

export type RequestId = string | number

/** A map key for a request id that keeps 1 and "1" apart (JSON-RPC ids are compared with their type). */
export const idKey = (id: RequestId): string => typeof id === 'number' ? `n${id}` : `s${id}`

export interface JsonRpcRequest {
  jsonrpc: '2.0'
  id: RequestId
  method: string
  params?: Record<string, unknown> | unknown[]
}

export interface JsonRpcNotification {
  jsonrpc: '2.0'
  method: string
  params?: Record<string, unknown> | unknown[]
}

export interface JsonRpcErrorObject {
  code: number
  message: string
  data?: unknown
}

export interface JsonRpcSuccess {
  jsonrpc: '2.0'
  id: RequestId
  result: unknown
}

export interface JsonRpcFailure {
  jsonrpc: '2.0'
  /** Absent (or null, as the SDK sends) when the request id could not be read (J-4). */
  id?: RequestId | null
  error: JsonRpcErrorObject
}

export type JsonRpcResponse = JsonRpcSuccess | JsonRpcFailure
export type JsonRpcMessage = JsonRpcRequest | JsonRpcNotification | JsonRpcResponse

export type Classified =
  | { kind: 'request', message: JsonRpcRequest }
  | { kind: 'notification', message: JsonRpcNotification }
  | { kind: 'response', message: JsonRpcResponse }
  | { kind: 'invalid', id: RequestId | null, reason: string }

/** A plain JSON object (not null, not an array). */
export function isRecord (value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

function isValidId (id: unknown): id is RequestId {
  return typeof id === 'string' || (typeof id === 'number' && Number.isInteger(id))
}

/** Reads an id only when it is one the spec allows, so an error can echo it (J-4). */
export function readableId (value: unknown): RequestId | null {
  return isRecord(value) && isValidId(value.id) ? value.id : null
}

/** Classifies one decoded JSON value as a JSON-RPC message; never throws. */
export function classify (value: unknown): Classified {
  if (!isRecord(value)) return { kind: 'invalid', id: null, reason: 'message must be a JSON object' }
  const id = readableId(value)
  if (value.jsonrpc !== '2.0') return { kind: 'invalid', id, reason: 'jsonrpc must be "2.0"' }
  const hasId = 'id' in value
  if ('method' in value) {
    if (typeof value.method !== 'string' || value.method.length === 0) return { kind: 'invalid', id, reason: 'method must be a non-empty string' }
    // MCP narrows JSON-RPC here too: params, when present, is an object (never an array).
    if ('params' in value && value.params !== undefined && !isRecord(value.params)) return { kind: 'invalid', id, reason: 'params must be an object' }
    if (!hasId) return { kind: 'notification', message: value as unknown as JsonRpcNotification }
    if (!isValidId(value.id)) return { kind: 'invalid', id: null, reason: 'id must be a string or an integer (not null)' }
    return { kind: 'request', message: value as unknown as JsonRpcRequest }
  }
  if ('result' in value || 'error' in value) {
    if ('result' in value && 'error' in value) return { kind: 'invalid', id, reason: 'a response carries result or error, not both' }
    if ('error' in value) {
      const err = value.error
      if (!isRecord(err) || typeof err.code !== 'number' || !Number.isInteger(err.code) || typeof err.message !== 'string') {
        return { kind: 'invalid', id, reason: 'error must have an integer code and a string message' }
      }
      if (hasId && value.id !== null && !isValidId(value.id)) return { kind: 'invalid', id: null, reason: 'id must be a string or an integer' }
      return { kind: 'response', message: value as unknown as JsonRpcFailure }
    }
    if (!isValidId(value.id)) return { kind: 'invalid', id: null, reason: 'a result response needs a string or integer id' }
    return { kind: 'response', message: value as unknown as JsonRpcSuccess }
  }
  return { kind: 'invalid', id, reason: 'not a request, notification or response' }
}

export function isRequest (m: JsonRpcMessage): m is JsonRpcRequest {
  return 'method' in m && 'id' in m
}

export function isNotification (m: JsonRpcMessage): m is JsonRpcNotification {
  return 'method' in m && !('id' in m)
}

export function isResponse (m: JsonRpcMessage): m is JsonRpcResponse {
  return !('method' in m)
}

/** The request a `notifications/cancelled` names, if it names one validly (U-CAN-1: else ignored). */
export function cancelledRequestOf (m: JsonRpcMessage): RequestId | undefined {
  if (!isNotification(m) || m.method !== 'notifications/cancelled' || !isRecord(m.params)) return undefined
  const id = m.params.requestId
  return isValidId(id) ? id : undefined
}

/** Builds an error response; `id` null means the request id could not be read (J-4). */
export function errorResponse (id: RequestId | null, code: number, message: string, data?: unknown): JsonRpcFailure {
  const error: JsonRpcErrorObject = data === undefined ? { code, message } : { code, message, data }
  return id === null ? { jsonrpc: '2.0', id: null, error } : { jsonrpc: '2.0', id, error }
}

/** The request's `_meta.progressToken`, if it carries a valid one (U-PROG-1). */
export function progressTokenOf (m: JsonRpcRequest): RequestId | undefined {
  const params = m.params
  if (!isRecord(params)) return undefined
  const meta = params._meta
  if (!isRecord(meta)) return undefined
  const token = meta.progressToken
  return isValidId(token) ? token : undefined
}

export const JSONRPC_PARSE_ERROR = -32700
export const JSONRPC_INVALID_REQUEST = -32600
export const JSONRPC_METHOD_NOT_FOUND = -32601
export const JSONRPC_INVALID_PARAMS = -32602
export const JSONRPC_INTERNAL_ERROR = -32603
