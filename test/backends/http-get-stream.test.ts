// Memory per idle session (docs/performance.md): the standalone GET stream of a Streamable HTTP
// backend is driven as a state machine (src/backends/streamable-http.ts), each GET an SseExchange
// dispatched on the streams pool (src/backends/http-io.ts); POST streams are read with readSse.
// These tests hold it to what the async loop did: reconnects keep order and Last-Event-ID, an
// oversized message ends the stream, stop/start cycles and close() leave no GET running, a GET that
// fails at once or is stopped before it connects still settles, and readSse settles once with its
// listeners gone.
import type { ServerResponse } from 'node:http'
import t, { type Test } from 'tap'
import { httpConfig } from '../helpers/http-config.js'
import { eventually } from '../helpers/wait.js'
import { pino } from 'pino'
import { request, type Pool } from 'undici'
import { closeHttpDispatchers, openHttpBackend, type HttpBackendConnection, type HttpBackendOpenOptions } from '../../src/backends/http.js'
import { StreamableHttpBackend } from '../../src/backends/streamable-http.js'
import { dispatcherFor, DRAIN_TIMEOUT_MS, MAX_BODY_BYTES, readSse, type Body } from '../../src/backends/http-io.js'
import type { BackendExit, BackendHandlers } from '../../src/backends/backend.js'
import type { HttpServerConfig } from '../../src/config/schema.js'
import type { JsonRpcMessage, RequestId } from '../../src/core/jsonrpc.js'
import { closedPort, listen, readBody, type Recorded } from '../fixtures/http-upstreams.js'

t.teardown(closeHttpDispatchers)

const silent = pino({ level: process.env.TEST_LOG ?? 'silent' })

/** Waits for `find` to return something, polling often: some states here last only moments. */
async function until<T> (find: () => T | undefined, what: string, ms = 10_000): Promise<T> {
  return await eventually(what, find, ms, 5)
}

/**
 * A raw Streamable HTTP upstream whose n-th GET (0-based) is answered by `gets`; initialize makes
 * session 's1', notifications get 202. `open` counts the GET responses the upstream still holds.
 */
async function scriptedUpstream (t: Test, gets: (n: number, res: ServerResponse) => void): Promise<{ url: string, seen: Recorded[], open: () => number }> {
  const seen: Recorded[] = []
  let n = 0
  let open = 0
  const http = await listen((req, res) => {
    void readBody(req).then(text => {
      const body = text === '' ? undefined : JSON.parse(text) as { id?: RequestId, method?: string }
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body })
      if (req.method === 'GET') {
        open++
        res.once('close', () => { open-- })
        gets(n++, res)
        return
      }
      if (req.method === 'DELETE') { res.writeHead(200).end(); return }
      if (body?.method === 'initialize') {
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 's1' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'raw', version: '1' } } }))
        return
      }
      res.writeHead(202).end()
    })
  })
  t.teardown(http.close)
  return { url: `${http.url}/mcp`, seen, open: () => open }
}

interface Opened {
  conn: HttpBackendConnection
  messages: JsonRpcMessage[]
  ids: string[]
  exits: BackendExit[]
}

async function openReady (t: Test, config: HttpServerConfig, options: Partial<HttpBackendOpenOptions> = {}): Promise<Opened> {
  const messages: JsonRpcMessage[] = []
  const ids: string[] = []
  const exits: BackendExit[] = []
  const conn = await openHttpBackend({
    server: 'up',
    sid: 'client-session',
    config,
    log: silent,
    handlers: { onMessage: m => { messages.push(m) }, onExit: e => { exits.push(e) }, onGetStreamEventId: id => { ids.push(id) } },
    ...options
  })
  t.teardown(async () => await conn.close())
  await conn.send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'gw-test', version: '1' } } })
  await until(() => messages.find(m => 'id' in m && m.id === 1), 'the initialize result')
  await conn.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
  return { conn, messages, ids, exits }
}

const note = (n: number): string => `data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { n } })}\n\n`
const numbers = (messages: JsonRpcMessage[]): number[] =>
  messages.flatMap(m => 'method' in m && m.method === 'notifications/message' ? [(m.params as { n: number }).n] : [])
const gets = (seen: Recorded[]): Recorded[] => seen.filter(r => r.method === 'GET')

/**
 * GETs the shared streams pool of this upstream still runs (the backends' pool, http-io.ts): what a
 * stream left behind when it was stopped or lost would show here.
 */
const streamsOf = (url: string): Pool => dispatcherFor(new URL(url).origin, null, httpConfig(url).connectTimeoutMs)
const streamsRunning = (url: string): number => streamsOf(url).stats.running

t.test('a GET stream dropped again and again delivers every event once, in order, resuming after the last id', async t => {
  const drops = 6
  const up = await scriptedUpstream(t, (n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    // Two events per stream, split mid-event across writes; then the stream is cut (but the last one).
    res.write(`retry: 1\nid: e${n}a\n${note(2 * n)}id: e${n}b\ndata: `)
    res.write(`${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { n: 2 * n + 1 } })}\n\n`)
    if (n < drops) setTimeout(() => res.socket?.destroy(), 10)
  })
  const { conn, messages, ids, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 60_000, maxDelayMs: 60_000 } }))
  const last = 2 * drops + 1
  await until(() => numbers(messages).includes(last) ? true : undefined, 'the events of the last stream')
  t.same(numbers(messages), Array.from({ length: last + 1 }, (_, i) => i), 'every event once, in order')
  t.same(ids, Array.from({ length: drops + 1 }, (_, n) => [`e${n}a`, `e${n}b`]).flat(), 'every id reported, in order')
  const seen = gets(up.seen)
  t.equal(seen.length, drops + 1, 'one GET per stream: the server retry (1 ms) won over the 60 s backoff')
  t.notOk(seen[0]?.headers['last-event-id'], 'the first GET starts fresh')
  for (let n = 1; n < seen.length; n++) t.equal(seen[n]?.headers['last-event-id'], `e${n - 1}b`, `GET ${n} resumes after e${n - 1}b`)
  await until(() => up.open() === 1 ? true : undefined, 'the dropped streams gone upstream')
  t.equal(streamsRunning(up.url), 1, 'only the last GET runs: the dropped ones left nothing running')
  t.equal(exits.length, 0)
  await conn.close()
  t.equal(streamsRunning(up.url), 0)
})

t.test('stopListening/startListening cycles leave one GET running, and none once stopped', async t => {
  const up = await scriptedUpstream(t, (_n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(': open\n\n')
  })
  const { conn, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }))
  await until(() => up.open() === 1 ? true : undefined, 'the first GET stream')
  const cycles = 40
  for (let i = 0; i < cycles; i++) {
    conn.stopListening()
    conn.startListening()
    await until(() => gets(up.seen).length === i + 2 ? true : undefined, `GET ${i + 2}`)
  }
  await until(() => up.open() === 1 ? true : undefined, 'the stopped streams released upstream')
  t.equal(streamsRunning(up.url), 1, 'the stopped GETs were aborted: one runs, as before the cycles')
  conn.stopListening()
  await until(() => up.open() === 0 ? true : undefined, 'the last stream released upstream')
  t.equal(streamsRunning(up.url), 0, 'no GET run, no GET running')
  t.equal(exits.length, 0)
  await conn.close()
  t.equal(gets(up.seen).length, cycles + 1, 'nothing reconnected a stopped stream')
})

t.test('close() during a GET stream ends it upstream and its run with it', async t => {
  const up = await scriptedUpstream(t, (_n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(': open\n\n')
  })
  const { conn } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }))
  await until(() => up.open() === 1 ? true : undefined, 'the GET stream')
  await conn.close()
  await until(() => up.open() === 0 ? true : undefined, 'the stream released upstream')
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(gets(up.seen).length, 1, 'no reconnect after close')
  t.equal(streamsRunning(up.url), 0)
})

t.test('a GET stopped before its connection is up is aborted once it is, and listening again works', async t => {
  const up = await scriptedUpstream(t, (_n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(`id: s1\n${note(1)}`)
  })
  // A fresh origin: the first GET must connect first, so stopping at once stops it before undici starts it.
  const { conn, messages, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }), { listen: false })
  conn.startListening()
  conn.stopListening()
  // Queued or connecting counts too: until undici starts it, the GET is pending, not running.
  await until(() => streamsOf(up.url).stats.size === 0 ? true : undefined, 'the stopped GET aborted')
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(up.open(), 0, 'no stream held upstream')
  t.same(numbers(messages), [], 'nothing read from the stopped GET')
  conn.startListening()
  await until(() => numbers(messages).includes(1) ? true : undefined, 'the event of the next GET')
  t.equal(streamsRunning(up.url), 1)
  t.equal(exits.length, 0)
})

// An error page that never ends is drained as drain() does, then the 503 counts as a failed attempt.
for (const [what, page, waitMs] of [
  ['a GET answer that is not a stream and does not end is dropped after 64 KiB, then decided by its status', 'x'.repeat(100 * 1024), 10_000],
  // Under the drain limit and open: with bodyTimeout 0 only the deadline ends it.
  ['a GET answered 503 whose short body never ends is retried after DRAIN_TIMEOUT_MS', '<html>busy', DRAIN_TIMEOUT_MS + 4000]
] as const) {
  t.test(what, async t => {
    const up = await scriptedUpstream(t, (n, res) => {
      if (n > 0) {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(note(2))
        return
      }
      res.writeHead(503, { 'content-type': 'text/html' })
      res.write(page)
    })
    const { conn, messages, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }))
    await until(() => numbers(messages).includes(2) ? true : undefined, 'the event of the second GET', waitMs)
    t.equal(gets(up.seen).length, 2, 'the 503 was retried')
    await until(() => up.open() === 1 ? true : undefined, 'the endless answer released upstream')
    t.ok(conn.listening)
    t.equal(exits.length, 0)
  })
}

t.test('a GET that fails inside its dispatch (pool destroyed) is retried, then gives up with onExit', async t => {
  const up = await scriptedUpstream(t, (n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(note(n))
  })
  const { conn, messages, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }))
  await until(() => numbers(messages).includes(0) ? true : undefined, 'the first stream')
  // The backend keeps its pools: every GET from here fails from inside dispatch(), synchronously.
  await closeHttpDispatchers()
  const exit = await until(() => exits[0], 'onExit after the attempts')
  t.match(exit.reason, /the GET stream failed: .*destroyed.*; reconnect attempts exhausted/)
  t.equal(exits.length, 1)
  t.equal(gets(up.seen).length, 1, 'the failed GETs never reached the upstream')
  await conn.close()
})

t.test('with reconnect.maxAttempts 0, a GET that fails inside its dispatch reports onExit after its caller returned', async t => {
  const url = `http://127.0.0.1:${await closedPort()}/mcp`
  const noRetry = { maxAttempts: 0, baseDelayMs: 10, maxDelayMs: 20 }
  const exitsOf = (): { exits: BackendExit[], handlers: BackendHandlers } => {
    const exits: BackendExit[] = []
    return { exits, handlers: { onMessage: () => {}, onExit: e => { exits.push(e) } } }
  }

  t.test('the constructor (failover, listening at once)', async t => {
    // A header value with a line break (an env var's trailing newline, say) fails every dispatch at once.
    const config = httpConfig(url, { headers: { 'X-Upstream-Key': 'secret\n' }, reconnect: noRetry })
    const { exits, handlers } = exitsOf()
    const conn = new StreamableHttpBackend({ server: 'up', sid: 'client-session', config, log: silent, handlers, backendSessionId: 's1' }, config)
    t.teardown(async () => await conn.close())
    t.equal(exits.length, 0, 'not inside the constructor')
    const exit = await until(() => exits[0], 'onExit')
    t.match(exit.reason, /the GET stream failed: .*header.*; reconnect attempts exhausted/)
  })

  t.test('startListening()', async t => {
    const config = httpConfig(url, { reconnect: noRetry })
    const { exits, handlers } = exitsOf()
    const conn = await openHttpBackend({ server: 'up', sid: 'client-session', config, log: silent, handlers, backendSessionId: 's1', listen: false })
    t.teardown(async () => await conn.close())
    // The connection keeps its pools: its next GET fails from inside dispatch().
    await closeHttpDispatchers()
    conn.startListening()
    t.equal(exits.length, 0, 'not inside startListening()')
    const exit = await until(() => exits[0], 'onExit')
    t.match(exit.reason, /the GET stream failed: .*destroyed.*; reconnect attempts exhausted/)
    t.equal(exits.length, 1)
  })
})

t.test('a message above MAX_BODY_BYTES on the GET stream ends that stream; the next one resumes', async t => {
  const up = await scriptedUpstream(t, (n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    if (n > 0) {
      res.write(`id: g2\n${note(2)}`)
      return
    }
    res.write(`retry: 1\nid: g1\n${note(1)}id: big\ndata: `)
    // One message that never ends, past the limit in 1 MiB writes; the reader gives up on it.
    const mib = 'x'.repeat(1024 * 1024)
    for (let i = 0; i <= MAX_BODY_BYTES / mib.length + 1; i++) res.write(mib)
  })
  const { messages, exits } = await openReady(t, httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 60_000, maxDelayMs: 60_000 } }))
  await until(() => numbers(messages).includes(2) ? true : undefined, 'the event of the second stream', 30_000)
  t.same(numbers(messages), [1, 2])
  t.equal(gets(up.seen)[1]?.headers['last-event-id'], 'g1', 'the oversized message never moved the cursor')
  t.equal(exits.length, 0)
})

t.test('a POST\'s 404 re-initialises the session: the GET stream moves to the new session, and the old one\'s ids go unreported', async t => {
  // The backend ends session s1 for POSTs (404) but keeps its GET stream open, and sends on it once more.
  const seen: Recorded[] = []
  const streams = new Map<string, ServerResponse>()
  const released = new Set<string>()
  let sessions = 0
  const http = await listen((req, res) => {
    void readBody(req).then(text => {
      const body = text === '' ? undefined : JSON.parse(text) as { id?: RequestId, method?: string }
      const sid = req.headers['mcp-session-id']
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body })
      if (req.method === 'GET') {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(`id: ${sid === 's1' ? 'old-1' : 'new-1'}\n${note(sid === 's1' ? 1 : 3)}`)
        streams.set(String(sid), res)
        res.once('close', () => { released.add(String(sid)) })
        return
      }
      if (req.method === 'DELETE') { res.writeHead(200).end(); return }
      if (body?.method === 'initialize') {
        const next = `s${++sessions}`
        // The old session's stream speaks while the new session is being made.
        if (next === 's2') streams.get('s1')?.write(`id: old-2\n${note(2)}`)
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': next })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'raw', version: '1' } } }))
        return
      }
      if (body?.id === undefined) { res.writeHead(202).end(); return }
      if (sid === 's1') { res.writeHead(404).end(); return }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: {} }))
    })
  })
  t.teardown(http.close)
  const { conn, messages, ids, exits } = await openReady(t, httpConfig(`${http.url}/mcp`))
  await until(() => ids.includes('old-1') ? true : undefined, 'the first event of s1\'s stream')
  await conn.send({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'x' } })
  await until(() => messages.find(m => 'id' in m && m.id === 2 && !('method' in m)), 'the call answered on s2')
  await until(() => gets(seen).find(r => r.headers['mcp-session-id'] === 's2'), 'a GET on the new session')
  await until(() => released.has('s1') ? true : undefined, 'the stream of s1 released')
  await until(() => ids.includes('new-1') ? true : undefined, 'the first event of s2\'s stream')
  t.notOk(ids.includes('old-2'), 'no id of s1 reported once s1 was replaced')
  t.equal(gets(seen).length, 2, 'one GET per session')
  t.equal(exits.length, 0)
})

t.test('readSse settles once and removes its listeners', async t => {
  const http = await listen((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    if (req.url === '/end') {
      res.end('id: 1\ndata: a\n\nretry: 7\ndata: b\n\n')
    } else if (req.url === '/cut') {
      res.write('data: a\n\n')
      setTimeout(() => res.socket?.destroy(), 10)
    } else {
      res.write('data: a\n\ndata: b\n\n') // and stays open
    }
  })
  t.teardown(http.close)
  const read = async (path: string, onEvent: (data: string) => void = () => {}): Promise<{ body: Body, err: Error | null, calls: number, retry: number[] }> => {
    const { body } = await request(`${http.url}${path}`)
    const retry: number[] = []
    let calls = 0
    const err = await new Promise<Error | null>(resolve => {
      readSse(body, event => { onEvent(event.data) }, ms => { retry.push(ms) }, err => { calls++; resolve(err) })
    })
    await new Promise(resolve => setTimeout(resolve, 20)) // room for a second, wrong settlement
    return { body, err, calls, retry }
  }
  const listening = (body: Body): number => ['data', 'end', 'close'].reduce((sum, e) => sum + body.listenerCount(e), 0)

  const ended = await read('/end')
  t.equal(ended.err, null, 'the end of the body')
  t.same(ended.retry, [7])
  t.equal(ended.calls, 1)
  t.equal(listening(ended.body), 0)

  const cut = await read('/cut')
  t.type(cut.err, Error, 'a body cut short is a failure')
  t.equal(cut.calls, 1)
  t.equal(listening(cut.body), 0)

  const boom = new Error('handler failed')
  const thrown = await read('/open', data => { if (data === 'b') throw boom })
  t.equal(thrown.err, boom, 'a throwing handler ends the read with its error')
  t.ok(thrown.body.destroyed, 'and releases the body')
  t.equal(thrown.calls, 1)
  t.equal(listening(thrown.body), 0)
})

t.test('readSse: a message above MAX_BODY_BYTES ends the read in the chunk that crosses the limit', async t => {
  // Each answer crosses the limit, then the upstream goes quiet with the stream open.
  const http = await listen((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    if (req.url === '/endless') {
      res.write(`data: ${'x'.repeat(MAX_BODY_BYTES)}`)
      return
    }
    // The event ends in the chunk that crosses the limit, which eventsource-parser alone dispatches whole.
    res.write(`id: big\ndata: ${'x'.repeat(MAX_BODY_BYTES - 1000)}`)
    setTimeout(() => res.write(`${'x'.repeat(2000)}\n\ndata: after\n\n`), 50)
  })
  t.teardown(http.close)
  const read = async (path: string): Promise<{ body: Body, err: Error | null | 'still reading', events: string[] }> => {
    const { body } = await request(`${http.url}${path}`)
    const events: string[] = []
    const err = await Promise.race([
      new Promise<Error | null>(resolve => { readSse(body, event => { events.push(event.id ?? event.data) }, () => {}, resolve) }),
      new Promise<'still reading'>(resolve => setTimeout(() => resolve('still reading'), 5000).unref())
    ])
    return { body, err, events }
  }
  for (const path of ['/endless', '/completed']) {
    const { body, err, events } = await read(path)
    t.match(err, { message: /max buffer size|exceeds/ }, `${path}: the read ended with the limit's error`)
    t.same(events, [], `${path}: nothing delivered`)
    t.ok(body.destroyed, `${path}: the body released`)
  }
})
