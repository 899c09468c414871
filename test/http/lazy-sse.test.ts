// Lazy SSE (docs/behaviour.md): a POST's SSE stream opens only when something other than its
// answers comes first, or after http.lazySseMs; answers that come sooner are one application/json
// body. Raw HTTP against a real gateway and a real stdio server, so the wire shape is what is
// asserted.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { call, open, post } from '../helpers/raw-session.js'

async function gateway (t: Test, extra: Record<string, unknown> = {}, replicaId?: string): Promise<RunningGateway> {
  return await startGateway(t, { servers: { full: stdioFixture('full-server') }, ...extra }, replicaId === undefined ? {} : { replicaId })
}

t.test('an answer that comes first is one JSON body, with the session header', async t => {
  const gw = await gateway(t)
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, call(1, 'echo', { text: 'quick' }), session)
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^application\/json/, 'JSON, not SSE')
  t.equal(res.headers.get('mcp-session-id'), session.sid, 'the session id comes with it')
  const body = await res.json() as Record<string, unknown>
  t.match(body, { jsonrpc: '2.0', id: 1, result: { content: [{ text: 'quick' }] } }, 'the answer, as the backend gave it')
})

t.test('a notification before the answer opens the SSE stream: priming first, nothing lost', async t => {
  const gw = await gateway(t)
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, call(2, 'progress', { steps: 3, delayMs: 0 }, { progressToken: 'p1' }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  await reader.finished
  t.equal(reader.events[0]?.data, '', 'a priming event first')
  t.ok(reader.events[0]?.id, 'with an event id to resume from')
  const messages = reader.messages()
  t.same(messages.filter(m => m.method === 'notifications/progress').map(m => (m.params as { progress: number }).progress), [1, 2, 3], 'every progress notification, in order')
  t.match(messages.at(-1), { id: 2, result: { content: [{ text: 'done 3 steps' }] } }, 'then the answer, last')
  t.ok(reader.events.slice(1).every(e => e.id !== undefined && e.id !== ''), 'every event has an id')
})

t.test('a call slower than lazySseMs gets its SSE stream (priming, resumable) before the answer', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 20 } })
  const session = await open(gw, '2025-11-25')
  const started = Date.now()
  const res = await post(gw, call(3, 'slow', { ms: 400 }), session)
  const headersAfter = Date.now() - started
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  t.ok(headersAfter < 400, `the stream opened before the 400 ms answer (${headersAfter} ms)`)
  const reader = new SseReader(res)
  const [priming] = await reader.until(events => events.length >= 1)
  t.equal(priming?.data, '', 'a priming event while the call runs')
  await reader.finished
  t.match(reader.messages().at(-1), { id: 3, result: { content: [{ text: 'slept 400 ms' }] } })
})

t.test('a batch whose answers all come first is one JSON array (2025-03-26)', async t => {
  const gw = await gateway(t)
  const session = await open(gw, '2025-03-26')
  const res = await post(gw, [call(4, 'echo', { text: 'a' }), call(5, 'add', { a: 2, b: 3 })], session)
  t.match(res.headers.get('content-type'), /^application\/json/)
  const body = await res.json() as Array<Record<string, unknown>>
  t.ok(Array.isArray(body), 'an array')
  t.same(body.map(m => m.id).sort(), [4, 5], 'both answers')
})

t.test('errors are answered the same way: one JSON body', async t => {
  const gw = await gateway(t)
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, { jsonrpc: '2.0', id: 6, method: 'no/such-method' }, session)
  t.match(res.headers.get('content-type'), /^application\/json/)
  t.match(await res.json(), { id: 6, error: { code: -32601 } })
})

t.test('lazySseMs 0 opens every stream at once', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 0 } })
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, call(7, 'echo', { text: 'eager' }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  await reader.finished
  t.equal(reader.events[0]?.data, '', 'priming first')
  t.match(reader.messages()[0], { id: 7, result: { content: [{ text: 'eager' }] } })
})

t.test('a stream held past the holder-lease renewal (before it is marked) still gets its answer', async t => {
  // idleTimeoutMs 1000: the renewal tick runs every 250 ms, several times while this call is held.
  const gw = await gateway(t, { http: { lazySseMs: 3000 }, sessions: { idleTimeoutMs: 1000 } })
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, call(15, 'slow', { ms: 1200 }), session)
  t.match(res.headers.get('content-type'), /^application\/json/, 'still held when the answer came: one JSON body')
  t.match(await res.json(), { id: 15, result: { content: [{ text: 'slept 1200 ms' }] } }, 'the answer, not an empty stream')
})

t.test('a held stream that the gateway ends answers its request with an error: never an empty 200', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 5000, retryMs: 700 } })
  const session = await open(gw, '2025-11-25')
  const pending = post(gw, call(8, 'slow', { ms: 3000 }), session)
  await new Promise(resolve => setTimeout(resolve, 200))
  const closing = gw.close()
  const res = await pending
  const reader = new SseReader(res)
  await reader.finished
  await closing
  // Held, the stream was never marked: no priming event, so no id its client could resume from
  // (and the backend stops with this gateway): the request gets its one answer now.
  t.match(reader.messages(), [{ jsonrpc: '2.0', id: 8, error: { code: -32000, message: 'The gateway is shutting down' } }], 'the error, once')
  t.notOk(reader.messages().some(m => 'result' in m), 'no result')
})

t.test('a stream whose client holds no event id (no priming before 2025-11-25) is answered with an error when the gateway stops', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 20, retryMs: 700 } })
  const session = await open(gw, '2025-06-18')
  const res = await post(gw, call(14, 'slow', { ms: 3000 }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/, 'the stream opened after the lazy delay')
  const reader = new SseReader(res)
  await new Promise(resolve => setTimeout(resolve, 100))
  t.same(reader.events, [], 'nothing yet: no priming event on 2025-06-18, so no id to resume from')
  const closing = gw.close()
  await reader.finished
  await closing
  t.match(reader.messages(), [{ jsonrpc: '2.0', id: 14, error: { code: -32000, message: 'The gateway is shutting down' } }], 'the request gets its one answer, an error, before the stream ends')
})

t.test('with Redis: a 2025-11-25 call served on this replica is lazy; one served by another replica opens its stream at once', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const a = await gateway(t, { redis: { url: redis.url, keyPrefix: prefix } }, 'lazy-a')
  const b = await gateway(t, { redis: { url: redis.url, keyPrefix: prefix } }, 'lazy-b')
  const inspect = await testRedis(t, redis.url)
  const logsOf = async (sid: string): Promise<string[]> => await inspect.keys(`${sessionKeys(prefix, sid).events('')}r*`)
  const session = await open(a, '2025-11-25') // its backend runs on a
  const before = await logsOf(session.sid)
  const local = await post(a, call(9, 'echo', { text: 'redis-local' }), session)
  t.match(local.headers.get('content-type'), /^application\/json/, 'JSON where the backend runs: this replica\'s death would take the backend connection, and the answer, with it')
  t.match(await local.json(), { id: 9, result: { content: [{ text: 'redis-local' }] } })
  await eventually('the JSON answer\'s log dropped', async () => (await logsOf(session.sid)).length === before.length ? true : undefined)
  t.same(await logsOf(session.sid), before, 'the log of a stream answered as one JSON body goes at once: no event id of it ever reached the client')
  const routed = await post(b, call(10, 'echo', { text: 'redis-routed' }), session)
  t.match(routed.headers.get('content-type'), /^text\/event-stream/, 'SSE on the replica that routes to the owner: the answer comes through the log')
  const reader = new SseReader(routed)
  await reader.finished
  t.equal(reader.events[0]?.data, '', 'priming first, so a client whose replica dies mid-call resumes elsewhere')
  t.match(reader.messages().at(-1), { id: 10, result: { content: [{ text: 'redis-routed' }] } })
  const kept = (await logsOf(session.sid)).filter(key => !before.includes(key))
  t.equal(kept.length, 1, 'the SSE stream\'s log is kept')
  t.ok(await inspect.pttl(kept[0] ?? '') > 30_000, 'a while, for a client that resumes')
})

t.test('with Redis: a slow call served here opens its stream after the lazy delay with a priming event a client can resume from', async t => {
  const redis = await startRedis(t)
  const gw = await gateway(t, { redis: { url: redis.url, keyPrefix: randomPrefix() }, http: { lazySseMs: 30 } })
  const session = await open(gw, '2025-11-25')
  const res = await post(gw, call(11, 'slow', { ms: 600 }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  const [priming] = await reader.until(events => events.length >= 1)
  t.equal(priming?.data, '', 'the priming event')
  // The client's connection drops before the answer; it resumes from the priming event's id.
  await res.body?.cancel().catch(() => {})
  const resumed = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version, 'last-event-id': priming?.id ?? '' } })
  t.equal(resumed.status, 200, 'the priming id names a stream the log has')
  const rest = new SseReader(resumed)
  await rest.finished
  t.match(rest.messages(), [{ id: 11, result: { content: [{ text: 'slept 600 ms' }] } }], 'the answer, once, on the resumed stream')
})

t.test('with Redis: a call whose session is found gone by the check that travels with it is refused with 404, not answered', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await gateway(t, { redis: { url: redis.url, keyPrefix: prefix } })
  const inspect = await testRedis(t, redis.url)
  const session = await open(gw, '2025-11-25')
  t.match(await (await post(gw, call(12, 'echo', { text: 'before' }), session)).json(), { id: 12, result: {} }, 'a first call: the replica running the backend keeps the record')
  // Gone behind this replica's back (no end-session envelope): only the EXISTS sent with the call can tell.
  await inspect.del(sessionKeys(prefix, session.sid).meta)
  const res = await post(gw, call(13, 'echo', { text: 'after' }), session)
  t.equal(res.status, 404, 'the HTTP status of an unknown session')
  t.match(res.headers.get('content-type'), /^application\/json/)
  t.match(await res.json(), { jsonrpc: '2.0', id: 13, error: { code: -32001 } }, 'the JSON-RPC error, for the request, and no result')
})

t.test('an initialize waits for its answer as one JSON body, though the backend takes longer than lazySseMs to start', async t => {
  const gw = await gateway(t)
  const started = Date.now()
  const res = await post(gw, { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  const waited = Date.now() - started
  t.match(res.headers.get('content-type'), /^application\/json/, `JSON, not SSE (the answer took ${waited} ms, the lazy window is 50 ms)`)
  t.ok(waited > 50, 'the stdio child took longer to start than the usual lazy window')
  t.ok((res.headers.get('mcp-session-id') ?? '') !== '', 'the session id comes with it')
  t.match(await res.json(), { jsonrpc: '2.0', id: 0, result: { protocolVersion: '2025-11-25' } })
})

t.test('lazySseMs 0 still opens an initialize\'s stream at once', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 0 } })
  const res = await post(gw, { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  await new SseReader(res).finished
})
