// ClientStreams upkeep: the tick that renews holder leases walks every stream held
// here; with the memory twins each await resolves at once, so it must yield to the event loop
// between slices or 10,000 idle streams stall every request for the whole walk. Pure logic over
// the memory twins; the writers' responses are never started, so a bare object stands in. Ending
// a session: a real HTTP response, read by fetch.
import { NO_METRICS } from '../../src/telemetry/metrics.js'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../../src/core/errors.js'
import t, { type Test } from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { ClientStreams, expectedResponsesOf, isRequestStreamId, newRequestStreamId, type OpenPostOptions, type OpenStreamOptions } from '../../src/routing/replica/streams.js'
import { StreamWriter } from '../../src/http/sse.js'
import type { ClientWriter } from '../../src/routing/replica/writer.js'
import { inBatches, UPKEEP_BATCH, UPKEEP_SLICE_MS, UPKEEP_WINDOW } from '../../src/routing/replica/upkeep.js'
import { MemoryBus } from '../../src/state/bus-memory.js'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'
import { ANSWERED_DIRECTLY, formatEventId, GET_STREAM } from '../../src/state/event-log.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { createLogger } from '../../src/telemetry/logger.js'
import { MemoryTaskStore } from '../../src/state/task-store-memory.js'

/** ClientStreams of replica r1 over the memory twins (a log of 10 entries per stream). */
function memoryStreams (t: Test, http: Record<string, unknown> = {}): { store: MemorySessionStore, log: ReturnType<typeof createLogger>, streams: ClientStreams, eventLog: MemoryEventLog } {
  const config = parseConfig({ servers: { s: { transport: 'stdio', command: 'true' } }, http })
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const eventLog = new MemoryEventLog(store, 10)
  const log = createLogger('silent', 'r1')
  const streams = new ClientStreams({
    replicaId: 'r1', config, store, tasks: new MemoryTaskStore(), eventLog, bus: new MemoryBus(), log, metrics: NO_METRICS,
    isAlive: async () => true,
    endSession: async () => {},
    newWriter: options => new StreamWriter(options)
  })
  return { store, log, streams, eventLog }
}

t.test('renew walks every held stream, in batches', async t => {
  const { store, log, streams } = memoryStreams(t)
  const count = UPKEEP_BATCH * 2 + 7
  for (let i = 0; i < count; i++) {
    const sid = `session-${String(i).padStart(12, '0')}`
    await store.create({ id: sid, server: 's', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null, backendSessionId: null, createdAt: 0 }, 60_000)
    await streams.open({ res: {} as ServerResponse, sid, streamId: GET_STREAM, mode: 'sse', cursor: null, headers: {}, log })
  }
  const held = await streams.renew()
  t.equal(held.size, count, 'every session with a stream here is reported held')
})

t.test('an upkeep pass gives the event loop back once it has used its slice of CPU', async t => {
  const batches = UPKEEP_WINDOW * 6
  const items = Array.from({ length: UPKEEP_BATCH * batches }, (_, i) => i)
  // Immediates queued before the pass run while it is still going only if the pass yields.
  let spins = 0
  const spin = (): void => { if (++spins < 100) setImmediate(spin) }
  setImmediate(spin)
  let done = 0
  await inBatches(items, async batch => {
    // Each batch costs more CPU than a whole slice, as a large pass on a busy loop does.
    const until = process.cpuUsage().user / 1000 + UPKEEP_SLICE_MS * 1.5
    while (process.cpuUsage().user / 1000 < until) { /* busy */ }
    done += batch.length
  })
  t.equal(done, items.length, 'every item was handled once')
  t.ok(spins >= 3, `the event loop turned during the pass (${spins} turns)`)
})

interface Frame { id: number, result?: unknown, error?: { code: number } }

/** ClientStreams over the memory twins, with one session and a real HTTP server for its streams. */
interface Served { writer: ClientWriter, body: Promise<string> }

async function harness (t: Test, http: Record<string, unknown> = {}): Promise<{ streams: ClientStreams, eventLog: MemoryEventLog, sid: string, serve: (open: Omit<OpenStreamOptions, 'res' | 'sid' | 'headers' | 'log' | 'mode'>) => Promise<Served>, servePost: (open: Omit<OpenPostOptions, 'res' | 'sid' | 'headers' | 'log'>) => Promise<Served> }> {
  const { store, log, streams, eventLog } = memoryStreams(t, http)
  const sid = 'session-000000000001'
  await store.create({ id: sid, server: 's', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null, backendSessionId: null, createdAt: 0 }, 60_000)
  let next: ((res: ServerResponse) => void) | undefined
  const server = createServer((_req, res) => { next?.(res) })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const { port } = server.address() as AddressInfo
  const served = async (opening: (res: ServerResponse) => Promise<ClientWriter>): Promise<Served> => {
    const started = new Promise<ClientWriter>((resolve, reject) => {
      next = res => { opening(res).then(async writer => { await writer.start(); resolve(writer) }, reject) }
    })
    const body = fetch(`http://127.0.0.1:${port}/`).then(async res => await res.text())
    return { writer: await started, body }
  }
  const serve = async (open: Omit<OpenStreamOptions, 'res' | 'sid' | 'headers' | 'log' | 'mode'>): Promise<Served> =>
    await served(async res => await streams.open({ ...open, res, sid, mode: 'sse', headers: {}, log }))
  const servePost = async (open: Omit<OpenPostOptions, 'res' | 'sid' | 'headers' | 'log'>): Promise<Served> =>
    await served(async res => await streams.openPost({ ...open, res, sid, headers: {}, log }))
  return { streams, eventLog, sid, serve, servePost }
}

function framesOf (body: string): Array<{ eventId: string | undefined, message: Frame }> {
  return body.split('\n\n').filter(block => block.includes('data: {')).map(block => {
    const lines = block.split('\n')
    return {
      eventId: lines.find(line => line.startsWith('id: '))?.slice(4),
      message: JSON.parse(lines.find(line => line.startsWith('data: '))?.slice(6) ?? 'null') as Frame
    }
  })
}

t.test('a session that ends answers the requests still waiting on its POST streams, once', async t => {
  const { streams, sid, serve } = await harness(t)
  const streamId = newRequestStreamId('sse', 2)
  const { body } = await serve({ streamId, cursor: null, fresh: true, requestIds: [1, 2] })
  // Request 1 is answered through the log; request 2 is still waiting when the session ends.
  await streams.append(sid, streamId, { jsonrpc: '2.0', id: 1, result: {} })
  await new Promise(resolve => setTimeout(resolve, 50))
  streams.endSession(sid, new GW_ERR_BACKEND_UNAVAILABLE('s', 'session ended: owner replica gone'))
  const frames = framesOf(await body).map(f => f.message)
  t.same(frames.map(f => f.id), [1, 2], 'each request answered exactly once, and the stream ended')
  t.ok('result' in (frames[0] ?? {}), 'the answer that came is kept')
  t.equal(frames[1]?.error?.code, -32007, 'the waiting request gets -32007, not silence')
})

t.test('an answer written outside the log (store away) is never given twice to a client that resumes', async t => {
  const { streams, eventLog, sid, serve } = await harness(t)
  const streamId = newRequestStreamId('sse', 1)
  await eventLog.markPending(sid, streamId, [7], 60_000, true, 'r')
  const { body } = await serve({ streamId, cursor: null, fresh: true, requestIds: [7] })
  streams.failAwaiting(id => ({ jsonrpc: '2.0', id, error: { code: -32000, message: 'Session store unavailable' } }))
  const first = framesOf(await body)
  t.same(first.map(f => f.message.id), [7], 'the request is answered directly')
  t.equal(first[0]?.eventId, formatEventId(streamId, ANSWERED_DIRECTLY), 'with an event id a resume can name')
  // The client (the v1 SDK resumes after an error answer) comes back with the id it was given:
  // before anything reached the log, and after another replica found the request orphaned and
  // answered it through the log. Neither waits for an answer, neither gives a second one.
  const within = async (body: Promise<string>): Promise<string> => await Promise.race([body, new Promise<string>(resolve => setTimeout(() => resolve('(still open after 2 s)'), 2000))])
  const early = await serve({ streamId, cursor: ANSWERED_DIRECTLY, requestIds: [7] })
  const earlyBody = await within(early.body)
  t.not(earlyBody, '(still open after 2 s)', 'resumed before the log has an answer: over at once, not waiting for one already given')
  t.same(framesOf(earlyBody), [], 'with nothing in it')
  await streams.append(sid, streamId, { jsonrpc: '2.0', id: 7, error: { code: -32007, message: 'lost' } })
  const late = await serve({ streamId, cursor: ANSWERED_DIRECTLY, requestIds: [7] })
  t.same(framesOf(await within(late.body)), [], 'resumed after an orphan answer reached the log: no second answer')
  t.ok(late.writer.ended, 'and it is over')
})

t.test('the last answer of a stream held here is written at once; one sent as a JSON body leaves no marker or log (memory twins)', async t => {
  const { streams, eventLog, sid, servePost } = await harness(t)
  const post = async (id: number, lazyMs: number): Promise<Served & { streamId: string }> => {
    const streamId = newRequestStreamId('sse', 1)
    const served = await servePost({ streamId, mode: 'sse', requestIds: [id], priming: true, preamble: primingId => `id: ${formatEventId(streamId, primingId)}\ndata: \n\n`, lazyMs })
    return { ...served, streamId }
  }
  const held = await post(1, 60_000)
  t.equal(await streams.append(sid, held.streamId, { jsonrpc: '2.0', id: 1, result: { n: 1 } }), ANSWERED_DIRECTLY, 'answered without the log')
  t.same(JSON.parse(await held.body), { jsonrpc: '2.0', id: 1, result: { n: 1 } }, 'as one JSON body')
  await new Promise(resolve => setImmediate(resolve))
  t.same(await eventLog.pendingReplicas(sid), [], 'its marker is gone')
  t.equal(await eventLog.hasStream(sid, held.streamId), false, 'and its log')
  const open = await post(2, 0)
  const entryId = await streams.append(sid, open.streamId, { jsonrpc: '2.0', id: 2, result: { n: 2 } })
  const frames = framesOf(await open.body)
  t.same(frames.map(f => [f.eventId, f.message.id]), [[formatEventId(open.streamId, ANSWERED_DIRECTLY), 2]], 'an open SSE stream: the answer is its last frame, with the direct id')
  t.not(entryId, ANSWERED_DIRECTLY, 'and it is appended to the log too')
  t.same((await eventLog.readAfter(sid, open.streamId, null, 10)).map(e => e.message === null ? 'priming' : (e.message as Frame).id), ['priming', 2], 'where a client that lost the frame finds it')
})

t.test('an answer whose wake was lost still reaches its POST stream, at the next keep-alive', async t => {
  const { eventLog, sid, serve } = await harness(t, { keepAliveMs: 1000 })
  const streamId = newRequestStreamId('sse', 1)
  const { body } = await serve({ streamId, cursor: null, fresh: true, requestIds: [3] })
  // Appended to the log with no wake (as when the bus lost it in a Redis failover).
  await eventLog.append(sid, streamId, { jsonrpc: '2.0', id: 3, result: { late: true } }, 60_000)
  const startedAt = Date.now()
  const frames = framesOf(await body)
  t.same(frames.map(f => f.message), [{ id: 3, jsonrpc: '2.0', result: { late: true } }], 'the answer arrives, once, and the stream ends')
  t.ok(Date.now() - startedAt < 2500, `within about one keep-alive interval (${Date.now() - startedAt} ms)`)
})

t.test('a stream id says how many answers end it: r or j, one to four digits, then _', async t => {
  const cases: Array<[string, number]> = [
    ['r1_abc', 1], ['j3_x', 3], ['r12_y', 12], ['r9999_z', 9999], ['j0_a', 0],
    ['r10000_z', Infinity], ['r_1', Infinity], ['r1', Infinity], ['r1a_', Infinity], ['x1_a', Infinity],
    ['get', Infinity], ['legacy', Infinity], ['', Infinity], ['R1_a', Infinity]
  ]
  for (const [id, n] of cases) {
    t.equal(expectedResponsesOf(id), n, id)
    t.equal(isRequestStreamId(id), n !== Infinity, `${id} is ${n === Infinity ? 'not ' : ''}a POST's stream`)
  }
  for (const responses of [1, 7, 42]) {
    t.equal(expectedResponsesOf(newRequestStreamId('sse', responses)), responses, 'a minted SSE stream id')
    t.equal(expectedResponsesOf(newRequestStreamId('json', responses)), responses, 'a minted JSON stream id')
  }
})

t.test('a session\'s streams are found, ended and counted whether it holds one stream or several', async t => {
  const { store, log, streams } = memoryStreams(t)
  const sid = 'session-000000000002'
  await store.create({ id: sid, server: 's', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null, backendSessionId: null, createdAt: 0 }, 60_000)
  // Never started, so only what ending a writer touches: a response that ends.
  const res = (): ServerResponse => {
    const stub = { writableEnded: false, headersSent: false, end: () => { stub.writableEnded = true } }
    return stub as unknown as ServerResponse
  }
  const open = async (streamId: string): Promise<ClientWriter> => await streams.open({ res: res(), sid, streamId, mode: 'sse', cursor: null, headers: {}, log })
  const get = await open(GET_STREAM)
  t.ok(streams.writes(sid, GET_STREAM), 'one stream: found')
  const post = newRequestStreamId('sse', 1)
  const postWriter = await open(post)
  t.ok(streams.writes(sid, GET_STREAM) && streams.writes(sid, post), 'two streams: both found')
  t.same([...streams.countByKind().values()].reduce((a, b) => a + b, 0), 2, 'both counted')
  t.same([...streams.awaitingSessions()], [sid], 'a POST stream makes the session one that awaits answers')
  postWriter.end('released')
  t.notOk(streams.writes(sid, post), 'the ended POST stream is gone')
  t.ok(streams.writes(sid, GET_STREAM), 'the GET stream is still found')
  t.same([...streams.awaitingSessions()], [], 'no POST stream left')
  const again = await open(GET_STREAM)
  t.ok(get.ended, 'a second GET stream replaces the first')
  t.ok(streams.writes(sid, GET_STREAM))
  streams.endSession(sid, new GW_ERR_BACKEND_UNAVAILABLE('s', 'session ended'))
  t.ok(again.ended, 'ending the session ends its stream')
  t.notOk(streams.writes(sid, GET_STREAM))
  t.same(streams.countByKind().size, 0, 'nothing left')
})

t.test('a POST stream whose mark is on its way (mark: alongside) takes a wake only once the mark is in: priming, then the answer, no log read', async t => {
  const { streams, eventLog, sid, servePost } = await harness(t)
  // The mark is applied at once (as Redis applies it before the envelope that follows it) but
  // its reply is held, as when the answer's wake overtakes that reply.
  let release: () => void = () => {}
  const replied = new Promise<void>(resolve => { release = resolve })
  const markPending = eventLog.markPending.bind(eventLog)
  eventLog.markPending = async (...args: Parameters<MemoryEventLog['markPending']>) => {
    const primingId = await markPending(...args)
    await replied
    return primingId
  }
  let reads = 0
  const readAfter = eventLog.readAfter.bind(eventLog)
  eventLog.readAfter = async (...args: Parameters<MemoryEventLog['readAfter']>) => { reads++; return await readAfter(...args) }
  const streamId = newRequestStreamId('sse', 1)
  const { writer, body } = await servePost({ streamId, mode: 'sse', requestIds: [4], priming: true, preamble: primingId => `id: ${formatEventId(streamId, primingId)}\nretry: 1000\ndata: \n\n`, mark: 'alongside' })
  t.ok(writer.marking !== undefined, 'openPost returned before the mark\'s reply')
  // The owner's answer, appended and announced with its entry (as a wake envelope carries it).
  const { entryId, entry } = await eventLog.append(sid, streamId, { jsonrpc: '2.0', id: 4, result: { ok: true } }, 60_000, 4)
  t.not(entryId, '', 'the answer found its marker')
  streams.wake(sid, streamId, { entryId, json: entry?.json ?? '', seq: entry?.seq ?? 0 })
  await new Promise(resolve => setTimeout(resolve, 50))
  t.notOk(writer.ended, 'nothing is written while the mark\'s reply is out')
  release()
  const text = await body
  const blocks = text.split('\n\n').filter(b => b !== '')
  t.match(blocks[0], /^id: r1_\S+\nretry: 1000\ndata: $/, 'the priming event first, with the id the mark gave')
  t.same(framesOf(text).map(f => [f.eventId, f.message.id]), [[formatEventId(streamId, entryId), 4]], 'then the answer, once, with its log id')
  t.equal(reads, 0, 'taken from the wake: the log was not read back')
})
