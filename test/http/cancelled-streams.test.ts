// A request the client cancels (notifications/cancelled, U-CAN-1) gets no response, and
// its POST stream does not wait for one: nothing sent yet (JSON mode, a held lazy stream) is
// answered 202 with no body (a batch: the answers that came); an SSE stream whose client holds no
// event id of it ends; one whose client holds an id stays open for the client to close (a v1 SDK
// client reconnects to a stream that ends without its answer). With Redis the cancellation takes
// the request's pending marker, so no deadline error follows it either. Raw HTTP against a real
// gateway, the stdio fixture (its `slow` tool records the cancellations it sees) and a real Redis.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { call, open, post, type RawSession } from '../helpers/raw-session.js'
import { startReplica } from '../helpers/replicas.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'

const SLOW = 30_000

async function gateway (t: Test, extra: Record<string, unknown> = {}): Promise<RunningGateway> {
  return await startGateway(t, { servers: { full: stdioFixture('full-server') }, ...extra })
}

const cancel = (id: number): Record<string, unknown> => ({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: id, reason: 'the user pressed stop' } })

/**
 * Sends the cancellation once the call is running, and checks the 202. A cancellation of a request
 * not in flight yet is ignored (U-CAN-1), and on a loaded machine the call may take longer than
 * the first wait to reach its backend: with `ended`, it is sent again until the call's POST ends.
 */
async function cancelWhenRunning (t: Test, gw: RunningGateway, session: RawSession, id: number, ended?: () => boolean): Promise<void> {
  await sleep(300)
  const res = await post(gw, cancel(id), session)
  t.equal(res.status, 202, 'the cancellation itself is accepted')
  for (let waited = 0; ended !== undefined && !ended() && waited < 10_000; waited += 500) {
    await sleep(500)
    if (!ended()) await post(gw, cancel(id), session)
  }
}

/** Whether a promise has settled. */
function settled (promise: Promise<unknown>): () => boolean {
  let done = false
  promise.then(() => { done = true }, () => { done = true })
  return () => done
}

/** The ids of the requests the backend saw cancelled. */
async function cancelledAtBackend (gw: RunningGateway, session: RawSession): Promise<unknown[]> {
  const res = await post(gw, call(900 + Math.floor(Math.random() * 99), 'cancelled-requests'), session)
  const reader = new SseReader(res)
  await reader.finished
  const answer = JSON.parse(reader.events.at(-1)?.data ?? '{}') as { result?: { content?: Array<{ text?: string }> } }
  return JSON.parse(answer.result?.content?.[0]?.text ?? '[]') as unknown[]
}

/** A POST the test can close, read as SSE. */
async function closablePost (gw: RunningGateway, body: unknown, session: RawSession): Promise<{ reader: SseReader, close: () => Promise<void> }> {
  const ac = new AbortController()
  const res = await fetch(`${gw.url}/mcp/full`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version },
    body: JSON.stringify(body),
    signal: ac.signal
  })
  const reader = new SseReader(res)
  return { reader, close: async () => { ac.abort(); await reader.finished } }
}

t.test('responseMode json: a cancelled call is answered 202 with no body at once, and the backend is told', async t => {
  const gw = await gateway(t, { http: { responseMode: 'json' } })
  const session = await open(gw, '2025-11-25')
  const started = Date.now()
  const pending = post(gw, call(5, 'slow', { ms: SLOW }), session)
  await cancelWhenRunning(t, gw, session, 5, settled(pending))
  const res = await pending
  t.equal(res.status, 202, 'the POST of the cancelled call ends with 202')
  t.equal(await res.text(), '', 'and no body: no response to a cancelled request')
  t.ok(Date.now() - started < 10_000, 'promptly, not at a deadline')
  t.equal(res.headers.get('mcp-session-id'), session.sid)
  t.equal((await eventually('the backend to see the cancellation', async () => { const seen = await cancelledAtBackend(gw, session); return seen.length > 0 ? seen : undefined })).length, 1, 'the backend saw the call cancelled, once')
})

t.test('responseMode json, a batch (2025-03-26): the answers that came are the body; the cancelled one is left out', async t => {
  const gw = await gateway(t, { http: { responseMode: 'json' } })
  const session = await open(gw, '2025-03-26')
  const pending = post(gw, [call(6, 'slow', { ms: SLOW }), call(7, 'echo', { text: 'kept' })], session)
  await cancelWhenRunning(t, gw, session, 6, settled(pending))
  const res = await pending
  t.equal(res.status, 200)
  const body = await res.json() as Array<Record<string, unknown>>
  t.same(body.map(m => m.id), [7], 'one answer: the call that was not cancelled')
  t.match(body[0], { result: { content: [{ text: 'kept' }] } })
})

t.test('SSE held (lazy): a cancelled call that sent nothing yet is answered 202', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 20_000 } })
  const session = await open(gw, '2025-11-25')
  const pending = post(gw, call(8, 'slow', { ms: SLOW }), session)
  await cancelWhenRunning(t, gw, session, 8, settled(pending))
  const res = await pending
  t.equal(res.status, 202)
  t.equal(await res.text(), '')
  // The session goes on: the next call is answered as usual.
  const next = await post(gw, call(9, 'echo', { text: 'after' }), session)
  t.match(await next.json(), { id: 9, result: { content: [{ text: 'after' }] } })
})

t.test('SSE open, no event id sent (2025-06-18: no priming): the stream ends with no message', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 0 } })
  const session = await open(gw, '2025-06-18')
  const res = await post(gw, call(10, 'slow', { ms: SLOW }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  await cancelWhenRunning(t, gw, session, 10, () => reader.done)
  await Promise.race([reader.finished, sleep(10_000)])
  t.ok(reader.done, 'the stream ended')
  t.same(reader.events, [], 'without a response (nor anything else)')
})

t.test('SSE open with a priming event (2025-11-25): the stream stays open, with no response, for its client to close', async t => {
  const gw = await gateway(t, { http: { lazySseMs: 0, keepAliveMs: 1_000 } })
  const session = await open(gw, '2025-11-25')
  const { reader, close } = await closablePost(gw, call(11, 'slow', { ms: SLOW }), session)
  await cancelWhenRunning(t, gw, session, 11)
  await sleep(1_500)
  t.notOk(reader.done, 'still open')
  t.same(reader.events.map(e => e.data), [''], 'only its priming event: no response to the cancelled request')
  await close()
})

t.test('with Redis: the cancellation takes the request\'s marker, so no deadline error follows it', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  // A 1 s backend deadline: the catch-all of the POST stream's holder runs 5 s after it.
  const gw = await startGateway(t, {
    servers: { full: { ...stdioFixture('full-server'), requestTimeoutMs: 1_000 } },
    redis: { url: redis.url, keyPrefix: prefix },
    http: { lazySseMs: 0, keepAliveMs: 1_000 }
  })
  const inspect = await testRedis(t, redis.url)
  const session = await open(gw, '2025-11-25')
  const keys = sessionKeys(prefix, session.sid)
  const { reader, close } = await closablePost(gw, call(12, 'slow', { ms: 800 }), session)
  await sleep(100)
  t.equal((await post(gw, cancel(12), session)).status, 202)
  await eventually('the marker taken', async () => {
    if ((await inspect.hlen(keys.pending)) === 0) return true
    await post(gw, cancel(12), session) // not in flight yet when the first came (see cancelWhenRunning)
    return undefined
  })
  await sleep(7_000)
  t.same(reader.events.map(e => e.data), [''], 'past the backend\'s deadline and its grace: no -32006, no answer at all')
  await close()
})

t.test('with Redis, responseMode json: 202, and nothing of the stream is left', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, redis: { url: redis.url, keyPrefix: prefix }, http: { responseMode: 'json' } })
  const inspect = await testRedis(t, redis.url)
  const session = await open(gw, '2025-11-25')
  const keys = sessionKeys(prefix, session.sid)
  const pending = post(gw, call(13, 'slow', { ms: SLOW }), session)
  await cancelWhenRunning(t, gw, session, 13, settled(pending))
  const res = await pending
  t.equal(res.status, 202)
  t.equal(await res.text(), '')
  await eventually('no marker left', async () => (await inspect.hlen(keys.pending)) === 0 ? true : undefined)
  t.same(await inspect.keys(`${keys.events('')}j*`), [], 'no log')
  t.same(await inspect.keys(`${keys.holder('')}j*`), [], 'no holder lease')
})

t.test('across replicas: the call is held on B, its backend runs on A, the cancel goes to B; B answers 202', async t => {
  const redis = await startRedis(t)
  const config = { servers: { full: stdioFixture('full-server') }, redis: { url: redis.url, keyPrefix: randomPrefix() }, http: { responseMode: 'json' } }
  const [a, b] = await Promise.all([startReplica(t, 'A', config), startReplica(t, 'B', config)])
  const atA = { url: a.url } as RunningGateway
  const atB = { url: b.url } as RunningGateway
  const session = await open(atA, '2025-11-25') // A runs the backend
  const started = Date.now()
  const pending = post(atB, call(14, 'slow', { ms: SLOW }), session)
  await cancelWhenRunning(t, atB, session, 14, settled(pending))
  const res = await pending
  t.equal(res.status, 202, 'B, which holds the POST, learns of the cancellation from A\'s relay')
  t.equal(await res.text(), '')
  t.ok(Date.now() - started < 10_000, 'promptly')
  t.equal((await eventually('the backend to see the cancellation', async () => { const seen = await cancelledAtBackend(atB, session); return seen.length > 0 ? seen : undefined })).length, 1)
})

t.test('across replicas, an HTTP backend (every replica sends its own requests): the cancellation reaches the replica running the call, wherever it lands', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(async () => { await upstream.close() })
  const redis = await startRedis(t)
  const config = { servers: { full: { transport: 'streamable-http', url: upstream.url, requestTimeoutMs: 20_000 } }, redis: { url: redis.url, keyPrefix: randomPrefix() } }
  const [a, b] = await Promise.all([startReplica(t, 'A', config), startReplica(t, 'B', config)])
  const atA = { url: a.url } as RunningGateway
  const atB = { url: b.url } as RunningGateway
  // 2025-06-18: no priming event, so a stream whose request is cancelled ends (see above).
  const session = await open(atA, '2025-06-18') // A holds the session's lease
  const cancelsAtBackend = (): number => upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'notifications/cancelled').length
  for (const [id, via, label] of [[15, atA, 'the lease holder'], [16, atB, 'the replica running it']] as const) {
    const before = cancelsAtBackend()
    const { reader } = await closablePost(atB, call(id, 'hang'), session)
    await cancelWhenRunning(t, via, session, id, () => reader.done)
    await Promise.race([reader.finished, sleep(10_000)])
    t.ok(reader.done, `cancelled at ${label}: the stream on B ended, long before the deadline`)
    t.same(reader.events, [], 'with no response')
    t.ok(cancelsAtBackend() > before, 'and the backend was told')
  }
})
