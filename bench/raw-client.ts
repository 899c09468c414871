// A lightweight MCP client on node:http for the memory phases: initialize, initialized, then a
// GET stream held open and drained. Thousands of SDK clients (a fetch stack, a Client and a
// transport each) would cost this process more memory and CPU than the gateway under test.
import { Agent, request, type ClientRequest, type IncomingHttpHeaders, type IncomingMessage } from 'node:http'
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js'

/** POSTs and DELETEs share a few kept-alive sockets; each GET stream holds its own socket. */
const postAgent = new Agent({ keepAlive: true, maxSockets: 64 })
const streamAgent = new Agent({ keepAlive: false })

export interface RawSession {
  sid: string
  version: string
  url: URL
  get: ClientRequest
  /** Set when we close the stream ourselves; a stream closing without it was dropped. */
  closing: boolean
}

function send (url: URL, method: string, headers: Record<string, string>, body: string | null, agent: Agent): Promise<{ req: ClientRequest, res: IncomingMessage }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers: body === null ? headers : { ...headers, 'content-length': String(Buffer.byteLength(body)) }, agent })
    req.once('response', res => { resolve({ req, res }) })
    req.once('error', reject)
    req.end(body ?? undefined)
  })
}

async function readAll (res: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of res) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

const header = (headers: IncomingHttpHeaders, name: string): string | null => {
  const value = headers[name]
  return typeof value === 'string' ? value : null
}

const JSON_HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

/** initialize, notifications/initialized, then a GET stream; onDrop runs if the server ends the stream. */
export async function openRawSession (endpoint: string, onDrop: (session: RawSession) => void): Promise<RawSession> {
  const url = new URL(endpoint)
  const init = await send(url, 'POST', JSON_HEADERS, JSON.stringify({
    jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: LATEST_PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'bench-idle', version: '1.0.0' } }
  }), postAgent)
  // An SSE or a JSON answer: either way the body ends after the response, and holds it whole.
  const body = await readAll(init.res)
  const sid = header(init.res.headers, 'mcp-session-id')
  if (init.res.statusCode !== 200 || sid === null || !body.includes('"result"')) throw new Error(`initialize answered ${String(init.res.statusCode)}: ${body.slice(0, 200)}`)
  const version = /"protocolVersion":"([^"]+)"/.exec(body)?.[1] ?? LATEST_PROTOCOL_VERSION
  const headers = { ...JSON_HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': version }
  const initialized = await send(url, 'POST', headers, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), postAgent)
  await readAll(initialized.res)
  if (initialized.res.statusCode !== 202) throw new Error(`notifications/initialized answered ${String(initialized.res.statusCode)}`)
  const get = await send(url, 'GET', { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': version }, null, streamAgent)
  if (get.res.statusCode !== 200) {
    const text = await readAll(get.res)
    throw new Error(`GET answered ${String(get.res.statusCode)}: ${text.slice(0, 200)}`)
  }
  const session: RawSession = { sid, version, url, get: get.req, closing: false }
  // Keep-alives and priming events are read and dropped.
  get.res.resume()
  get.res.once('close', () => { if (!session.closing) onDrop(session) })
  get.req.on('error', () => {})
  return session
}

/** Closes the GET stream, then ends the session with DELETE. */
export async function closeRawSession (session: RawSession): Promise<void> {
  session.closing = true
  session.get.destroy()
  try {
    const del = await send(session.url, 'DELETE', { 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version }, null, postAgent)
    await readAll(del.res)
  } catch { /* the gateway may be gone already */ }
}
