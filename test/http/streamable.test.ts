// Streamable HTTP transport rules on the wire (docs/spec-rules.md §2, §3, §5): status codes,
// JSON-RPC errors, headers, sessions, batches, resumption. Real gateway, real stdio backend
// (@modelcontextprotocol/server-everything), raw fetch so every byte is visible.
import { request } from 'node:http'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually } from '../helpers/wait.js'

const everything = {
  transport: 'stdio',
  command: process.execPath,
  args: [fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url)), 'stdio']
}

const ACCEPT_BOTH = 'application/json, text/event-stream'
const init = (version = '2025-11-25', id: number | string = 1): Record<string, unknown> => ({
  jsonrpc: '2.0', id, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } }
})

async function post (gw: RunningGateway, body: unknown, headers: Record<string, string> = {}, path = '/mcp/everything'): Promise<Response> {
  return await fetch(gw.url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body)
  })
}

/** Initializes a session and sends notifications/initialized; returns the session id and the init result. */
async function session (gw: RunningGateway, version = '2025-11-25'): Promise<{ sid: string, result: Record<string, unknown> }> {
  const res = await post(gw, init(version))
  const sid = res.headers.get('mcp-session-id')
  if (sid === null) throw new Error(`no session id (status ${res.status})`)
  const reader = new SseReader(res)
  await reader.until(ev => ev.some(e => e.data.includes('"result"')))
  const msg = reader.messages().find(m => 'result' in m)
  const negotiated = String((msg?.result as { protocolVersion?: string } | undefined)?.protocolVersion)
  const ack = await post(gw, { jsonrpc: '2.0', method: 'notifications/initialized' }, { 'mcp-session-id': sid, 'mcp-protocol-version': negotiated })
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return { sid, result: (msg?.result ?? {}) as Record<string, unknown> }
}

async function errorOf (res: Response): Promise<{ code: number, message: string, id: unknown }> {
  const body = await res.json() as { id?: unknown, error: { code: number, message: string } }
  return { code: body.error.code, message: body.error.message, id: body.id }
}

t.test('initialize: session id, SSE response with priming event and retry (2025-11-25)', async t => {
  // An SSE stream opened at once (lazySseMs 0): by default an initialize's answer is one JSON
  // body (lazy-sse.test.ts), and a stream that does open follows H-POST-7.
  const gw = await startGateway(t, { servers: { everything }, http: { lazySseMs: 0 } })
  const res = await post(gw, init('2025-11-25'))
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /text\/event-stream/)
  const sid = res.headers.get('mcp-session-id') ?? ''
  t.match(sid, /^[\x21-\x7e]{16,}$/, 'session id is visible ASCII and long')
  const reader = new SseReader(res)
  await reader.until(ev => ev.some(e => e.data.includes('"result"')))
  const [priming] = reader.events
  t.equal(priming?.data, '', 'first event is a priming event with empty data')
  t.match(priming?.id, /^r1_[A-Za-z0-9_-]+\.\d+$/, 'priming event has an id naming its stream')
  t.same(reader.retries, [1000], 'retry hint sent')
  const result = reader.messages()[0] as { id: number, result: { protocolVersion: string, serverInfo: unknown } }
  t.equal(result.id, 1)
  t.equal(result.result.protocolVersion, '2025-11-25')
  t.ok(result.result.serverInfo)
  await reader.finished
  t.ok(reader.done, 'stream ends after the response')
})

t.test('version negotiation: unknown version answered with the latest; older ones echoed, no priming before 2025-11-25', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const odd = await session(gw, '1900-01-01')
  t.equal(odd.result.protocolVersion, '2025-11-25')
  const res = await post(gw, init('2025-06-18'))
  const reader = new SseReader(res)
  await reader.finished
  t.equal(reader.events.length, 1, 'no priming event for 2025-06-18')
  t.equal((reader.messages()[0]?.result as { protocolVersion: string }).protocolVersion, '2025-06-18')
})

t.test('malformed input gets the right HTTP status and JSON-RPC error', async t => {
  const gw = await startGateway(t, { servers: { everything }, http: { bodyLimit: 4096 } })
  const { sid } = await session(gw)
  const h = { 'mcp-session-id': sid }

  let res = await post(gw, '{"jsonrpc": "2.0", "id": 1, "method": ', h)
  t.equal(res.status, 400, 'invalid JSON -> 400')
  t.equal((await errorOf(res)).code, -32700)

  res = await fetch(gw.url + '/mcp/everything', { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...h }, body: Buffer.from([0x7b, 0xff, 0xfe, 0x7d]) })
  t.equal(res.status, 400, 'non-UTF-8 -> 400')
  t.equal((await errorOf(res)).code, -32700)

  res = await post(gw, { jsonrpc: '2.0', id: null, method: 'tools/list' }, h)
  t.equal(res.status, 400, 'null id -> 400')
  t.equal((await errorOf(res)).code, -32600)

  res = await post(gw, { jsonrpc: '1.0', id: 7, method: 'tools/list' }, h)
  t.equal(res.status, 400)
  const e = await errorOf(res)
  t.equal(e.code, -32600)
  t.equal(e.id, 7, 'error echoes a readable id')

  res = await post(gw, [], h)
  t.equal(res.status, 400, 'empty batch')

  res = await post(gw, 'null', h)
  t.equal(res.status, 400, 'JSON null')

  res = await fetch(gw.url + '/mcp/everything', { method: 'POST', headers: { 'content-type': 'text/plain', accept: ACCEPT_BOTH, ...h }, body: 'hi' })
  t.equal(res.status, 415, 'wrong content type')
  t.equal((await errorOf(res)).code, -32000)

  res = await post(gw, { jsonrpc: '2.0', id: 2, method: 'tools/list' }, { ...h, accept: 'application/json' })
  t.equal(res.status, 406, 'Accept without text/event-stream')

  res = await post(gw, { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'echo', arguments: { message: 'x'.repeat(8000) } } }, h)
  t.equal(res.status, 413, 'body over the limit')
  t.equal((await errorOf(res)).code, -32000)

  const put = await fetch(gw.url + '/mcp/everything', { method: 'PUT', headers: h })
  t.equal(put.status, 405)
  t.equal(put.headers.get('allow'), 'GET, POST, DELETE')
})

t.test('sessions: missing id 400, unknown id 404, re-initialize 400, unknown server 404', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  let res = await post(gw, { jsonrpc: '2.0', id: 1, method: 'tools/list' })
  t.equal(res.status, 400, 'no session id')
  res = await post(gw, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, { 'mcp-session-id': 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' })
  t.equal(res.status, 404, 'unknown session')
  t.equal((await errorOf(res)).code, -32001)
  res = await post(gw, { jsonrpc: '2.0', id: 1, method: 'tools/list' }, { 'mcp-session-id': '../../etc/passwd' })
  t.equal(res.status, 404, 'malformed session id is just unknown')
  const { sid } = await session(gw)
  res = await post(gw, init(), { 'mcp-session-id': sid })
  t.equal(res.status, 400, 're-initialize on a session')
  t.equal((await errorOf(res)).code, -32600)
  res = await post(gw, init(), {}, '/mcp/nope')
  t.equal(res.status, 404, 'unknown server')
})

t.test('notifications and responses get 202 with no body', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { sid } = await session(gw)
  const res = await post(gw, { jsonrpc: '2.0', method: 'notifications/roots/list_changed' }, { 'mcp-session-id': sid })
  t.equal(res.status, 202)
  t.equal(await res.text(), '')
  const resp = await post(gw, { jsonrpc: '2.0', id: 's.nobody.1', result: {} }, { 'mcp-session-id': sid })
  t.equal(resp.status, 202, 'an unknown response is accepted and dropped')
})

t.test('MCP-Protocol-Version: unsupported 400, another supported one accepted, absent uses the negotiated one', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { sid } = await session(gw, '2025-06-18')
  const list = { jsonrpc: '2.0', id: 5, method: 'tools/list' }
  let res = await post(gw, list, { 'mcp-session-id': sid, 'mcp-protocol-version': '1999-01-01' })
  t.equal(res.status, 400)
  res = await post(gw, list, { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' })
  t.equal(res.status, 200, 'another supported version is accepted (the session keeps its own)')
  await new SseReader(res).finished
  res = await post(gw, list, { 'mcp-session-id': sid })
  t.equal(res.status, 200)
  const reader = new SseReader(res)
  await reader.finished
  t.ok((reader.messages()[0]?.result as { tools: unknown[] }).tools.length > 0)
})

t.test('batches: answered for 2025-03-26 sessions, refused after; initialize never in a batch', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const old = await session(gw, '2025-03-26')
  const batch = [
    { jsonrpc: '2.0', id: 'a', method: 'tools/call', params: { name: 'echo', arguments: { message: 'one' } } },
    { jsonrpc: '2.0', method: 'notifications/roots/list_changed' },
    { jsonrpc: '2.0', id: 'b', method: 'tools/call', params: { name: 'echo', arguments: { message: 'two' } } }
  ]
  let res = await post(gw, batch, { 'mcp-session-id': old.sid, 'mcp-protocol-version': '2025-03-26' })
  t.equal(res.status, 200)
  const reader = new SseReader(res)
  await reader.finished
  const ids = reader.messages().map(m => m.id).sort()
  t.same(ids, ['a', 'b'], 'both responses on one stream, then it ends')
  const notes = [{ jsonrpc: '2.0', method: 'notifications/roots/list_changed' }]
  res = await post(gw, notes, { 'mcp-session-id': old.sid })
  t.equal(res.status, 202, 'all-notification batch')

  const modern = await session(gw, '2025-06-18')
  res = await post(gw, batch, { 'mcp-session-id': modern.sid })
  t.equal(res.status, 400, 'no batches after 2025-03-26')
  res = await post(gw, [init('2025-03-26')])
  t.equal(res.status, 400, 'initialize in a batch')
})

t.test('JSON response mode answers with one JSON body', async t => {
  const gw = await startGateway(t, { servers: { everything }, http: { responseMode: 'json' } })
  const res = await post(gw, init())
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /application\/json/)
  const sid = res.headers.get('mcp-session-id') ?? ''
  const body = await res.json() as { id: number, result: { protocolVersion: string } }
  t.equal(body.id, 1)
  t.equal(body.result.protocolVersion, '2025-11-25')
  const call = await post(gw, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'echo', arguments: { message: 'json' } } }, { 'mcp-session-id': sid })
  t.match(await call.json(), { id: 2, result: { content: [{ text: 'Echo: json' }] } })
})

t.test('ping is answered by the gateway', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { sid } = await session(gw)
  const res = await post(gw, { jsonrpc: '2.0', id: 'p', method: 'ping' }, { 'mcp-session-id': sid })
  const reader = new SseReader(res)
  await reader.finished
  t.same(reader.messages(), [{ jsonrpc: '2.0', id: 'p', result: {} }])
})

t.test('GET stream: Accept checked, one per session (409), DELETE ends the session (404 after)', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { sid } = await session(gw)
  const bad = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'application/json', 'mcp-session-id': sid } })
  t.equal(bad.status, 406)
  const ac = new AbortController()
  const get = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal })
  t.equal(get.status, 200)
  const reader = new SseReader(get)
  await reader.until(ev => ev.length >= 1)
  t.equal(reader.events[0]?.data, '', 'GET stream starts with a priming event')
  t.match(reader.events[0]?.id, /^get\.\d+$/)
  const second = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': sid } })
  t.equal(second.status, 409)
  const del = await fetch(gw.url + '/mcp/everything', { method: 'DELETE', headers: { 'mcp-session-id': sid } })
  t.equal(del.status, 200)
  await reader.finished
  t.ok(reader.done, 'DELETE ended the GET stream')
  const after = await post(gw, { jsonrpc: '2.0', id: 9, method: 'tools/list' }, { 'mcp-session-id': sid })
  t.equal(after.status, 404)
  const delAgain = await fetch(gw.url + '/mcp/everything', { method: 'DELETE', headers: { 'mcp-session-id': sid } })
  t.equal(delAgain.status, 404)
  ac.abort()
})

t.test('a dropped POST stream resumes with Last-Event-ID: nothing lost, nothing twice', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { sid } = await session(gw)
  const ac = new AbortController()
  const res = await fetch(gw.url + '/mcp/everything', {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 42, method: 'tools/call', params: { name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 4 }, _meta: { progressToken: 'tok' } } }),
    signal: ac.signal
  })
  const reader = new SseReader(res)
  await reader.until(ev => ev.filter(e => e.data.includes('notifications/progress')).length >= 1)
  const seen = [...reader.events]
  ac.abort() // the client goes away: not a cancellation (H-POST-6)
  const last = seen[seen.length - 1]?.id ?? ''
  t.match(last, /^r1_/)
  await new Promise(resolve => setTimeout(resolve, 1500)) // the answer arrives while the client is away
  const resumed = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': last } })
  t.equal(resumed.status, 200)
  const rest = new SseReader(resumed)
  await rest.finished
  const all = [...seen, ...rest.events]
  const ids = all.map(e => e.id)
  t.equal(new Set(ids).size, ids.length, 'no event twice')
  const progress = all.filter(e => e.data.includes('notifications/progress')).map(e => (JSON.parse(e.data) as { params: { progress: number } }).params.progress)
  t.same(progress, [1, 2, 3, 4], 'every progress notification exactly once, in order')
  const final = rest.messages().find(m => m.id === 42) as { result: { content: Array<{ text: string }> } } | undefined
  t.ok(final, 'the result arrived on the resumed stream')
  t.match(final?.result.content[0]?.text, /completed/i)

  const badId = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': 'nope' } })
  t.equal(badId.status, 400, 'a malformed Last-Event-ID')
  const other = await session(gw)
  const foreign = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': other.sid, 'last-event-id': last } })
  t.equal(foreign.status, 400, "another session's event id does not replay")
})

t.test('Origin and Host are validated (DNS rebinding): 403', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  let res = await post(gw, init(), { origin: 'http://evil.example' })
  t.equal(res.status, 403)
  t.equal((await errorOf(res)).code, -32000)
  // fetch drops a Host header it is given, so this one goes over node:http.
  const hostStatus = await new Promise<number>((resolve, reject) => {
    const body = JSON.stringify(init())
    const r = request(gw.url + '/mcp/everything', { method: 'POST', headers: { host: 'evil.example', 'content-type': 'application/json', accept: ACCEPT_BOTH, 'content-length': Buffer.byteLength(body) } }, res => { res.resume(); resolve(res.statusCode ?? 0) })
    r.on('error', reject)
    r.end(body)
  })
  t.equal(hostStatus, 403, 'a non-loopback Host on a loopback listener')
  res = await post(gw, init(), { origin: 'http://localhost:3000' })
  t.equal(res.status, 200, 'a loopback origin is allowed')
  await res.body?.cancel()
  const pre = await fetch(gw.url + '/mcp/everything', { method: 'OPTIONS', headers: { origin: 'http://localhost:3000', 'access-control-request-method': 'POST', 'access-control-request-headers': 'mcp-session-id, content-type' } })
  t.equal(pre.status, 204, 'CORS preflight answered')
  t.equal(pre.headers.get('access-control-allow-origin'), 'http://localhost:3000')
})

t.test('max sessions per server: 503 with Retry-After', async t => {
  const gw = await startGateway(t, { servers: { everything: { ...everything, maxSessions: 1 } } })
  await session(gw)
  const res = await post(gw, init())
  t.equal(res.status, 503)
  t.ok(Number(res.headers.get('retry-after')) > 0)
  t.equal((await errorOf(res)).code, -32007)
})

t.test('/healthz and /readyz', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  t.equal((await fetch(gw.url + '/healthz')).status, 200)
  const ready = await fetch(gw.url + '/readyz')
  t.equal(ready.status, 200)
  t.match(await ready.json(), { status: 'ready' })
})

// Regressions from adversarial testing.
t.test('hostile input found by adversarial testing gets a clear 4xx', async t => {
  const gw = await startGateway(t, { servers: { everything }, sessions: { eventLogMaxLen: 20 } })
  const rawHost = async (host: string): Promise<number> => await new Promise<number>((resolve, reject) => {
    const body = JSON.stringify(init())
    const r = request(gw.url + '/mcp/everything', { method: 'POST', headers: { host, 'content-type': 'application/json', accept: ACCEPT_BOTH, 'content-length': Buffer.byteLength(body) } }, res => { res.resume(); resolve(res.statusCode ?? 0) })
    r.on('error', reject)
    r.end(body)
  })
  t.equal(await rawHost('127.0.0.1.attacker.example:8080'), 403, 'a hostname that only starts with 127. is not loopback')
  t.equal(await rawHost('127.evil.example'), 403)
  let res = await post(gw, init(), { origin: 'http://127.0.0.1.nip.io' })
  t.equal(res.status, 403, 'nor is such an Origin')

  const { sid } = await session(gw)
  res = await post(gw, { jsonrpc: '2.0', id: 3, method: 'tools/list', params: [] }, { 'mcp-session-id': sid })
  t.equal(res.status, 400, 'params as an array')
  t.equal((await errorOf(res)).code, -32600)

  let deep = '{"a":1}'
  for (let i = 0; i < 10_000; i++) deep = `{"x":${deep}}`
  res = await post(gw, `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":${deep}}`, { 'mcp-session-id': sid })
  t.equal(res.status, 400, 'JSON nested 10 000 levels deep')
  t.equal((await errorOf(res)).code, -32600)

  const bogus = await fetch(gw.url + '/mcp/everything', { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': 'get.99999999999999999999' } })
  t.equal(bogus.status, 400, 'an entry id beyond what the logs can hold')

  const old = await session(gw, '2025-03-26')
  const batch = Array.from({ length: 20 }, (_, i) => ({ jsonrpc: '2.0', id: i, method: 'ping' }))
  res = await post(gw, batch, { 'mcp-session-id': old.sid })
  t.equal(res.status, 400, 'a batch larger than a stream log can hold')
  res = await post(gw, batch.slice(0, 19), { 'mcp-session-id': old.sid })
  t.equal(res.status, 200, 'one that fits is answered')
  const reader = new SseReader(res)
  await reader.finished
  t.equal(reader.messages().length, 19)
})

t.test('streamed and JSON answers carry the CORS headers for an allowed origin', async t => {
  for (const responseMode of ['sse', 'json']) {
    const gw = await startGateway(t, { servers: { everything }, http: { responseMode } })
    const res = await post(gw, init(), { origin: 'http://localhost:3000' })
    t.equal(res.status, 200)
    t.equal(res.headers.get('access-control-allow-origin'), 'http://localhost:3000', `${responseMode}: allow-origin`)
    t.match(res.headers.get('access-control-expose-headers') ?? '', /Mcp-Session-Id/i, `${responseMode}: the session id is readable`)
    await res.body?.cancel()
  }
})

t.test('an initialize the backend rejects leaves no session behind', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const res = await post(gw, { jsonrpc: '2.0', id: 1, method: 'initialize' })
  const sid = res.headers.get('mcp-session-id') ?? ''
  const reader = new SseReader(res)
  await reader.finished
  const answer = reader.messages().find(m => m.id === 1) as { error?: { code: number } } | undefined
  t.ok(answer?.error !== undefined, 'the client gets the backend\'s error')
  const gone = await eventually('the session to end', async () => {
    const r = await post(gw, { jsonrpc: '2.0', id: 2, method: 'tools/list' }, { 'mcp-session-id': sid })
    await r.body?.cancel()
    return r.status === 404 ? true : undefined
  }, 5000)
  t.ok(gone, 'the failed session answers 404')
})

t.test('legacy HTTP+SSE: a second initialize on a session is refused', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const ac = new AbortController()
  t.teardown(() => { ac.abort() })
  const stream = new SseReader(await fetch(gw.url + '/sse/everything', { signal: ac.signal }))
  const [endpoint] = await stream.until(ev => ev.some(e => e.event === 'endpoint'))
  const url = gw.url + (endpoint?.data ?? '')
  const postLegacy = async (body: unknown): Promise<Response> => await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
  t.equal((await postLegacy(init('2024-11-05', 'A'))).status, 202)
  await stream.until(ev => ev.some(e => e.data.includes('"id":"A"')))
  const second = await postLegacy(init('2025-06-18', 'B'))
  t.equal(second.status, 400)
  t.match(await second.json(), { id: 'B', error: { code: -32600 } })
})
