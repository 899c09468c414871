// Backend connections the gateway initialises itself, for no one client: a pool's connections
// (pool-connection.ts) and an aggregate's dedicated members (aggregate/relay.ts). Their relays speak
// the gateway's own protocol version and declare what the gateway can carry to whichever client a
// request belongs to; the gateway runs their initialize handshake (initializeBackend) and keeps
// what the backend said of itself.
import type { BackendServerConfig } from '../../config/schema.js'
import { credentialErrorOf, GW_ERR_BACKEND_UNAVAILABLE } from '../../core/errors.js'
import { isRecord, isResponse, type JsonRpcMessage, type JsonRpcResponse } from '../../core/jsonrpc.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import { Relay, type RelayOptions } from './relay.js'

/** Client capabilities declared upstream: those an `input_required` round can carry. */
export const BRIDGED_CAPABILITIES: Record<string, unknown> = { sampling: {}, elicitation: { form: {}, url: {} }, roots: {} }

/** The `initialize` params of such a connection. */
export const GATEWAY_INITIALIZE_PARAMS = Object.freeze({ protocolVersion: LATEST_VERSION, capabilities: BRIDGED_CAPABILITIES, clientInfo: { name: 'mcp-gateway', version: '0.1.0' } })

/** What a backend said about itself when the gateway initialised it (answers server/discover and a pooled session's initialize). */
export interface BackendInfo {
  protocolVersion: string
  capabilities: Record<string, unknown>
  serverInfo: Record<string, unknown>
  instructions?: string
}

export type GatewayRelayOptions = Omit<RelayOptions, 'legacy' | 'direct' | 'isOwner' | 'protocolVersion' | 'clientCapabilities' | 'requestTimeoutMs' | 'cancelOnTimeout' | 'backendTransport' | 'createdAt'> & {
  /** The backend server's config: its deadline and transport. */
  config: BackendServerConfig
}

/** The relay of a connection the gateway initialises itself (ids mapped, one replica, no client of its own). */
export function gatewayRelay ({ config, ...options }: GatewayRelayOptions): Relay {
  return new Relay({
    ...options,
    legacy: false,
    direct: false,
    isOwner: true,
    protocolVersion: LATEST_VERSION,
    clientCapabilities: BRIDGED_CAPABILITIES,
    rendersConsent: false,
    requestTimeoutMs: config.requestTimeoutMs,
    cancelOnTimeout: config.transport === 'stdio',
    backendTransport: config.transport,
    createdAt: Date.now()
  })
}

/**
 * The initialize handshake of a gateway relay whose backend is connected: `initialize` (with
 * GATEWAY_INITIALIZE_PARAMS) under `key` as its id and stream id, then `notifications/initialized`.
 * The relay addresses its answer to the stream `key`, which the caller routes: `expect` is handed
 * the function to call with what arrives there. Rejects with GW_ERR_BACKEND_UNAVAILABLE when the
 * backend refuses. The supervisor captures both messages, so a restarted child is initialised
 * again without the caller.
 */
export async function initializeBackend (relay: Relay, key: string, expect: (onMessage: (message: JsonRpcMessage) => void) => void): Promise<BackendInfo> {
  const answer = await new Promise<JsonRpcResponse>(resolve => {
    expect(message => { if (isResponse(message)) resolve(message) })
    relay.deliver({ jsonrpc: '2.0', id: key, method: 'initialize', params: GATEWAY_INITIALIZE_PARAMS }, key)
  })
  // A caller's credential that could not be had says so itself (which authorization server, why).
  if ('error' in answer) throw credentialErrorOf(answer.error) ?? new GW_ERR_BACKEND_UNAVAILABLE(relay.server, `initialize failed: ${answer.error.message}`)
  relay.deliver({ jsonrpc: '2.0', method: 'notifications/initialized' }, null)
  return backendInfoOf(relay.server, answer.result)
}

/** What an initialize result says of its backend, with defaults for what it leaves out. */
export function backendInfoOf (server: string, result: unknown): BackendInfo {
  const r = isRecord(result) ? result : {}
  return {
    protocolVersion: typeof r.protocolVersion === 'string' ? r.protocolVersion : LATEST_VERSION,
    capabilities: isRecord(r.capabilities) ? r.capabilities : {},
    serverInfo: isRecord(r.serverInfo) ? r.serverInfo : { name: server, version: '0' },
    ...(typeof r.instructions === 'string' ? { instructions: r.instructions } : {})
  }
}
