// `Mcp-Param-*` headers (M-17, H-26-3): when the gateway itself calls a modern backend (a
// 2025 session bridged by modern-session.ts), it must mirror every tool argument the tool's
// inputSchema marks with `x-mcp-header` as a header, and drop from `tools/list` any tool whose
// marks are invalid. Pure functions; written here rather than taken from the v2 SDK, whose
// implementation is internal to its client transport.
//
// A mark is valid on a property reached from the root through `properties` only (not under items,
// combinators, conditionals or definitions), with a non-empty RFC 9110 token as its value, unique
// case-insensitively, on a string, integer or boolean property.

import { isRecord } from '../core/jsonrpc.js'

export interface HeaderDeclaration {
  /** Property names from the arguments' root. */
  path: string[]
  headerName: string
}

type ScanResult = { valid: true, declarations: HeaderDeclaration[] } | { valid: false, reason: string }

const MARK = 'x-mcp-header'
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
const PRIMITIVE = new Set(['string', 'integer', 'boolean'])
/** Keywords whose subschemas are not reachable through a chain of `properties`. */
const UNREACHABLE = ['items', 'prefixItems', 'contains', 'additionalProperties', 'unevaluatedProperties', 'unevaluatedItems',
  'propertyNames', 'patternProperties', 'dependentSchemas', 'oneOf', 'anyOf', 'allOf', 'not', 'if', 'then', 'else', '$defs', 'definitions']


/** The `x-mcp-header` marks of a tool's inputSchema, or why they are invalid. */
export function scanHeaderDeclarations (inputSchema: unknown): ScanResult {
  const declarations: HeaderDeclaration[] = []
  const seen = new Set<string>()
  const visit = (node: unknown, path: string[], reachable: boolean): string | undefined => {
    if (!isRecord(node)) return undefined
    if (MARK in node) {
      const where = path.length === 0 ? '<root>' : path.join('.')
      if (!reachable || path.length === 0) return `${where}: ${MARK} is only allowed on properties reached through 'properties'`
      const name = node[MARK]
      if (typeof name !== 'string' || !TOKEN.test(name)) return `${where}: ${MARK} must be a non-empty RFC 9110 token`
      if (typeof node.type !== 'string' || !PRIMITIVE.has(node.type)) return `${where}: ${MARK} is only allowed on string, integer or boolean properties`
      if (seen.has(name.toLowerCase())) return `${MARK} '${name}' is declared twice`
      seen.add(name.toLowerCase())
      declarations.push({ path, headerName: name })
    }
    if (isRecord(node.properties)) {
      for (const [key, child] of Object.entries(node.properties)) {
        const fault = visit(child, [...path, key], reachable)
        if (fault !== undefined) return fault
      }
    }
    for (const keyword of UNREACHABLE) {
      const sub = node[keyword]
      if (sub === undefined) continue
      const branches = Array.isArray(sub) ? sub : isRecord(sub) && (keyword === 'patternProperties' || keyword === 'dependentSchemas' || keyword === '$defs' || keyword === 'definitions') ? Object.values(sub) : [sub]
      for (const branch of branches) {
        const fault = visit(branch, [...path, `<${keyword}>`], false)
        if (fault !== undefined) return fault
      }
    }
    return undefined
  }
  const fault = visit(inputSchema, [], true)
  return fault === undefined ? { valid: true, declarations } : { valid: false, reason: fault }
}

/** Tab and printable ASCII only, at least one character. */
const HEADER_SAFE = /^[\t\x20-\x7e]+$/

/** A header value: as is when header-safe, else the `=?base64?…?=` sentinel of its UTF-8. */
export function encodeHeaderValue (value: string): string {
  const safe = HEADER_SAFE.test(value) && value === value.trim() && !(value.startsWith('=?base64?') && value.endsWith('?='))
  return safe ? value : `=?base64?${Buffer.from(value, 'utf8').toString('base64')}?=`
}

/** The `Mcp-Param-*` headers of one tools/call: a marked argument that is absent or null gets none. */
export function paramHeaders (declarations: readonly HeaderDeclaration[], args: unknown): Record<string, string> {
  const headers: Record<string, string> = {}
  for (const { path, headerName } of declarations) {
    let value: unknown = args
    for (const key of path) value = isRecord(value) ? value[key] : undefined
    let text: string | undefined
    if (typeof value === 'string') text = value
    else if (typeof value === 'boolean') text = value ? 'true' : 'false'
    else if (typeof value === 'number' && Number.isFinite(value) && (!Number.isInteger(value) || Number.isSafeInteger(value))) text = String(value)
    if (text !== undefined) headers[`mcp-param-${headerName.toLowerCase()}`] = encodeHeaderValue(text)
  }
  return headers
}
