// Bodies only where they belong (GET and DELETE never parse one; the Python SDK sends
// `content-type: application/json` on every request, DELETE included) and the version header as
// the spec says (any supported version is accepted on an existing session). Raw HTTP, so every
// header is the one a real client sends.
import { request } from 'node:http'
import t from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { SseReader } from '../helpers/sse-client.js'

const ACCEPT = 'application/json, text/event-stream'
/** What httpx (the Python SDK's HTTP client) sends with every MCP request. */
const PYTHON_SDK = { accept: ACCEPT, 'content-type': 'application/json', 'user-agent': 'python-httpx/0.28.1', 'accept-encoding': 'gzip, deflate', connection: 'keep-alive' }

interface RawAnswer { status: number, body: string }

/** One raw request with exactly these headers and body (node:http adds only Host). */
async function raw (gw: RunningGateway, method: string, headers: Record<string, string>, body?: string): Promise<RawAnswer> {
  const url = new URL(gw.url)
  return await new Promise((resolve, reject) => {
    const sized = body === undefined || headers['transfer-encoding'] !== undefined ? headers : { 'content-length': String(Buffer.byteLength(body)), ...headers }
    const req = request({ host: url.hostname, port: url.port, method, path: '/mcp/full', headers: sized, agent: false }, res => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', chunk => {
        text += String(chunk)
        // A GET stream stays open: its headers and first bytes are all this test needs.
        if (method === 'GET') { req.destroy(); resolve({ status: res.statusCode ?? 0, body: text }) }
      })
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }))
    })
    req.on('error', err => { if (method !== 'GET') reject(err) })
    req.end(body)
  })
}

async function session (gw: RunningGateway, version: string): Promise<string> {
  const res = await fetch(`${gw.url}/mcp/full`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  })
  const sid = res.headers.get('mcp-session-id') ?? ''
  await new SseReader(res).finished
  const ack = await raw(gw, 'POST', { ...PYTHON_SDK, 'mcp-session-id': sid, 'mcp-protocol-version': version }, JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }))
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return sid
}

t.test('DELETE and GET with a Content-Type and no body, as the Python SDK sends them', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const sid = await session(gw, '2025-06-18')
  const headers = { ...PYTHON_SDK, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' }

  const get = await raw(gw, 'GET', { ...headers, accept: 'text/event-stream', 'content-length': '0' })
  t.equal(get.status, 200, 'GET with content-type application/json opens the stream')

  const del = await raw(gw, 'DELETE', { ...headers, 'content-length': '0' })
  t.equal(del.status, 200, 'DELETE with content-type application/json and no body ends the session')
  t.notMatch(del.body, /-32700/, 'no parse error')
  const after = await raw(gw, 'POST', headers, JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list' }))
  t.equal(after.status, 404, 'the session is gone')
})

t.test('a body on DELETE, of any type, is ignored; POST still parses strictly', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const sid = await session(gw, '2025-11-25')
  const del = await raw(gw, 'DELETE', { 'content-type': 'text/plain', 'mcp-session-id': sid }, 'not json at all')
  t.equal(del.status, 200, 'a text body on DELETE is harmless', { body: del.body })
  const broken = await raw(gw, 'DELETE', { 'content-type': 'application/json', 'mcp-session-id': sid }, '{"broken')
  t.equal(broken.status, 404, 'a broken JSON body on DELETE is not parsed: the answer is about the session')

  const empty = await raw(gw, 'POST', { ...PYTHON_SDK, 'content-length': '0' })
  t.equal(empty.status, 400, 'POST with an empty JSON body is a parse error')
  t.match(empty.body, /-32700/)
  const text = await raw(gw, 'POST', { accept: ACCEPT, 'content-type': 'text/plain' }, 'hello')
  t.equal(text.status, 415, 'POST with another media type is 415')
  const none = await raw(gw, 'POST', { accept: ACCEPT, 'transfer-encoding': 'chunked' }, '{}')
  t.equal(none.status, 415, 'POST with a body and no Content-Type is 415')
})

t.test('MCP-Protocol-Version: any supported version is accepted on a session; the negotiated one decides', async t => {
  // Every answer as an SSE stream at once (no lazy JSON): the stream's first event shows the version.
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, http: { lazySseMs: 0 } })
  const sid = await session(gw, '2025-11-25')
  const list = JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'tools/list' })
  for (const version of ['2025-03-26', '2025-06-18', '2024-11-05']) {
    const res = await raw(gw, 'POST', { ...PYTHON_SDK, 'mcp-session-id': sid, 'mcp-protocol-version': version }, list)
    t.equal(res.status, 200, `${version} on a 2025-11-25 session is accepted`)
    t.match(res.body, /"tools"/)
    // The session's version decides: a 2025-11-25 stream opens with a priming event.
    t.match(res.body, /^id: [^\n]+\nretry: \d+\ndata: \n/, 'answered as 2025-11-25 (priming event first)')
  }
  const batch = await raw(gw, 'POST', { ...PYTHON_SDK, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-03-26' }, `[${list}]`)
  t.equal(batch.status, 400, 'a 2025-03-26 header does not enable batches on a 2025-11-25 session')
  const bad = await raw(gw, 'POST', { ...PYTHON_SDK, 'mcp-session-id': sid, 'mcp-protocol-version': '1999-01-01' }, list)
  t.equal(bad.status, 400, 'an unsupported version is 400')
  t.match(bad.body, /Unsupported protocol version/)
  const garbage = await raw(gw, 'GET', { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': 'latest' })
  t.equal(garbage.status, 400, 'an invalid version on GET is 400')
  const del = await raw(gw, 'DELETE', { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-03-26' })
  t.equal(del.status, 200, 'a supported version on DELETE is accepted')
})
