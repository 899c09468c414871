// Hostile input (docs/operating.md): what reaches a client before or beside a route is in
// the gateway's JSON-RPC error format, a body over the limit gets its 413 (not a reset), and
// `Connection: close` is honoured on answers written on hijacked replies.
import t from 'tap'
import { ACCEPT_BOTH, initMessage, isolationTenants, PUBLIC_URL, newKey } from '../helpers/auth.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { startReplica } from '../helpers/replicas.js'
import { rawExchange } from '../helpers/raw-http.js'

const MiB = 1024 * 1024

/** One raw HTTP exchange: status, parsed body, and whether the gateway closed the socket. */
async function raw (base: string, bytes: string): Promise<{ text: string, status: number, body: Record<string, unknown> | undefined, closed: boolean }> {
  const answer = await rawExchange(base, bytes)
  let body: Record<string, unknown> | undefined
  try { body = JSON.parse(answer.body) as Record<string, unknown> } catch { body = undefined }
  return { ...answer, body }
}

const isGatewayFormat = (body: unknown, code: string): boolean => {
  const b = body as { jsonrpc?: string, error?: { code?: number, data?: { source?: string, code?: string } } } | undefined
  return b?.jsonrpc === '2.0' && typeof b.error?.code === 'number' && b.error.data?.source === 'gateway' && b.error.data.code === code
}

async function postBig (url: string, body: string, chunked: boolean): Promise<string> {
  const bytes = Buffer.from(body)
  // Chunked: no Content-Length, so the limit is found while reading; in 64 KiB pieces, as a stream.
  const stream = new ReadableStream<Uint8Array>({
    start (controller) {
      for (let at = 0; at < bytes.length; at += 65536) controller.enqueue(bytes.subarray(at, at + 65536))
      controller.close()
    }
  })
  try {
    const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: chunked ? stream : body, duplex: 'half' } as RequestInit)
    const answer = await res.json() as unknown
    return res.status === 413 && isGatewayFormat(answer, 'GW_ERR_PAYLOAD_TOO_LARGE') ? 'ok' : `status ${res.status}`
  } catch (err) {
    return String((err as { cause?: { code?: string } }).cause?.code ?? err)
  }
}

// The gateway runs in a process of its own: in this one, the client's writes and the server's
// close take turns on one event loop and the reset (EPIPE) that undici saw never happens.
t.test('a body over http.bodyLimit: every fetch gets its 413 and JSON-RPC error, none a reset', async t => {
  const gw = await startReplica(t, 'edge', { http: { bodyLimit: MiB }, servers: { full: stdioFixture('full-server') } })
  const big = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x'.repeat(3 * MiB) } } })
  for (const chunked of [false, true]) {
    const outcomes: string[] = []
    for (let i = 0; i < 20; i++) outcomes.push(await postBig(`${gw.url}/mcp/full`, big, chunked))
    const failures = outcomes.filter(o => o !== 'ok')
    t.equal(failures.length, 0, `${chunked ? 'chunked' : 'with Content-Length'}: 20 of 20 got 413 with the gateway's error (failures: ${failures.join(', ') || 'none'})`)
  }
  const after = await fetch(`${gw.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: JSON.stringify(initMessage()) })
  t.equal(after.status, 200, 'the gateway still serves a normal request')
  await after.body?.cancel()
})

t.test('framework errors answer in the gateway format, with and without tenants', async t => {
  const { owner, config } = isolationTenants()
  const plain = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const tenants = await startGateway(t, config)
  for (const [label, gw] of [['no tenants', plain], ['tenants', tenants]] as const) {
    const post = async (path: string, headers: Record<string, string> = {}): Promise<{ status: number, body: unknown }> => {
      const res = await fetch(gw.url + path, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...headers }, body: JSON.stringify(initMessage()) })
      return { status: res.status, body: await res.json() }
    }
    const badUrl = await post('/mcp/%ff%fe')
    t.equal(badUrl.status, 400, `${label}: malformed percent-encoding is 400`)
    t.ok(isGatewayFormat(badUrl.body, 'GW_ERR_BAD_REQUEST'), `${label}: in the gateway's format`)
    const long = await post(`/mcp/${'a'.repeat(101)}`)
    t.equal(long.status, 404, `${label}: a 101-character name is 404`)
    t.ok(isGatewayFormat(long.body, 'GW_ERR_SERVER_NOT_FOUND'), `${label}: as an unknown server`)
    const hundred = await post(`/mcp/${'a'.repeat(100)}`, label === 'tenants' ? { 'x-api-key': owner.key } : {})
    t.equal(hundred.status, 404, `${label}: and a 100-character name, as before`)
    const longSse = await fetch(`${gw.url}/sse/${'b'.repeat(300)}/messages?sessionId=x`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
    t.equal(longSse.status, 404, `${label}: the legacy messages URL too`)
    t.ok(isGatewayFormat(await longSse.json(), 'GW_ERR_SERVER_NOT_FOUND'))
  }
})

t.test("the HTTP parser's refusals answer in the gateway format and close", async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const garbage = await raw(gw.url, 'GARBAGE\r\n\r\n')
  t.equal(garbage.status, 400, 'a line that is not HTTP: 400')
  t.ok(isGatewayFormat(garbage.body, 'GW_ERR_BAD_REQUEST'), 'with a JSON-RPC error body')
  t.ok(garbage.closed, 'and the connection closed')
  const badLength = await raw(gw.url, 'POST /mcp/full HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nabcde')
  t.equal(badLength.status, 400, 'two Content-Length values: 400')
  t.ok(isGatewayFormat(badLength.body, 'GW_ERR_BAD_REQUEST'))
  const huge = await raw(gw.url, `GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ${'h'.repeat(20_000)}\r\n\r\n`)
  t.equal(huge.status, 431, 'headers over the limit: 431')
  t.ok(isGatewayFormat(huge.body, 'GW_ERR_HEADERS_TOO_LARGE'))
  const health = await fetch(`${gw.url}/healthz`)
  t.equal(health.status, 200, 'the gateway is still up')
})

/** A POST with `Connection: close` on a raw socket: the status, headers and body, and whether the gateway closed the socket. */
async function postClosing (base: string, body: unknown, headers: Record<string, string>): Promise<{ status: number, headers: Record<string, string>, text: string, serverClosed: boolean }> {
  const payload = JSON.stringify(body)
  const head = Object.entries({ host: new URL(base).host, 'content-type': 'application/json', accept: ACCEPT_BOTH, connection: 'close', 'content-length': String(Buffer.byteLength(payload)), ...headers })
    .map(([name, value]) => `${name}: ${value}\r\n`).join('')
  const answer = await raw(base, `POST /mcp/full HTTP/1.1\r\n${head}\r\n${payload}`)
  const lines = answer.text.slice(0, answer.text.indexOf('\r\n\r\n')).split('\r\n').slice(1)
  const parsed: Record<string, string> = {}
  for (const line of lines) parsed[line.slice(0, line.indexOf(':')).toLowerCase()] = line.slice(line.indexOf(':') + 1).trim()
  return { status: answer.status, headers: parsed, text: answer.text, serverClosed: answer.closed }
}

t.test('Connection: close is honoured on SSE-answered POSTs and on JSON answers of hijacked replies', async t => {
  const sse = await startGateway(t, { http: { lazySseMs: 0 }, servers: { full: stdioFixture('full-server') } })
  const init = await postClosing(sse.url, initMessage(), {})
  t.equal(init.status, 200)
  t.match(String(init.headers['content-type']), /text\/event-stream/, 'answered as SSE')
  t.equal(init.headers.connection, 'close', 'the SSE answer says Connection: close')
  t.ok(init.serverClosed, 'and the gateway closed the socket after it')
  t.match(init.text, /"result"/)

  const json = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const first = await postClosing(json.url, initMessage(), {})
  t.match(String(first.headers['content-type']), /application\/json/, 'an initialize answered as one JSON body')
  t.equal(first.headers.connection, 'close', 'says Connection: close')
  t.ok(first.serverClosed, 'and the socket is closed after it')
  const sid = String(first.headers['mcp-session-id'])
  const call = await postClosing(json.url, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'echo', arguments: { text: 'hi' } } }, { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' })
  t.equal(call.headers.connection, 'close', 'a call answered as JSON says Connection: close')
  t.ok(call.serverClosed)
  const refused = await postClosing(json.url, { jsonrpc: '2.0', id: 3, method: 'tools/list' }, { 'mcp-session-id': 'nope' })
  t.equal(refused.status, 404)
  t.equal(refused.headers.connection, 'close', 'a refusal too')
})

t.test('tenants: a long name is 404 before authentication, nothing else is learnt', async t => {
  const key = newKey('k')
  const gw = await startGateway(t, { auth: { publicUrl: PUBLIC_URL }, tenants: { acme: { apiKeys: [key.entry], servers: { full: {} } } }, servers: { full: stdioFixture('full-server') } })
  const res = await fetch(`${gw.url}/mcp/${'z'.repeat(150)}`, { method: 'GET', headers: { accept: 'text/event-stream' } })
  t.equal(res.status, 404)
  t.notOk(res.headers.has('www-authenticate'), 'no challenge for a name no server can have')
})
