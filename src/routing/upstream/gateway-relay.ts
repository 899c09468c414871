// Backend connections the gateway initialises itself, for no one client: a pool's connections
// (pool.ts) and an aggregate's dedicated members (aggregate/relay.ts). Their relays speak the
// gateway's own protocol version and declare what the gateway can carry to whichever client a
// request belongs to.
import type { BackendServerConfig } from '../../config/schema.js'
import { LATEST_VERSION } from '../../core/protocol-version.js'
import { Relay, type RelayOptions } from './relay.js'

/** Client capabilities declared upstream: those an `input_required` round can carry. */
export const BRIDGED_CAPABILITIES: Record<string, unknown> = { sampling: {}, elicitation: { form: {}, url: {} }, roots: {} }

/** The `initialize` params of such a connection. */
export const GATEWAY_INITIALIZE_PARAMS = Object.freeze({ protocolVersion: LATEST_VERSION, capabilities: BRIDGED_CAPABILITIES, clientInfo: { name: 'mcp-gateway', version: '0.1.0' } })

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
    requestTimeoutMs: config.requestTimeoutMs,
    cancelOnTimeout: config.transport === 'stdio',
    backendTransport: config.transport,
    createdAt: Date.now()
  })
}
