// The only place (with the HTTP plugins) that knows protocol eras (docs/architecture.md).
// Client-facing negotiation is the gateway's own, independent of the backend's (G-1, L-2).
import { GW_ERR_UNSUPPORTED_PROTOCOL_VERSION } from './errors.js'

/** The session revisions, newest first (2026-07-28, stateless, is MODERN_VERSIONS below). */
export const SUPPORTED_VERSIONS = ['2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'] as const
export type ProtocolVersion = typeof SUPPORTED_VERSIONS[number]
export const LATEST_VERSION: ProtocolVersion = '2025-11-25'
/** The 2026-07-28 (stateless) revisions served; a version dated from the first one on is modern. */
export const MODERN_VERSIONS = ['2026-07-28'] as const
export const MODERN_VERSION = MODERN_VERSIONS[0]
/** The per-request `_meta` keys of the modern revision (M-2, M-7, M-9). */
export const META_PROTOCOL_VERSION = 'io.modelcontextprotocol/protocolVersion'
export const META_CLIENT_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities'
export const META_CLIENT_INFO = 'io.modelcontextprotocol/clientInfo'
export const META_LOG_LEVEL = 'io.modelcontextprotocol/logLevel'
export const META_SERVER_INFO = 'io.modelcontextprotocol/serverInfo'
export const META_SUBSCRIPTION_ID = 'io.modelcontextprotocol/subscriptionId'
/** Assumed when a Streamable HTTP request has no MCP-Protocol-Version and nothing else is known (H-PV-2). */
export const HEADERLESS_DEFAULT_VERSION: ProtocolVersion = '2025-03-26'
/** What a legacy HTTP+SSE session speaks until its initialize says otherwise. */
export const LEGACY_SSE_VERSION: ProtocolVersion = '2024-11-05'

export function isSupportedVersion (value: unknown): value is ProtocolVersion {
  return typeof value === 'string' && (SUPPORTED_VERSIONS as readonly string[]).includes(value)
}

/** Echo a supported requested version, else answer with our latest (a success, not an error: L-2). */
export function negotiateVersion (requested: unknown): ProtocolVersion {
  return isSupportedVersion(requested) ? requested : LATEST_VERSION
}

/** JSON-RPC batches exist only in 2025-03-26 (J-6). */
export function allowsBatches (version: string): boolean {
  return version === '2025-03-26'
}

/** Priming events (empty data) and `retry` only for 2025-11-25+: older clients break on empty data (H-POST-7). */
export function allowsPriming (version: string): boolean {
  return version >= '2025-11-25'
}

/**
 * Checks a request's MCP-Protocol-Version header on a session (H-PV-1..3): a present value must be
 * a supported version; it need not be the negotiated one (the spec asks 400 only for an invalid or
 * unsupported version, and the conformance suite sends 2025-03-26 on 2025-11-25 sessions). The
 * session's negotiated version still decides behaviour (priming, batches); an absent header
 * means that version too.
 */
export function checkVersionHeader (header: string | string[] | undefined): void {
  if (header === undefined) return
  const value = Array.isArray(header) ? header[0] : header
  if (!isSupportedVersion(value)) {
    throw new GW_ERR_UNSUPPORTED_PROTOCOL_VERSION(`Unsupported protocol version: ${String(value).slice(0, 40)} (supported: ${SUPPORTED_VERSIONS.join(', ')})`)
  }
}
