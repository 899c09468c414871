// Raw Streamable HTTP against a gateway's `/mcp/full` route: a POST with the session's headers, a
// session opened by initialize + initialized, a tools/call body. For tests that assert the wire
// shape (JSON body or SSE, event ids), which an SDK client would hide.
import type { RunningGateway } from './gateway.js'
import { SseReader } from './sse-client.js'

const ACCEPT = 'application/json, text/event-stream'

export interface RawSession { sid: string, version: string }

export async function post (gw: RunningGateway, body: unknown, session?: RawSession): Promise<Response> {
  return await fetch(`${gw.url}/mcp/full`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: ACCEPT,
      ...(session === undefined ? {} : { 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version })
    },
    body: JSON.stringify(body)
  })
}

/** initialize (read to its end), then notifications/initialized (202). */
export async function open (gw: RunningGateway, version: string): Promise<RawSession> {
  const res = await post(gw, { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  const sid = res.headers.get('mcp-session-id') ?? ''
  await new SseReader(res).finished
  const session = { sid, version }
  const ack = await post(gw, { jsonrpc: '2.0', method: 'notifications/initialized' }, session)
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return session
}

export const call = (id: number, name: string, args: Record<string, unknown> = {}, meta?: Record<string, unknown>): Record<string, unknown> =>
  ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args, ...(meta === undefined ? {} : { _meta: meta }) } })
