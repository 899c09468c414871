// A modern (2026-07-28) Streamable HTTP backend (docs/spec-rules.md §5.7 and 5.8): which era a server
// speaks (probeEra), and one stateless request relayed to it as it is (relayModern). No session
// and no state: the client's envelope, its MCP-Protocol-Version / Mcp-Method / Mcp-Name and every
// Mcp-Param-* header go upstream with the request; `input_required` results, their requestState and
// listen streams come back untouched (the backend signs its own state). The client's own
// credentials never go upstream: only the server's headers, the tenant's upstream headers and the
// client headers `forwardHeaders` names.
import { randomBytes } from 'node:crypto'
import type { Dispatcher } from 'undici'
import type { HttpServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_TIMEOUT, GW_ERR_BACKEND_UNAVAILABLE } from '../core/errors.js'
import { classify, isRecord, type JsonRpcResponse } from '../core/jsonrpc.js'
import { MODERN_VERSION, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION } from '../core/protocol-version.js'
import { describe, dispatcherFor, drain, readText, sseDataLines } from './http-io.js'

export type BackendEra = 'legacy' | 'modern'

/** The largest probe answer read. */
const PROBE_BODY_MAX = 1024 * 1024
/** A probe waits at most this long (a silent server then gets the 2025 path and its own deadline). */
const PROBE_TIMEOUT_MS = 5000

/**
 * Which era a server speaks (H-BC-2): a modern `server/discover`; a result naming
 * 2026-07-28, or a modern JSON-RPC error (-32022, -32020, -32602 on a 400), is a modern server;
 * another 4xx or an unrecognised body is a legacy one. A timeout, a network error, 401/403 or a 5xx
 * is no evidence either way: it throws, and the next request probes again.
 */
async function probeEra (server: string, config: HttpServerConfig, headers: Record<string, string>): Promise<BackendEra> {
  const url = urlOf(config)
  const pool = dispatcherFor(url.origin, config.connections, config.connectTimeoutMs)
  const body = JSON.stringify({
    jsonrpc: '2.0',
    id: `gw-probe-${randomBytes(4).toString('hex')}`,
    method: 'server/discover',
    params: { _meta: { [META_PROTOCOL_VERSION]: MODERN_VERSION, [META_CLIENT_CAPABILITIES]: {}, [META_CLIENT_INFO]: { name: 'mcp-gateway', version: '0.1.0' } } }
  })
  let res: Dispatcher.ResponseData
  try {
    res = await pool.request({
      method: 'POST',
      path: url.pathname + url.search,
      headers: { ...headers, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': MODERN_VERSION, 'mcp-method': 'server/discover' },
      body,
      headersTimeout: Math.min(config.requestTimeoutMs, PROBE_TIMEOUT_MS),
      bodyTimeout: Math.min(config.requestTimeoutMs, PROBE_TIMEOUT_MS)
    })
  } catch (err) {
    throw new GW_ERR_BACKEND_UNAVAILABLE(server, `its protocol era could not be probed: ${describe(err)}`)
  }
  const status = res.statusCode
  if (status === 401 || status === 403 || status >= 500) {
    await drain(res.body)
    throw new GW_ERR_BACKEND_UNAVAILABLE(server, `its protocol era could not be probed: HTTP ${status}`)
  }
  let text = ''
  try {
    text = await readText(res.body, PROBE_BODY_MAX)
  } catch {}
  const message = finalResponse(text)
  if (status === 200 && message !== null && 'result' in message && isRecord(message.result)) {
    const versions = message.result.supportedVersions
    return Array.isArray(versions) && versions.some(v => typeof v === 'string' && v >= MODERN_VERSION) ? 'modern' : 'legacy'
  }
  if (status === 400 && message !== null && 'error' in message) {
    const code = message.error.code
    if (code === -32022 || code === -32020 || code === -32602 || code === -32021) return 'modern'
  }
  return 'legacy'
}

/** Each server's parsed URL, by config object (frozen, so the URL never changes under it). */
const urls = new WeakMap<HttpServerConfig, URL>()

function urlOf (config: HttpServerConfig): URL {
  let url = urls.get(config)
  if (url === undefined) urls.set(config, url = new URL(config.url))
  return url
}

/** Probed eras, by server config object (a reload's new config probes again). */
const eras = new WeakMap<HttpServerConfig, Promise<BackendEra>>()

/**
 * The era a server's `protocol` setting names, or null where the probe decides: `auto`, and no
 * setting at all, which means the same (the schema's default; a config built by hand may lack it).
 */
export function configuredEra (config: HttpServerConfig): BackendEra | null {
  return config.protocol === 'legacy' || config.protocol === 'modern' ? config.protocol : null
}

/**
 * The era a Streamable HTTP server speaks: the one its `protocol` names (configuredEra), else probed
 * once (see probeEra) and kept; a failed probe is forgotten, so the next call probes again.
 */
export async function eraOf (server: string, config: HttpServerConfig, headers: () => Record<string, string>): Promise<BackendEra> {
  const configured = configuredEra(config)
  if (configured !== null) return configured
  let era = eras.get(config)
  if (era === undefined) {
    era = probeEra(server, config, headers())
    eras.set(config, era)
    era.catch(() => { eras.delete(config) })
  }
  return await era
}

/**
 * The answer in a modern backend's response body read whole: a JSON body, or the last JSON-RPC
 * response among the SSE events. A modern SSE response carries notifications about its request,
 * then the final response (H-26-5): a notification is never the answer, even one standing
 * last (after the response, or in a body cut short). Null when the body holds no response.
 */
export function finalResponse (text: string): JsonRpcResponse | null {
  const candidates = text.trimStart().startsWith('{') ? [text] : sseDataLines(text)
  for (const candidate of candidates.reverse()) {
    try {
      const c = classify(JSON.parse(candidate))
      if (c.kind === 'response') return c.message
    } catch {}
  }
  return null
}

/** The client headers a modern request carries upstream (protocol, routing and Mcp-Param-*). */
export function modernRequestHeaders (clientHeaders: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {}
  for (const [name, value] of Object.entries(clientHeaders)) {
    const lower = name.toLowerCase()
    if (lower === 'mcp-protocol-version' || lower === 'mcp-method' || lower === 'mcp-name' || lower.startsWith('mcp-param-')) out[lower] = value
  }
  return out
}

/**
 * Sends one modern request upstream and returns the response to stream back. Abort `signal` when
 * the client goes away: closing the upstream request is the cancellation (M-11). A backend that is
 * unreachable, refuses the gateway's credentials or fails (5xx) is -32007; no answer within the
 * server's requestTimeoutMs is -32006.
 */
export async function relayModern (server: string, config: HttpServerConfig, headers: Record<string, string>, body: string, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
  const url = urlOf(config)
  const pool = dispatcherFor(url.origin, config.connections, config.connectTimeoutMs)
  let res: Dispatcher.ResponseData
  try {
    res = await pool.request({
      method: 'POST',
      path: url.pathname + url.search,
      headers: { ...headers, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body,
      signal,
      headersTimeout: config.requestTimeoutMs,
      // A listen stream or a long call may be quiet for long; the client's closing ends it.
      bodyTimeout: 0
    })
  } catch (err) {
    if ((err as { code?: string }).code === 'UND_ERR_HEADERS_TIMEOUT') throw new GW_ERR_BACKEND_TIMEOUT(server, config.requestTimeoutMs)
    throw new GW_ERR_BACKEND_UNAVAILABLE(server, describe(err))
  }
  if (res.statusCode === 401 || res.statusCode === 403 || res.statusCode >= 500) {
    await drain(res.body)
    throw new GW_ERR_BACKEND_UNAVAILABLE(server, `HTTP ${res.statusCode}`)
  }
  return res
}

