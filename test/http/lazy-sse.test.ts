// Lazy SSE (issue 10): a POST's SSE stream opens only when something other than its answers comes
// first, or after http.lazySseMs; answers that come sooner are one application/json body. Raw
// HTTP against a real gateway and a real stdio server, so the wire shape is what is asserted.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { call, open, post } from '../helpers/raw-session.js'

async function gateway (t: Test, extra: Record<string, unknown> = {}): Promise<RunningGateway> {
  return await startGateway(t, { servers: { full: stdioFixture('full-server') }, ...extra })
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

t.test('a held stream that the gateway ends opens as SSE and says when to come back', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 5000, retryMs: 700 } })
  const session = await open(gw, '2025-11-25')
  const pending = post(gw, call(8, 'slow', { ms: 3000 }), session)
  await new Promise(resolve => setTimeout(resolve, 200))
  const closing = gw.close()
  const res = await pending
  t.match(res.headers.get('content-type'), /^text\/event-stream/, 'SSE, not an empty 200')
  const reader = new SseReader(res)
  await reader.finished
  await closing
  t.equal(reader.events[0]?.data, '', 'the priming event, so the client can resume elsewhere')
  t.ok(reader.retries.includes(700), 'and the retry hint')
})

t.test('with Redis: 2025-11-25 streams open at once (a replica death must not strand a call); older ones are lazy', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await gateway(t, { redis: { url: redis.url, keyPrefix: prefix } })
  const inspect = await testRedis(t, redis.url)
  const logsOf = async (sid: string): Promise<string[]> => await inspect.keys(`${sessionKeys(prefix, sid).events('')}r*`)
  const current = await open(gw, '2025-11-25')
  const eager = await post(gw, call(9, 'echo', { text: 'redis' }), current)
  t.match(eager.headers.get('content-type'), /^text\/event-stream/, 'SSE with a priming event on 2025-11-25')
  const reader = new SseReader(eager)
  await reader.finished
  t.equal(reader.events[0]?.data, '', 'priming first')
  const older = await open(gw, '2025-06-18')
  const before = await logsOf(older.sid) // initialize's, kept if its stream opened (a child starts slower than lazySseMs)
  const lazy = await post(gw, call(10, 'echo', { text: 'redis-old' }), older)
  t.match(lazy.headers.get('content-type'), /^application\/json/, 'JSON on 2025-06-18, which has no priming to lose')
  t.match(await lazy.json(), { id: 10, result: { content: [{ text: 'redis-old' }] } })
  const [kept] = await logsOf(current.sid)
  t.ok(kept !== undefined && await inspect.pttl(kept) > 30_000, 'the SSE stream\'s log is kept a while, for a client that resumes')
  await eventually('the JSON answer\'s log dropped', async () => (await logsOf(older.sid)).length === before.length ? true : undefined)
  t.same(await logsOf(older.sid), before, 'the log of a stream answered as one JSON body goes at once: no event id of it ever reached the client')
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
