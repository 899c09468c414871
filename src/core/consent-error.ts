// How a consent the user must give reaches the client. Every client gets
// GW_ERR_CREDENTIAL_CONSENT_REQUIRED (-32014) with the link in data.authorizationUrl and what to do
// in data.action. A 2025-11-25 client that declared URL-mode elicitation (`capabilities.elicitation.url`)
// gets the spec's URLElicitationRequiredError instead (-32042, data.elicitations: one `url` mode
// elicitation), which it can show as a link to open (MCP 2025-11-25, Elicitation, "URL Mode" and
// "URL Elicitation Required Error"). -32042 exists in 2025-11-25 only: other versions keep -32014
// (docs/spec-rules.md J-8). The link is the gateway's own: the tokens the user grants there go
// to the gateway, never through the client (U-ELIC-1).
import { GW_ERR_CREDENTIAL_CONSENT_REQUIRED, GW_ERR_URL_ELICITATION_REQUIRED, isGatewayError, toJsonRpcError, withData, type GatewayError } from './errors.js'
import type { JsonRpcResponse } from './jsonrpc.js'

/** The version whose clients may receive -32042. */
const URL_ELICITATION_VERSION = '2025-11-25'

/** What the client declared at initialize. */
export interface ClientDeclaration {
  protocolVersion: string | undefined
  capabilities: unknown
}

/** Whether the client can take a URL-mode elicitation. */
export function acceptsUrlElicitation (client: ClientDeclaration): boolean {
  if (client.protocolVersion !== URL_ELICITATION_VERSION) return false
  const elicitation = (client.capabilities as { elicitation?: unknown } | null | undefined)?.elicitation
  if (typeof elicitation !== 'object' || elicitation === null) return false
  const url = (elicitation as { url?: unknown }).url
  return typeof url === 'object' && url !== null
}

/**
 * `err` as this client should see it: a consent-required error becomes a URL elicitation when the
 * client takes one; every other error is returned as it is.
 */
export function consentErrorFor<E> (err: E, client: ClientDeclaration): E | GatewayError {
  if (!isGatewayError(err) || err.code !== 'GW_ERR_CREDENTIAL_CONSENT_REQUIRED' || !acceptsUrlElicitation(client)) return err
  const data = err.data ?? {}
  const server = String(data.server)
  const elicitation = { mode: 'url', elicitationId: String(data.elicitationId), url: String(data.authorizationUrl), message: String(data.action) }
  const converted: GatewayError = new GW_ERR_URL_ELICITATION_REQUIRED(server)
  return withData(converted, { elicitations: [elicitation], server })
}

/**
 * The same for an answer already rendered: an HTTP backend connection answers a request whose
 * credential it could not get with the gateway's error as a JSON-RPC error (data.source 'gateway'),
 * which the relay hands on; this makes it the URL elicitation error where the client takes one.
 */
export function consentAnswerFor (response: JsonRpcResponse, client: ClientDeclaration): JsonRpcResponse {
  if (!('error' in response) || !acceptsUrlElicitation(client)) return response
  const data = response.error.data as Record<string, unknown> | undefined
  if (data?.source !== 'gateway' || data.code !== 'GW_ERR_CREDENTIAL_CONSENT_REQUIRED') return response
  const { source: _source, code: _code, ...rest } = data
  const err = withData(new GW_ERR_CREDENTIAL_CONSENT_REQUIRED(String(data.server)), rest)
  return toJsonRpcError(consentErrorFor(err, client), response.id ?? null)
}
