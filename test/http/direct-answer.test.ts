// The local fast path (docs/design-notes.md, The request path): the answer that completes a POST
// stream written on the replica whose relay got it goes to the client before the log's round trip
// (StreamWriter.answerDirectly). As one JSON body (lazy SSE) it never enters the log; as an SSE
// stream's last frame it is appended after, so a client whose connection dropped before it still
// finds it. Raw HTTP against a real gateway, a real stdio server and a real Redis, watched with
// MONITOR.
import t, { type Test } from 'tap'
import { Redis } from 'ioredis'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { ANSWERED_DIRECTLY, formatEventId } from '../../src/state/event-log.js'
import { eventually } from '../helpers/wait.js'
import { SseReader } from '../helpers/sse-client.js'
import { call, open, post, type RawSession } from '../helpers/raw-session.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'

async function redisGateway (t: Test, extra: Record<string, unknown> = {}): Promise<{ gw: RunningGateway, prefix: string, inspect: Awaited<ReturnType<typeof testRedis>>, url: string }> {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, redis: { url: redis.url, keyPrefix: prefix }, ...extra })
  return { gw, prefix, inspect: await testRedis(t, redis.url), url: redis.url }
}

/** Every XADD to one of the session's logs, as MONITOR reports it (scripts' commands included). */
async function watchAppends (t: Test, url: string, eventsPrefix: string): Promise<string[]> {
  const watcher = new Redis(url, { lazyConnect: true })
  const monitor = await watcher.monitor()
  t.teardown(() => { monitor.disconnect(); watcher.disconnect() })
  const appended: string[] = []
  monitor.on('monitor', (_time: string, args: string[]) => {
    if (args[0]?.toLowerCase() === 'xadd' && args[1]?.startsWith(eventsPrefix) === true) appended.push(args[1])
  })
  return appended
}

/**
 * Every command naming one of a session's keys, as MONITOR reports it (scripts' own commands
 * included): the command and the first key's name after the session's hash tag (`exists meta`).
 */
async function watchSession (t: Test, url: string, prefix: string, sid: string): Promise<string[]> {
  const { meta } = sessionKeys(prefix, sid)
  const tag = meta.slice(0, meta.lastIndexOf(':'))
  const watcher = new Redis(url, { lazyConnect: true })
  const monitor = await watcher.monitor()
  t.teardown(() => { monitor.disconnect(); watcher.disconnect() })
  const seen: string[] = []
  monitor.on('monitor', (_time: string, args: string[]) => {
    if (args.slice(1).some(arg => arg.startsWith(tag))) seen.push(`${args[0]?.toLowerCase() ?? ''} ${args[1]?.startsWith(tag) === true ? args[1].slice(tag.length + 1) : 'other'}`)
  })
  return seen
}

/**
 * Five quick echo calls, each answered as one JSON body, and what Redis saw of the session
 * meanwhile (`seen`, from watchSession). The replica's upkeep names the session's keys too: every
 * second its heartbeat checks which replicas serve the calls in flight (HVALS of the markers, after
 * a record read for a direct session), and every few seconds its tick renews the leases (an EXISTS
 * and a script). A window the upkeep ran in is measured again, up to three times; calls that
 * marked or appended would show a script in every one.
 */
async function quickCalls (t: Test, gw: RunningGateway, session: RawSession, seen: string[], echo: (id: number) => [Record<string, unknown>, string]): Promise<string[]> {
  for (let attempt = 1; ; attempt++) {
    seen.length = 0
    for (let id = 50 + 10 * attempt; id < 55 + 10 * attempt; id++) {
      const [args, text] = echo(id)
      const res = await post(gw, call(id, 'echo', args), session)
      t.match(res.headers.get('content-type'), /^application\/json/, 'a call served here is lazy: one JSON body')
      t.match(await res.json(), { id, result: { content: [{ text }] } })
    }
    // MONITOR reaches its own connection on its own schedule.
    await eventually('MONITOR to report the five calls', () => seen.length >= 5 ? true : undefined, 2_000).catch(() => undefined)
    await new Promise(resolve => setTimeout(resolve, 200))
    const upkeep = seen.includes('hvals pending') || seen.some(command => command.startsWith('evalsha'))
    if (!upkeep || attempt === 3) return [...seen]
  }
}

/**
 * A call whose notifications come before its answer, on a stream served here: its stream opens as
 * SSE, marked before its first notification (priming event first), then `expected` in order.
 */
async function notifiedCall (t: Test, gw: RunningGateway, session: RawSession, body: Record<string, unknown>, expected: Array<string | number>): Promise<void> {
  const res = await post(gw, body, session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  await reader.finished
  t.equal(reader.events[0]?.data, '', 'the priming event first: the stream was marked before its first notification')
  t.same(reader.messages().map(m => m.method ?? m.id), expected, 'then the notifications and the answer, in order, once')
  t.ok(reader.events.every(e => (e.id ?? '') !== ''), 'every event has an id')
}

t.test('with Redis: an answer that completes a held stream goes straight to its client: never appended, and the stream leaves nothing behind', async t => {
  const { gw, prefix, inspect, url } = await redisGateway(t)
  const session = await open(gw, '2025-06-18') // lazy in Redis mode (no priming to lose)
  const keys = sessionKeys(prefix, session.sid)
  const appended = await watchAppends(t, url, keys.events(''))
  const streamsBefore = await inspect.smembers(keys.streams)
  for (let id = 20; id < 23; id++) {
    const res = await post(gw, call(id, 'echo', { text: `direct-${id}` }), session)
    t.match(res.headers.get('content-type'), /^application\/json/)
    t.match(await res.json(), { jsonrpc: '2.0', id, result: { content: [{ text: `direct-${id}` }] } }, `call ${id} answered once, as the backend gave it`)
  }
  // A call with a notification first opens its SSE stream: that answer goes through the log.
  const sse = await post(gw, call(23, 'progress', { steps: 2, delayMs: 0 }, { progressToken: 'p23' }), session)
  t.match(sse.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(sse)
  await reader.finished
  t.same(reader.messages().map(m => m.method ?? m.id), ['notifications/progress', 'notifications/progress', 23], 'its notifications, then its answer once: the answer never overtakes an append in flight')
  await eventually('the JSON streams cleaned up', async () => (await inspect.hlen(keys.pending)) === 0 && (await inspect.smembers(keys.streams)).length <= streamsBefore.length + 1 ? true : undefined)
  t.same(await inspect.hkeys(keys.pending), [], 'no pending marker is left')
  const left = (await inspect.smembers(keys.streams)).filter(s => !streamsBefore.includes(s))
  t.equal(left.length, 1, `only the SSE stream stays listed (a client may resume it): ${left.join(',')}`)
  t.ok(left[0]?.startsWith('r') === true && (await inspect.hkeys(keys.seq)).includes(left[0]), 'with its ordinal')
  t.ok(appended.length > 0 && appended.every(key => key === keys.events(left[0] ?? '')), `only the SSE stream was appended to (${appended.length} entries)`)
  t.same((await inspect.keys(`${keys.holder('')}r*`)).filter(key => key !== keys.holder(left[0] ?? '')), [], 'no holder lease is left on the JSON streams')
})

t.test('with Redis: an SSE stream\'s last answer is written before its append, with an id that resumes to nothing; the log still gets it', async t => {
  const { gw, prefix, inspect, url } = await redisGateway(t, { http: { lazySseMs: 0 } })
  const session = await open(gw, '2025-11-25') // SSE at once (lazySseMs 0), with priming
  const keys = sessionKeys(prefix, session.sid)
  const appended = await watchAppends(t, url, keys.events(''))
  const res = await post(gw, call(30, 'echo', { text: 'sse-direct' }), session)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const reader = new SseReader(res)
  await reader.finished
  const [priming, last] = reader.events
  t.equal(reader.events.length, 2, 'priming, then the answer')
  t.equal(priming?.data, '', 'the priming event')
  const streamId = (priming?.id ?? '').split('.')[0] ?? ''
  t.equal(last?.id, formatEventId(streamId, ANSWERED_DIRECTLY), 'the answer carries the direct id')
  t.match(JSON.parse(last?.data ?? '{}'), { id: 30, result: { content: [{ text: 'sse-direct' }] } })
  await eventually('the answer appended after', async () => (await inspect.xlen(keys.events(streamId))) === 2 ? true : undefined)
  // MONITOR reaches its own connection on its own schedule: the XLEN's reply can come first.
  await eventually('MONITOR to report both appends', () => appended.filter(key => key === keys.events(streamId)).length >= 2 ? true : undefined, 2_000).catch(() => undefined)
  t.equal(appended.filter(key => key === keys.events(streamId)).length, 2, 'the log holds priming and answer, each appended once')
  t.same(await inspect.hkeys(keys.pending), [], 'and the append took the request\'s marker')
  const resume = async (lastEventId: string): Promise<SseReader> => {
    const got = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version, 'last-event-id': lastEventId } })
    t.equal(got.status, 200)
    const resumed = new SseReader(got)
    await resumed.finished
    return resumed
  }
  const lost = await resume(priming?.id ?? '')
  t.same(lost.messages().map(m => m.id), [30], 'a client whose connection dropped before the answer gets it from the log, once')
  t.not(lost.events.find(e => e.data !== '')?.id, last?.id, 'with the log\'s id')
  const done = await resume(last?.id ?? '')
  t.same(done.messages(), [], 'a client that resumes from the direct id has everything already')
})

t.test('memory mode: concurrent calls on one session each get their own answer once, and notifications stay in order', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const session = await open(gw, '2025-11-25')
  const answers = await Promise.all(Array.from({ length: 40 }, async (_, i) => {
    const res = await post(gw, call(100 + i, 'echo', { text: `m${i}` }), session)
    const json = (res.headers.get('content-type') ?? '').startsWith('application/json')
    const reader = new SseReader(res) // lazy: JSON unless the machine made a call slower than lazySseMs
    await reader.finished
    return { json, ids: reader.messages().map(m => m.id) }
  }))
  t.ok(answers.some(a => a.json), `answered as JSON bodies (${answers.filter(a => a.json).length} of 40)`)
  t.same(answers.map(a => a.ids), Array.from({ length: 40 }, (_, i) => [100 + i]), 'each call its own answer, once')
  const sse = new SseReader(await post(gw, call(200, 'progress', { steps: 3, delayMs: 0 }, { progressToken: 'm' }), session))
  await sse.finished
  t.same(sse.messages().map(m => m.method ?? m.id), ['notifications/progress', 'notifications/progress', 'notifications/progress', 200], 'a notification first still opens the stream, and the answer comes after it')
})

t.test('with Redis, responseMode json: the answers are one JSON body, never appended, and leave no marker, log or lease', async t => {
  const { gw, prefix, inspect, url } = await redisGateway(t, { http: { responseMode: 'json' } })
  const session = await open(gw, '2025-11-25')
  const keys = sessionKeys(prefix, session.sid)
  const appended = await watchAppends(t, url, keys.events(''))
  const res = await post(gw, call(40, 'echo', { text: 'json-mode' }), session)
  t.match(res.headers.get('content-type'), /^application\/json/)
  t.match(await res.json(), { id: 40, result: { content: [{ text: 'json-mode' }] } })
  await eventually('the marker taken', async () => (await inspect.hlen(keys.pending)) === 0 ? true : undefined)
  t.same(appended, [], 'nothing was appended to any log of the session')
  t.same(await inspect.keys(`${keys.holder('')}j*`), [], 'no holder lease is left')
  t.same(await inspect.keys(`${keys.events('')}j*`), [], 'no log')
  // A batch (2025-03-26): the answers before the last go through the log, the last one need not.
  const older = await open(gw, '2025-03-26')
  const olderKeys = sessionKeys(prefix, older.sid)
  const batch = await post(gw, [call(41, 'echo', { text: 'a' }), call(42, 'echo', { text: 'b' })], older)
  const answers = await batch.json() as Array<Record<string, unknown>>
  t.same(answers.map(a => a.id).sort(), [41, 42], 'one JSON array with both answers')
  await eventually('the batch\'s markers taken', async () => (await inspect.hlen(olderKeys.pending)) === 0 ? true : undefined)
  t.same(await inspect.keys(`${olderKeys.events('')}j*`), [], 'and its log dropped')
})

t.test('with Redis: a quick call served here costs Redis one EXISTS; a call with a notification first is marked before its log, priming first', async t => {
  const { gw, prefix, url } = await redisGateway(t)
  const session = await open(gw, '2025-11-25')
  const seen = await quickCalls(t, gw, session, await watchSession(t, url, prefix, session.sid), id => [{ text: `q${id}` }, `q${id}`])
  t.same(seen, Array.from({ length: 5 }, () => 'exists meta'), 'each call asked whether the session exists, and nothing else: no mark, no log, nothing to drop')
  await notifiedCall(t, gw, session, call(55, 'progress', { steps: 2, delayMs: 0 }, { progressToken: 'p55' }), ['notifications/progress', 'notifications/progress', 55])
})

t.test('with Redis: a batch served here is marked for its first answer (which goes through the log), and the second completes one JSON array', async t => {
  const { gw, prefix, inspect } = await redisGateway(t)
  const session = await open(gw, '2025-03-26') // batches are allowed before 2025-06-18
  const keys = sessionKeys(prefix, session.sid)
  const res = await post(gw, [call(60, 'echo', { text: 'first' }), call(61, 'echo', { text: 'second' })], session)
  t.match(res.headers.get('content-type'), /^application\/json/, 'both answers came before the lazy delay: one JSON body')
  const answers = await res.json() as Array<Record<string, unknown>>
  t.same(answers.map(a => a.id).sort(), [60, 61], 'an array with both answers, each once')
  t.match(answers.find(a => a.id === 60), { result: { content: [{ text: 'first' }] } })
  t.match(answers.find(a => a.id === 61), { result: { content: [{ text: 'second' }] } })
  await eventually('the stream dropped once answered', async () => (await inspect.hlen(keys.pending)) === 0 && (await inspect.keys(`${keys.events('')}r2_*`)).length === 0 ? true : undefined)
  t.same(await inspect.hkeys(keys.pending), [], 'no pending marker is left')
  t.same(await inspect.keys(`${keys.holder('')}r2_*`), [], 'no holder lease is left')
})

t.test('with Redis, an HTTP backend: a quick call leaves at once, with nothing but reads of Redis; a call with a notification first is marked before its log', async t => {
  const upstream = await startStreamableUpstream({ record: false })
  t.teardown(async () => { await upstream.close() })
  const { gw, prefix, url } = await redisGateway(t, { servers: { full: { transport: 'streamable-http', url: upstream.url } } })
  const session = await open(gw, '2025-11-25')
  const seen = await quickCalls(t, gw, session, await watchSession(t, url, prefix, session.sid), id => [{ message: `q${id}` }, `echo: q${id}`])
  // The record is read for each POST (only a routed session's owner keeps it), and that read is
  // the verdict on the session: no EXISTS follows it. Before, a mark was awaited before the
  // request left, and dropped after; then an EXISTS went alongside the request.
  t.same(seen, Array.from({ length: 5 }, () => 'hgetall meta'), 'each call read the record and nothing else: no second check, no mark, no log, nothing to drop')
  await notifiedCall(t, gw, session, call(55, 'progress-log', {}, { progressToken: 'p55' }), ['notifications/progress', 'notifications/message', 55])
})
