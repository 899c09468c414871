// Tenants for tests: API keys made on the spot (only their digests go into the config), and raw
// MCP calls that carry a credential.
import { apiKeyDigest, generateApiKey } from '../../src/auth/api-keys.js'
import { SseReader } from './sse-client.js'
import { stdioFixture } from './gateway.js'

export const ACCEPT_BOTH = 'application/json, text/event-stream'
export const PUBLIC_URL = 'https://gw.example.com'

export interface TestKey { id: string, key: string, entry: { id: string, sha256: string } }

export function newKey (id: string): TestKey {
  const key = generateApiKey()
  return { id, key, entry: { id, sha256: apiKeyDigest(key) } }
}

export const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` })

export function initMessage (id: number | string = 1, version = '2025-11-25'): Record<string, unknown> {
  return { jsonrpc: '2.0', id, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }
}

export async function post (base: string, path: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...headers },
    body: JSON.stringify(body)
  })
}

/** Opens a Streamable HTTP session with a credential; returns its id and negotiated version. */
export async function openSession (base: string, server: string, credential: Record<string, string>): Promise<{ sid: string, version: string }> {
  const res = await post(base, `/mcp/${server}`, initMessage(), credential)
  const sid = res.headers.get('mcp-session-id')
  if (res.status !== 200 || sid === null) throw new Error(`initialize got ${res.status}: ${await res.text()}`)
  const reader = new SseReader(res)
  await reader.until(ev => ev.some(e => e.data.includes('"result"')))
  const result = reader.messages().find(m => 'result' in m)?.result as { protocolVersion: string }
  const ack = await post(base, `/mcp/${server}`, { jsonrpc: '2.0', method: 'notifications/initialized' }, { ...credential, 'mcp-session-id': sid, 'mcp-protocol-version': result.protocolVersion })
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return { sid, version: result.protocolVersion }
}

/** Calls a tool over a session and returns the JSON-RPC response. */
export async function callTool (base: string, server: string, credential: Record<string, string>, session: { sid: string, version: string }, name: string, args: Record<string, unknown> = {}, id: number = 2): Promise<{ status: number, message: Record<string, unknown> | undefined }> {
  const res = await post(base, `/mcp/${server}`, { jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }, { ...credential, 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version })
  if (res.status !== 200 || !(res.headers.get('content-type') ?? '').includes('event-stream')) {
    return { status: res.status, message: await res.json().catch(() => undefined) as Record<string, unknown> | undefined }
  }
  const reader = new SseReader(res)
  await reader.until(ev => ev.some(e => e.data.includes(`"id":${id}`)))
  return { status: res.status, message: reader.messages().find(m => m.id === id) }
}

/**
 * The isolation tests' tenants: `owner` and `sibling` (another subject) in tenant acme, `stranger`
 * in tenant beta, both tenants allowed the full-server fixture.
 */
export function isolationTenants (): { owner: TestKey, sibling: TestKey, stranger: TestKey, config: Record<string, unknown> } {
  const owner = newKey('owner-bot')
  const sibling = newKey('sibling-bot')
  const stranger = newKey('stranger-bot')
  const config = {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [owner.entry, sibling.entry], servers: { full: {} } },
      beta: { apiKeys: [stranger.entry], servers: { full: {} } }
    },
    servers: { full: stdioFixture('full-server') }
  }
  return { owner, sibling, stranger, config }
}
