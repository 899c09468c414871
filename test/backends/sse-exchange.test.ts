// SseExchange (src/backends/http-io.ts): the standalone GET stream's request, dispatched on an
// undici pool with a handler object instead of request() (less held per idle stream). What
// request() and readSse gave for free is held here: undici's own errors (the error mapping of
// http-base.ts reads them), one end per exchange, answers that are not read drained as drain()
// does, a handler's throw ending the read, abort() releasing the connection, and the raw header
// Buffers undici 7 would keep let go of. Its parser is dropped between events and made again: it
// must read exactly what one eventsource-parser fed the same chunks through one TextDecoder reads
// (as readSse does).
import type { IncomingHttpHeaders } from 'node:http'
import t, { type Test } from 'tap'
import { eventually } from '../helpers/wait.js'
import { Pool, request, type Dispatcher } from 'undici'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import { describe, DRAIN_TIMEOUT_MS, endsEvent, MAX_BODY_BYTES, SseExchange, type SseHandler } from '../../src/backends/http-io.js'
import { closedPort, listen } from '../fixtures/http-upstreams.js'

/** Records what an exchange reports; `read` decides whether an answer is read as SSE. */
class Recorder implements SseHandler {
  readonly events: EventSourceMessage[] = []
  readonly retries: number[] = []
  readonly ends: Array<Error | null> = []
  answered: { status: number, headers: IncomingHttpHeaders } | null = null
  constructor (readonly read: (status: number) => boolean = status => status === 200, readonly onEvent: (event: EventSourceMessage) => void = () => {}) {}

  onSseResponse (_exchange: SseExchange, status: number, headers: IncomingHttpHeaders): boolean {
    this.answered = { status, headers }
    return this.read(status)
  }

  onSseEvent (_exchange: SseExchange, event: EventSourceMessage): void {
    this.events.push(event)
    this.onEvent(event)
  }

  onSseRetry (_exchange: SseExchange, ms: number): void {
    this.retries.push(ms)
  }

  onSseEnd (_exchange: SseExchange, err: Error | null): void {
    this.ends.push(err)
  }
}

/** An exchange that keeps the controller undici hands it, to look at afterwards. */
class Watched extends SseExchange {
  controller: Dispatcher.DispatchController | null = null
  override onRequestStart (controller: Dispatcher.DispatchController): void {
    this.controller = controller
    super.onRequestStart(controller)
  }
}

/** Waits for `find` to return something, polling often: some states here last only moments. */
async function until<T> (find: () => T | undefined, what: string, ms = 5000): Promise<T> {
  return await eventually(what, find, ms, 5)
}

const settle = async (): Promise<void> => { await new Promise(resolve => setTimeout(resolve, 30)) }

async function upstream (t: Test, answer: Parameters<typeof listen>[0]): Promise<{ pool: Pool, url: string, open: () => number }> {
  let open = 0
  const http = await listen((req, res) => {
    open++
    res.once('close', () => { open-- })
    answer(req, res)
  })
  const pool = new Pool(http.url, { connections: null, bodyTimeout: 0 })
  t.teardown(async () => {
    await pool.destroy()
    await http.close()
  })
  return { pool, url: http.url, open: () => open }
}

const get = (headersTimeout = 5000): Dispatcher.DispatchOptions => ({ method: 'GET', path: '/sse', headers: { accept: 'text/event-stream' }, headersTimeout, bodyTimeout: 0 })

t.test('reads events, ids and retry across chunks, and ends once with null when the body ends', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('retry: 250\nid: 1\nevent: message\ndata: {"a":')
    setTimeout(() => { res.end('1}\n\n: comment\nid: 2\ndata: x\ndata: y\n\n') }, 10)
  })
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  exchange.start(up.pool, get())
  await until(() => rec.ends[0] !== undefined ? true : undefined, 'the end')
  await settle()
  t.same(rec.ends, [null], 'one end, no error')
  t.same(rec.events.map(e => [e.id, e.event, e.data]), [['1', 'message', '{"a":1}'], ['2', undefined, 'x\ny']])
  t.same(rec.retries, [250])
  t.equal(exchange.status, 200)
  t.ok(exchange.streaming)
  t.equal(up.pool.stats.running, 0, 'nothing left running')
})

t.test('lets go of the answer\'s raw header Buffers while the stream stays open', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'x-padding': 'p'.repeat(200) })
    res.write('data: open\n\n')
  })
  const rec = new Recorder()
  const exchange = new Watched(rec)
  exchange.start(up.pool, get())
  await until(() => rec.events[0], 'the first event')
  t.equal(rec.answered?.headers['x-padding'], 'p'.repeat(200), 'the handler saw the headers')
  t.ok(exchange.controller, 'undici handed the exchange its controller')
  t.notOk(exchange.controller?.rawHeaders, 'the controller no longer holds them')
  exchange.abort()
})

/** An upstream that sends one event and keeps the stream open, and an exchange started on it. */
async function oneEventStarted (t: Test): Promise<{ up: Awaited<ReturnType<typeof upstream>>, rec: Recorder, exchange: SseExchange }> {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: one\n\n')
  })
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  exchange.start(up.pool, get())
  return { up, rec, exchange }
}

t.test('abort() ends the exchange without a report and releases its connection', async t => {
  const { up, rec, exchange } = await oneEventStarted(t)
  await until(() => rec.events[0], 'the first event')
  exchange.abort()
  exchange.abort()
  await until(() => up.open() === 0 ? true : undefined, 'the stream closed upstream')
  await settle()
  t.same(rec.ends, [], 'no onSseEnd after abort()')
  t.equal(up.pool.stats.running, 0)
})

t.test('abort() before the request started aborts it when undici starts it', async t => {
  const { up, rec, exchange } = await oneEventStarted(t)
  exchange.abort() // the pool is still connecting
  await until(() => up.pool.stats.running === 0 && up.pool.stats.pending === 0 ? true : undefined, 'the request gone')
  await settle()
  t.equal(up.open(), 0, 'nothing held upstream')
  t.same(rec.events, [])
  t.same(rec.ends, [])
})

t.test('a throw of the handler ends the read with that error and releases the connection', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: a\n\ndata: b\n\ndata: c\n\n')
  })
  const boom = new Error('handler failed')
  const rec = new Recorder(undefined, event => { if (event.data === 'b') throw boom })
  new SseExchange(rec).start(up.pool, get())
  await until(() => rec.ends[0], 'the end')
  await until(() => up.open() === 0 ? true : undefined, 'the stream closed upstream')
  await settle()
  t.same(rec.ends, [boom], 'ended once, with the handler\'s error')
  t.same(rec.events.map(e => e.data), ['a', 'b'], 'nothing read after the throw')
  t.equal(up.pool.stats.running, 0)
})

t.test('a stream cut short ends with undici\'s error', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: a\n\n')
    setTimeout(() => res.socket?.destroy(), 10)
  })
  const rec = new Recorder()
  new SseExchange(rec).start(up.pool, get())
  const err = await until(() => rec.ends[0], 'the end')
  t.type(err, Error)
  t.match(err, { code: 'UND_ERR_SOCKET' }, 'the error request() would report for the body')
  t.same(rec.events.map(e => e.data), ['a'])
})

t.test('failures before an answer are undici\'s own errors, as request() rejects with', async t => {
  t.test('connection refused', async t => {
    const origin = `http://127.0.0.1:${await closedPort()}`
    const pool = new Pool(origin, { connections: null })
    t.teardown(async () => await pool.destroy())
    const rec = new Recorder()
    const exchange = new SseExchange(rec)
    exchange.start(pool, get())
    const err = await until(() => rec.ends[0], 'the end')
    const viaRequest: unknown = await request(`${origin}/sse`).then(() => null, (e: unknown) => e)
    t.match(err, { code: 'ECONNREFUSED' })
    t.equal(describe(err), describe(viaRequest), 'described as the request() failure is')
    t.equal(exchange.status, 0, 'no answer')
  })

  t.test('no headers within headersTimeout', async t => {
    const up = await upstream(t, () => {}) // never answers
    const rec = new Recorder()
    new SseExchange(rec).start(up.pool, get(50))
    const err = await until(() => rec.ends[0], 'the end')
    t.match(err, { code: 'UND_ERR_HEADERS_TIMEOUT' })
  })

  t.test('a destroyed pool: undici reports it from inside dispatch(); onSseEnd follows once start() returned', async t => {
    const pool = new Pool('http://127.0.0.1:9', { connections: null })
    await pool.destroy()
    const rec = new Recorder()
    new SseExchange(rec).start(pool, get())
    t.equal(rec.ends.length, 0, 'not from inside start()')
    await Promise.resolve()
    t.equal(rec.ends.length, 1, 'on the next microtask')
    t.match(rec.ends[0], { code: 'UND_ERR_DESTROYED' })
  })

  t.test('a dispatcher that throws: one onSseEnd with its error, after start() returned', async t => {
    const throwing = new Pool('http://127.0.0.1:9', { connections: null })
    t.teardown(async () => await throwing.destroy())
    throwing.dispatch = () => { throw new TypeError('bad options') }
    const rec = new Recorder()
    const exchange = new SseExchange(rec)
    exchange.start(throwing, get())
    t.equal(rec.ends.length, 0, 'not from inside start()')
    await settle()
    t.equal(rec.ends.length, 1)
    t.match(rec.ends[0], { name: 'TypeError', message: 'bad options' })
    t.equal(exchange.status, 0)
  })
})

t.test('an answer it is told not to read is drained to its end, then reported with its status', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(409, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ error: 'taken' }))
  })
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  exchange.start(up.pool, get())
  await until(() => rec.ends[0] !== undefined ? true : undefined, 'the end')
  t.same(rec.ends, [null])
  t.equal(exchange.status, 409)
  t.notOk(exchange.streaming)
  t.same(rec.events, [], 'the body was not parsed')
  await settle()
  t.equal(up.pool.stats.connected, 1, 'read to its end: the connection stays for the next request')
})

t.test('an answer it is told not to read whose body never ends is reported with its status after DRAIN_TIMEOUT_MS', async t => {
  const up = await upstream(t, (_req, res) => {
    res.writeHead(409, { 'content-type': 'application/json' })
    res.write('{"error":') // and stays open, well under the drain limit
  })
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  const started = Date.now()
  exchange.start(up.pool, get())
  await until(() => rec.ends[0] !== undefined ? true : undefined, 'the end', DRAIN_TIMEOUT_MS + 4000)
  t.ok(Date.now() - started >= DRAIN_TIMEOUT_MS - 50, 'not before the deadline')
  t.same(rec.ends, [null], 'reported as ended: the status decides')
  t.equal(exchange.status, 409)
  await until(() => up.open() === 0 ? true : undefined, 'the connection dropped upstream')
  await settle()
  t.same(rec.ends, [null], 'once')
  t.equal(up.pool.stats.running, 0)
})

/** A controller for driving an exchange by hand, as undici would. */
function fakeController (): Dispatcher.DispatchController {
  return { aborted: false, paused: false, reason: null, rawHeaders: [], abort () {}, pause () {}, resume () {} }
}

t.test('a controller whose rawHeaders is getter-only: the stream is read as any other', async t => {
  const controller: Dispatcher.DispatchController = {
    aborted: false,
    paused: false,
    reason: null,
    get rawHeaders () { return [] },
    abort () {},
    pause () {},
    resume () {}
  }
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  exchange.onRequestStart(controller)
  exchange.onResponseStart(controller, 200, { 'content-type': 'text/event-stream' })
  exchange.onResponseData(controller, Buffer.from('data: a\n\n'))
  exchange.onResponseEnd()
  t.equal(exchange.status, 200)
  t.ok(exchange.streaming)
  t.same(rec.events.map(e => e.data), ['a'])
  t.same(rec.ends, [null], 'ended by its body, not by a failed write')
})

t.test('a handler that throws on the answer: reported as a failure with status 0, not as a refused answer', async t => {
  const boom = new Error('onSseResponse failed')
  const rec = new Recorder(() => { throw boom })
  const exchange = new SseExchange(rec)
  const controller = fakeController()
  exchange.onRequestStart(controller)
  exchange.onResponseStart(controller, 200, { 'content-type': 'text/event-stream' })
  t.same(rec.ends, [boom])
  t.equal(exchange.status, 0, 'the answer was never taken')
  t.notOk(exchange.streaming)
})

// ---- the parser made per event: same reading as one parser for the whole stream ---------------

/** Feeds `chunks` to an exchange as one 200 text/event-stream answer; what it reported. */
function readChunks (chunks: Uint8Array[]): Recorder {
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  const controller = fakeController()
  exchange.onRequestStart(controller)
  exchange.onResponseStart(controller, 200, { 'content-type': 'text/event-stream' })
  for (const chunk of chunks) exchange.onResponseData(controller, Buffer.from(chunk))
  exchange.onResponseEnd()
  return rec
}

/** The reference: one eventsource-parser and one TextDecoder for the whole stream, fed the same chunks. */
function readOnce (chunks: Uint8Array[]): { events: EventSourceMessage[], retries: number[] } {
  const events: EventSourceMessage[] = []
  const retries: number[] = []
  const parser = createParser({ onEvent: e => { events.push(e) }, onRetry: ms => { retries.push(ms) } })
  const decoder = new TextDecoder()
  for (const chunk of chunks) parser.feed(decoder.decode(chunk, { stream: true }))
  parser.feed(decoder.decode())
  return { events, retries }
}

/** Deterministic (mulberry32), so a failure can be replayed from its seed. */
function random (seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let x = Math.imul(a ^ (a >>> 15), 1 | a)
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
}

/** A stream of SSE lines of every kind the spec names, with LF, CR and CRLF endings and blank lines. */
function sseStream (rnd: () => number): Uint8Array {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)] as T
  const texts = ['{"jsonrpc":"2.0","method":"x"}', '', ' leading space', 'é ü', '😀 emoji', '日本語', 'a:b:c']
  const lines = [
    () => `data: ${pick(texts)}`, () => `data:${pick(texts)}`, () => 'data', () => `id: ${pick(['1', 'e-2', '', 'x y'])}`,
    () => 'id: a\0b', () => `event: ${pick(['message', 'endpoint', ''])}`, () => 'event', () => `retry: ${pick(['0', '250', '1x', '-5'])}`,
    () => `: ${pick(texts)}`, () => ':', () => `unknown: ${pick(texts)}`, () => 'nocolon', () => '',
    () => '\uFEFFdata: after-bom', () => 'ï»¿data: latin-bom'
  ]
  let text = rnd() < 0.3 ? '\uFEFF' : ''
  const n = 5 + Math.floor(rnd() * 40)
  for (let i = 0; i < n; i++) text += (rnd() < 0.3 ? '' : pick(lines)()) + pick(['\n', '\n', '\r', '\r\n'])
  return new TextEncoder().encode(text)
}

/** Cuts bytes at random points, sometimes right after each event boundary, sometimes inside a character. */
function chunked (bytes: Uint8Array, rnd: () => number): Uint8Array[] {
  const chunks: Uint8Array[] = []
  let start = 0
  for (let i = 1; i < bytes.length; i++) {
    if (rnd() < 0.15 || (endsEvent(bytes.subarray(start, i)) && rnd() < 0.7)) {
      chunks.push(bytes.subarray(start, i))
      start = i
    }
  }
  chunks.push(bytes.subarray(start))
  return chunks
}

t.test('whatever the chunking, the events and retries are those of one parser for the whole stream', async t => {
  let cases = 0
  for (let seed = 1; seed <= 400; seed++) {
    const rnd = random(seed)
    const bytes = sseStream(rnd)
    for (const chunks of [[bytes], chunked(bytes, rnd), chunked(bytes, rnd), Array.from(bytes, b => Uint8Array.of(b))]) {
      const want = readOnce(chunks)
      const got = readChunks(chunks)
      cases++
      if (JSON.stringify(got.events) !== JSON.stringify(want.events) || JSON.stringify(got.retries) !== JSON.stringify(want.retries)) {
        t.fail(`seed ${seed}: ${JSON.stringify(new TextDecoder().decode(bytes))} in ${chunks.length} chunks`, { found: got.events, wanted: want.events })
        return
      }
      if (got.ends.length !== 1 || got.ends[0] !== null) t.fail(`seed ${seed}: ended ${JSON.stringify(got.ends)}`)
    }
  }
  t.pass(`${cases} chunkings read alike`)
})

t.test('a BOM is stripped at the stream\'s start only, also when the parser was dropped before it', async t => {
  const enc = (s: string): Uint8Array => new TextEncoder().encode(s)
  const at = readChunks([enc('\uFEFFdata: a\n\n')])
  t.same(at.events.map(e => e.data), ['a'], 'stripped at the start')
  // After a whole event the parser is dropped; the next chunk starts with a BOM, which is no BOM here.
  const later = readChunks([enc('data: a\n\n'), enc('\uFEFFdata: b\n\n'), enc('data: c\n\n')])
  t.same(later.events.map(e => e.data), ['a', 'c'], 'mid-stream it is part of a field name, as for one parser')
  const latin = readChunks([enc('data: a\n\n'), enc('ï»¿data: b\n\n')])
  t.same(latin.events.map(e => e.data), ['a'], 'nor does a new parser take its first chunk for the stream\'s start')
  t.same(readOnce([enc('data: a\n\n'), enc('ï»¿data: b\n\n')]).events.map(e => e.data), ['a'], '(one parser agrees)')
})

// ---- events above MAX_BODY_BYTES: the read ends in the chunk that crosses the limit -------------

t.test('an oversized event that the chunk crossing the limit completes is not delivered', async t => {
  const enc = (s: string): Uint8Array => new TextEncoder().encode(s)
  // eventsource-parser checks its limit after dispatching: on its own it would hand this event over whole.
  const rec = readChunks([enc(`id: big\ndata: ${'x'.repeat(MAX_BODY_BYTES - 1000)}`), enc(`${'x'.repeat(2000)}\n\ndata: after\n\n`)])
  t.same(rec.events.map(e => e.id), [], 'neither it nor what followed it in that chunk')
  t.equal(rec.ends.length, 1)
  t.match(rec.ends[0], { message: /exceeds/ })
})

t.test('an oversized event that does not end ends the read in the chunk that crosses the limit, not the next', async t => {
  const rec = new Recorder()
  const exchange = new SseExchange(rec)
  const controller = fakeController()
  exchange.onRequestStart(controller)
  exchange.onResponseStart(controller, 200, { 'content-type': 'text/event-stream' })
  exchange.onResponseData(controller, Buffer.from('data: x\n\n'))
  exchange.onResponseData(controller, Buffer.from(`data: ${'x'.repeat(MAX_BODY_BYTES)}`))
  t.equal(rec.ends.length, 1, 'ended at once: an upstream that goes quiet now cannot leave it waiting')
  t.match(rec.ends[0], { message: /max buffer size/ })
  t.same(rec.events.map(e => e.data), ['x'])
})

t.test('endsEvent: a chunk that ends with an empty line, whatever the line endings', async t => {
  const ends = (s: string): boolean => endsEvent(new TextEncoder().encode(s))
  for (const s of ['data: a\n\n', 'data: a\r\n\r\n', 'data: a\r\r\n', 'data: a\n\r\n', ': ping\n\n', '\n\n', 'x\r\n\n']) t.ok(ends(s), JSON.stringify(s))
  for (const s of ['', '\n', '\r\n', 'data: a\n', 'data: a\r\n', 'data: a\n\r', 'data: a\r\r', 'data: a']) t.notOk(ends(s), JSON.stringify(s))
})
