// HTTP backends (src/backends/streamable-http.ts, legacy-sse.ts) against real upstreams on 127.0.0.1: the SDK's
// StreamableHTTPServerTransport and SSEServerTransport, server-everything in its
// streamableHttp mode, and raw node:http servers that misbehave on purpose.
// Over 500 lines on purpose: both transports share the upstream fixtures and helpers set up above
// the tests, and the "failures" block compares them case by case.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { createRequire } from 'node:module'
import { httpConfig } from '../helpers/http-config.js'
import t, { type Test } from 'tap'
import { pino } from 'pino'
import type { BackendExit, BackendHandlers } from '../../src/backends/backend.js'
import { closeHttpDispatchers, httpBackendFactory, openHttpBackend, type HttpBackendConnection, type HttpBackendOpenOptions } from '../../src/backends/http.js'
import type { HttpServerConfig } from '../../src/config/schema.js'
import type { GatewayError } from '../../src/core/errors.js'
import type { JsonRpcFailure, JsonRpcMessage, JsonRpcRequest, JsonRpcSuccess, RequestId } from '../../src/core/jsonrpc.js'
import { closedPort, listen, readBody, startLegacyUpstream, startStreamableUpstream, type Recorded } from '../fixtures/http-upstreams.js'
import { reap } from '../helpers/reaper.js'

t.teardown(closeHttpDispatchers)

const silent = pino({ level: process.env.TEST_LOG ?? 'silent' })


/** Collects what the connection hands to its handlers and waits for it (guarding against hangs, not timing). */
class Inbox {
  readonly messages: JsonRpcMessage[] = []
  readonly sessionIds: Array<string | null> = []
  readonly exits: BackendExit[] = []
  readonly handlers: BackendHandlers = {
    onMessage: m => { this.messages.push(m) },
    onExit: e => { this.exits.push(e) },
    onBackendSessionId: id => { this.sessionIds.push(id) }
  }

  async until<T> (find: () => T | undefined, what: string, ms = 10_000): Promise<T> {
    const deadline = Date.now() + ms
    for (;;) {
      const found = find()
      if (found !== undefined) return found
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
      await new Promise(resolve => setTimeout(resolve, 10))
    }
  }

  async response (id: RequestId): Promise<JsonRpcSuccess | JsonRpcFailure> {
    return await this.until(() => this.messages.find((m): m is JsonRpcSuccess | JsonRpcFailure => !('method' in m) && m.id === id), `the response to ${id}`)
  }

  async result (id: RequestId): Promise<Record<string, unknown>> {
    const reply = await this.response(id)
    if ('error' in reply) throw new Error(`request ${id} failed: ${JSON.stringify(reply.error)}`)
    return reply.result as Record<string, unknown>
  }

  async error (id: RequestId): Promise<JsonRpcFailure['error'] & { data: Record<string, unknown> }> {
    const reply = await this.response(id)
    if (!('error' in reply)) throw new Error(`request ${id} succeeded: ${JSON.stringify(reply.result)}`)
    return reply.error as JsonRpcFailure['error'] & { data: Record<string, unknown> }
  }
}

const req = (id: RequestId, method: string, params?: Record<string, unknown>): JsonRpcRequest =>
  params === undefined ? { jsonrpc: '2.0', id, method } : { jsonrpc: '2.0', id, method, params }
const call = (id: RequestId, name: string, args: Record<string, unknown> = {}, meta?: Record<string, unknown>): JsonRpcRequest =>
  req(id, 'tools/call', meta === undefined ? { name, arguments: args } : { name, arguments: args, _meta: meta })
const initParams = { protocolVersion: '2025-06-18', capabilities: { sampling: {} }, clientInfo: { name: 'gw-test', version: '1.0.0' } }
const initialized: JsonRpcMessage = { jsonrpc: '2.0', method: 'notifications/initialized' }
const toolText = (result: Record<string, unknown>): string => ((result.content as Array<{ text: string }>)[0]?.text) ?? ''

async function open (t: Test, options: Partial<HttpBackendOpenOptions> & { config: HttpServerConfig }): Promise<{ conn: HttpBackendConnection, inbox: Inbox }> {
  const inbox = new Inbox()
  const conn = await openHttpBackend({ server: 'up', sid: 'client-session', log: silent, handlers: inbox.handlers, ...options })
  t.teardown(async () => await conn.close())
  return { conn, inbox }
}

async function handshake (conn: HttpBackendConnection, inbox: Inbox, id: RequestId = 1): Promise<Record<string, unknown>> {
  await conn.send(req(id, 'initialize', initParams))
  const result = await inbox.result(id)
  await conn.send(initialized)
  return result
}

const posts = (requests: Recorded[], method: string): Recorded[] =>
  requests.filter(r => r.method === 'POST' && (r.body as { method?: string } | undefined)?.method === method)

t.test('Streamable HTTP upstream (SDK, SSE responses): round trips, headers, session, re-init, DELETE', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const { conn, inbox } = await open(t, {
    config: httpConfig(up.url, { headers: { 'X-Api-Key': 'backend-key' }, forwardHeaders: ['X-Trace-Id', 'Authorization-Not-Listed'] }),
    forwardedHeaders: { Authorization: 'Bearer client-token', 'x-trace-id': 'trace-1', 'x-other': 'not forwarded' }
  })

  const init = await handshake(conn, inbox)
  t.equal(init.protocolVersion, '2025-06-18', 'initialize answered with the negotiated version')
  const sid = await inbox.until(() => inbox.sessionIds[0], 'the backend session id')
  t.ok(up.sessions.has(sid as string), 'the backend session id reported is the upstream one')
  t.equal(conn.backendSessionId, sid)
  await inbox.until(() => up.requests.find(r => r.method === 'GET'), 'the standalone GET stream after initialized')

  t.match(toolText(await (async () => { await conn.send(call(2, 'echo', { message: 'hi' })); return await inbox.result(2) })()), 'echo: hi')

  await conn.send(call(3, 'progress-log', {}, { progressToken: 'p1' }))
  const done = await inbox.result(3)
  t.equal(toolText(done), 'done')
  const at3 = inbox.messages.findIndex(m => 'id' in m && m.id === 3 && !('method' in m))
  const progress = inbox.messages.findIndex(m => 'method' in m && m.method === 'notifications/progress')
  const logline = inbox.messages.findIndex(m => 'method' in m && m.method === 'notifications/message')
  t.ok(progress >= 0 && progress < at3, 'progress arrived before the response')
  t.ok(logline >= 0 && logline < at3, 'the log message arrived before the response')
  t.match(inbox.messages[progress], { params: { progressToken: 'p1', progress: 1 } })

  // Server-to-client request: the backend asks for sampling on the tools/call stream; the
  // answer goes back through send() as a response.
  await conn.send(call(4, 'ask-sampling'))
  const sampling = await inbox.until(() => inbox.messages.find((m): m is JsonRpcRequest => 'method' in m && m.method === 'sampling/createMessage' && 'id' in m), 'the sampling request')
  await conn.send({ jsonrpc: '2.0', id: sampling.id, result: { role: 'assistant', content: { type: 'text', text: 'sampled!' }, model: 'test-model' } })
  t.equal(toolText(await inbox.result(4)), 'sampled: sampled!', 'the server-to-client round trip completed')

  // Headers upstream (A-UP-1, H-PV-1, H-SES-2, H-POST-1).
  t.ok(up.requests.length >= 6)
  for (const r of up.requests) {
    t.notOk('authorization' in r.headers, `${r.method}: the client's Authorization is not sent`)
    t.notOk('x-other' in r.headers, `${r.method}: unlisted client headers are not sent`)
    t.equal(r.headers['x-api-key'], 'backend-key', `${r.method}: config.headers are sent`)
    t.equal(r.headers['x-trace-id'], 'trace-1', `${r.method}: forwardHeaders are honoured`)
  }
  const [initPost] = posts(up.requests, 'initialize')
  t.notOk(initPost?.headers['mcp-session-id'], 'initialize carries no session id')
  for (const r of up.requests.filter(r => r !== initPost)) {
    t.equal(r.headers['mcp-session-id'], sid, `${r.method} ${(r.body as { method?: string } | undefined)?.method ?? ''}: session id sent`)
    t.equal(r.headers['mcp-protocol-version'], '2025-06-18', `${r.method}: MCP-Protocol-Version sent`)
  }
  for (const r of up.requests.filter(r => r.method === 'POST')) t.match(r.headers.accept, /application\/json.*text\/event-stream/)

  // stopListening / startListening: the GET stream is closed and opened again on request.
  t.equal(conn.listening, true)
  conn.stopListening()
  t.equal(conn.listening, false)
  const gets = up.requests.filter(r => r.method === 'GET').length
  conn.startListening()
  await inbox.until(() => up.requests.filter(r => r.method === 'GET').length > gets ? true : undefined, 'a new GET stream')

  // H-SES-3: the backend forgets the session; the next call re-initialises transparently.
  await up.dropSession(sid as string)
  await conn.send(call(5, 'echo', { message: 'again' }))
  t.equal(toolText(await inbox.result(5)), 'echo: again', 'the call after a 404 succeeded')
  const inits = posts(up.requests, 'initialize')
  t.equal(inits.length, 2, 'the gateway initialised a new backend session')
  const gwInit = inits[1]!.body as JsonRpcRequest
  t.match(String(gwInit.id), /^gw-init-/, 'with a gateway-minted id')
  t.same(gwInit.params, initParams, 'with the client\'s remembered initialize params')
  t.equal(posts(up.requests, 'notifications/initialized').length, 2, 'followed by initialized')
  t.notOk(inbox.messages.some(m => 'id' in m && String(m.id).startsWith('gw-init-')), 'the gateway\'s initialize response never reaches onMessage')
  const newSid = inbox.sessionIds.at(-1)
  t.not(newSid, sid, 'the new backend session id was reported')
  t.equal(conn.backendSessionId, newSid)
  t.equal(up.requests.at(-1)?.headers['mcp-session-id'], newSid)

  await conn.close()
  const del = up.requests.find(r => r.method === 'DELETE')
  t.ok(del, 'close() DELETEd the backend session')
  t.equal(del?.headers['mcp-session-id'], newSid)
  t.equal(up.sessions.size, 0, 'the upstream session is gone')
  await conn.close() // idempotent
  await t.rejects(conn.send(call(6, 'echo', { message: 'late' })), { code: 'GW_ERR_BACKEND_UNAVAILABLE' }, 'send after close rejects')
  t.equal(inbox.exits.length, 0, 'close() is not an exit')
})

t.test('Streamable HTTP upstream in JSON response mode', async t => {
  const up = await startStreamableUpstream({ enableJsonResponse: true })
  t.teardown(up.close)
  const { conn, inbox } = await open(t, { config: httpConfig(up.url) })
  await handshake(conn, inbox, 'init')
  await conn.send(call('a', 'echo', { message: 'json' }))
  t.equal(toolText(await inbox.result('a')), 'echo: json')
  const post = posts(up.requests, 'tools/call')[0]
  t.ok(post, 'the call went upstream')
  t.equal(post?.headers['mcp-protocol-version'], '2025-06-18')
  // Notifications and responses get 202 and resolve send().
  await conn.send({ jsonrpc: '2.0', method: 'notifications/roots/list_changed' })
  t.equal(posts(up.requests, 'notifications/roots/list_changed').length, 1)
})

t.test('resume an existing backend session without initialize (failover); listen: false; detach()', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const a = await open(t, { config: httpConfig(up.url) })
  await handshake(a.conn, a.inbox)
  const sid = await a.inbox.until(() => a.inbox.sessionIds[0], 'the session id')
  await a.inbox.until(() => up.requests.find(r => r.method === 'GET'), 'A\'s GET stream')
  const getsBefore = up.requests.filter(r => r.method === 'GET').length

  const b = await open(t, { config: httpConfig(up.url), backendSessionId: sid, protocolVersion: '2025-06-18', listen: false, initializeParams: initParams })
  t.equal(b.conn.listening, false)
  await b.conn.send(call(7, 'echo', { message: 'from b' }))
  t.equal(toolText(await b.inbox.result(7)), 'echo: from b')
  t.equal(posts(up.requests, 'initialize').length, 1, 'no second initialize')
  const bCall = posts(up.requests, 'tools/call')[0]
  t.equal(bCall?.headers['mcp-session-id'], sid)
  t.equal(bCall?.headers['mcp-protocol-version'], '2025-06-18', 'options.protocolVersion is sent')
  t.equal(up.requests.filter(r => r.method === 'GET').length, getsBefore, 'listen: false opened no GET stream')

  await b.conn.detach()
  t.notOk(up.requests.some(r => r.method === 'DELETE'), 'detach() leaves the backend session alive')
  t.ok(up.sessions.has(sid as string))
  await a.conn.send(call(8, 'echo', { message: 'still' }))
  t.equal(toolText(await a.inbox.result(8)), 'echo: still')
})

/**
 * A raw Streamable HTTP upstream that scripts its GET stream: `gets` says what the n-th GET
 * (0-based) gets. initialize -> session 's1'; notifications -> 202; requests -> never answered.
 */
async function scriptedGetUpstream (t: Test, gets: (n: number, res: import('node:http').ServerResponse) => void): Promise<{ url: string, seen: Recorded[] }> {
  const seen: Recorded[] = []
  let n = 0
  const http = await listen((request, res) => {
    void readBody(request).then(text => {
      const body = text === '' ? undefined : JSON.parse(text) as { id?: RequestId, method?: string }
      seen.push({ method: request.method ?? '', url: request.url ?? '', headers: request.headers, body })
      if (request.method === 'GET') { gets(n++, res); return }
      if (request.method === 'DELETE') { res.writeHead(200).end(); return }
      if (body?.method === 'initialize') {
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 's1' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'raw', version: '1' } } }))
        return
      }
      if (body?.id === undefined) res.writeHead(202).end()
    })
  })
  t.teardown(http.close)
  return { url: `${http.url}/mcp`, seen }
}

const note = (n: number): string => `data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/tools/list_changed', params: { n } })}\n\n`

t.test('sessions that forward no header share their base headers, and none leaks into another', async t => {
  const up = await scriptedGetUpstream(t, (_n, res) => { res.writeHead(405).end() })
  // One config and one tenant upstream object, as the supervisor hands every session of a server.
  const config = httpConfig(up.url, { headers: { 'X-Api-Key': 'backend-key' }, forwardHeaders: ['X-Trace-Id'] })
  const tenant = { headers: { 'X-Tenant': 't1' }, env: {} }
  const plain = await open(t, { config, upstream: tenant })
  const traced = await open(t, { config, upstream: tenant, forwardedHeaders: { 'X-Trace-Id': 'trace-1' } })
  const other = await open(t, { config, upstream: { headers: { 'X-Tenant': 't2' }, env: {} } })
  const again = await open(t, { config, upstream: tenant })
  await handshake(plain.conn, plain.inbox, 1)
  await handshake(traced.conn, traced.inbox, 2)
  await handshake(other.conn, other.inbox, 3)
  await handshake(again.conn, again.inbox, 4)
  const initOf = (id: number): Recorded | undefined => posts(up.seen, 'initialize').find(r => (r.body as { id?: unknown } | undefined)?.id === id)
  for (const [id, tenantName, trace] of [[1, 't1', undefined], [2, 't1', 'trace-1'], [3, 't2', undefined], [4, 't1', undefined]] as const) {
    const headers = initOf(id)?.headers
    t.equal(headers?.['x-api-key'], 'backend-key', `session ${id}: the server's header`)
    t.equal(headers?.['x-tenant'], tenantName, `session ${id}: its tenant's header`)
    t.equal(headers?.['x-trace-id'], trace, `session ${id}: only its own forwarded header`)
    t.notOk(headers?.['mcp-session-id'], `session ${id}: no session id on initialize (nothing left over from another session)`)
  }
})

t.test('the standalone GET stream reconnects after a drop with Last-Event-ID, honouring retry', async t => {
  const up = await scriptedGetUpstream(t, (n, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    if (n === 0) {
      res.write(`retry: 5\nid: g1\n${note(1)}`)
      setTimeout(() => res.socket?.destroy(), 20)
    } else {
      res.write(`id: g2\n${note(2)}`)
    }
  })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 1, baseDelayMs: 60_000, maxDelayMs: 60_000 } }) })
  await handshake(conn, inbox)
  await inbox.until(() => inbox.messages.find(m => 'params' in m && (m.params as { n?: number }).n === 2), 'the notification after the reconnect')
  const gets = up.seen.filter(r => r.method === 'GET')
  t.equal(gets.length, 2)
  t.notOk(gets[0]?.headers['last-event-id'], 'the first GET starts fresh')
  t.equal(gets[1]?.headers['last-event-id'], 'g1', 'the reconnect resumes after the last event')
  t.equal(gets[1]?.headers['mcp-session-id'], 's1')
  t.equal(inbox.exits.length, 0)
})

t.test('the GET stream cannot be re-established -> in-flight requests answered, then onExit', async t => {
  const up = await scriptedGetUpstream(t, (n, res) => {
    if (n === 0) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      setTimeout(() => res.socket?.destroy(), 50)
    } else {
      res.writeHead(500).end()
    }
  })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 10, maxDelayMs: 20 } }) })
  await conn.send(req(1, 'initialize', initParams))
  await inbox.result(1)
  await conn.send(call(2, 'never'))
  await conn.send(initialized)
  const exit = await inbox.until(() => inbox.exits[0], 'onExit')
  t.match(exit.reason, /HTTP 500; reconnect attempts exhausted/)
  t.equal((await inbox.error(2)).code, -32007, 'the request in flight was answered')
  t.equal(up.seen.filter(r => r.method === 'GET').length, 3, 'one stream, then two attempts')
  await t.rejects(conn.send(call(3, 'x')), { code: 'GW_ERR_BACKEND_UNAVAILABLE' })
})

t.test('a GET answered 405 stops listening without retries or an exit; startListening does not probe again', async t => {
  const up = await scriptedGetUpstream(t, (_n, res) => { res.writeHead(405).end() })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 1, maxDelayMs: 1 } }) })
  await handshake(conn, inbox)
  await inbox.until(() => up.seen.find(r => r.method === 'GET'), 'the GET')
  // A request sent after the GET was answered: once its POST arrived, a retry would have too.
  await conn.send(call(2, 'never'))
  await inbox.until(() => posts(up.seen, 'tools/call')[0], 'the call upstream')
  conn.startListening()
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(up.seen.filter(r => r.method === 'GET').length, 1, 'no retries')
  t.equal(inbox.exits.length, 0)
})

t.test('a GET answered 409 (a stale stream of a dead holder) is retried with backoff, then frees up', async t => {
  // The first two GETs find the stream taken; the third gets it.
  const up = await scriptedGetUpstream(t, (n, res) => {
    if (n < 2) { res.writeHead(409).end(); return }
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(': open\n\n')
  })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 5, baseDelayMs: 1, maxDelayMs: 5 } }) })
  await handshake(conn, inbox)
  await inbox.until(() => up.seen.filter(r => r.method === 'GET').length >= 3 ? true : undefined, 'the third GET')
  t.equal(inbox.exits.length, 0, 'a taken stream is not a dead backend')
})

t.test('a GET that stays 409 stops listening without ending the connection', async t => {
  const up = await scriptedGetUpstream(t, (_n, res) => { res.writeHead(409).end() })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 1, maxDelayMs: 1 } }) })
  await handshake(conn, inbox)
  await inbox.until(() => up.seen.filter(r => r.method === 'GET').length >= 3 ? true : undefined, 'one GET and two retries')
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(up.seen.filter(r => r.method === 'GET').length, 3, 'then it stops')
  t.equal(inbox.exits.length, 0, 'no exit: requests still work')
})

t.test('the GET stream finds the session gone (404) -> re-initialised and listening on the new one', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const { conn, inbox } = await open(t, { config: httpConfig(up.url) })
  await handshake(conn, inbox)
  const sid = await inbox.until(() => inbox.sessionIds[0], 'the session id')
  await inbox.until(() => up.requests.find(r => r.method === 'GET'), 'the GET stream')
  await up.dropSession(sid as string) // closes the GET stream server-side too
  const newSid = await inbox.until(() => inbox.sessionIds[1], 'a new session id')
  await inbox.until(() => up.requests.find(r => r.method === 'GET' && r.headers['mcp-session-id'] === newSid), 'a GET on the new session')
  t.equal(posts(up.requests, 'initialize').length, 2)
  t.equal(inbox.exits.length, 0)
  t.notOk(inbox.messages.some(m => 'id' in m && String(m.id).startsWith('gw-init-')))
})

t.test('a GET that finds a just re-initialised session gone again counts as a failure: one re-initialise, then backoff and an exit', async t => {
  const up = await scriptedGetUpstream(t, (_n, res) => { res.writeHead(404).end() })
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { reconnect: { maxAttempts: 2, baseDelayMs: 1, maxDelayMs: 5 } }) })
  await handshake(conn, inbox)
  const exit = await inbox.until(() => inbox.exits[0], 'the exit')
  t.match(exit.reason, /re-initialised; reconnect attempts exhausted/)
  t.equal(posts(up.seen, 'initialize').length, 2, 'the handshake and one re-initialise, not one per 404')
  // The first GET (404: re-initialise), the immediate GET on the new session, then the two attempts.
  t.equal(up.seen.filter(r => r.method === 'GET').length, 4)
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(posts(up.seen, 'initialize').length, 2, 'nothing more after the exit')
  t.equal(inbox.exits.length, 1)
})

t.test('404 on a notification re-initialises; 404 without initialize params ends the connection', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const a = await open(t, { config: httpConfig(up.url) })
  await handshake(a.conn, a.inbox)
  const sid = await a.inbox.until(() => a.inbox.sessionIds[0], 'the session id')
  await up.dropSession(sid as string)
  await a.conn.send({ jsonrpc: '2.0', method: 'notifications/roots/list_changed' })
  t.equal(posts(up.requests, 'initialize').length, 2, 'the notification re-initialised the session')
  t.equal(posts(up.requests, 'notifications/roots/list_changed').at(-1)?.headers['mcp-session-id'], a.inbox.sessionIds.at(-1), 'and was sent on the new one')

  const sid2 = a.inbox.sessionIds.at(-1) as string
  const b = await open(t, { config: httpConfig(up.url), backendSessionId: sid2, listen: false })
  await up.dropSession(sid2)
  await b.conn.send(call(1, 'echo', { message: 'x' }))
  const err = await b.inbox.error(1)
  t.equal(err.code, -32007)
  t.match(err.message, /expired/)
  const exit = await b.inbox.until(() => b.inbox.exits[0], 'onExit')
  t.match(exit.reason, /no initialize params/)
})

t.test('server-everything in streamableHttp mode: tools/call echo round trip', async t => {
  const require = createRequire(import.meta.url)
  const entry = require.resolve('@modelcontextprotocol/server-everything/dist/index.js')
  const port = await closedPort()
  const child = reap(spawn(process.execPath, [entry, 'streamableHttp'], { env: { ...process.env, PORT: String(port) }, stdio: ['ignore', 'ignore', 'pipe'] }))
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit')
      child.kill('SIGKILL')
      await exited
    }
  })
  let stderr = ''
  await new Promise<void>((resolve, reject) => {
    child.stderr.on('data', (chunk: Buffer) => {
      stderr += chunk.toString()
      if (stderr.includes('listening on port')) resolve()
    })
    child.on('exit', code => reject(new Error(`server-everything exited (${code}): ${stderr}`)))
  })
  const { conn, inbox } = await open(t, { config: httpConfig(`http://127.0.0.1:${port}/mcp`) })
  await handshake(conn, inbox)
  await inbox.until(() => inbox.sessionIds[0], 'the session id')
  await conn.send(call(2, 'echo', { message: 'everything' }))
  t.match(toolText(await inbox.result(2)), /everything/)
  await conn.close()
})

t.test('legacy HTTP+SSE upstream (SDK SSEServerTransport)', async t => {
  const up = await startLegacyUpstream()
  t.teardown(up.close)
  const { conn, inbox } = await open(t, {
    config: httpConfig(up.url, { transport: 'sse', headers: { 'x-api-key': 'legacy-key' } }),
    forwardedHeaders: { authorization: 'Bearer client-token' }
  })
  t.equal(conn.backendSessionId, null)
  const init = await handshake(conn, inbox)
  t.ok(init.serverInfo, 'initialize answered over the SSE stream')
  await conn.send(call(2, 'echo', { message: 'legacy' }))
  t.equal(toolText(await inbox.result(2)), 'echo: legacy')
  for (const r of up.requests) {
    t.notOk('authorization' in r.headers, `${r.method}: no client token upstream`)
    t.equal(r.headers['x-api-key'], 'legacy-key')
  }
  t.ok(up.requests.filter(r => r.method === 'POST').every(r => r.url.startsWith('/messages?sessionId=')), 'POSTs go to the endpoint the server named')

  // The SSE connection drops with a request in flight: it is lost (-32007), the gateway
  // reconnects, re-initialises the new legacy session, and later calls work.
  await conn.send(call(3, 'hang'))
  await inbox.until(() => posts(up.requests, 'tools/call').length === 2 ? true : undefined, 'the hang call upstream')
  const [firstStream] = [...up.streams.values()]
  firstStream?.destroy()
  const lost = await inbox.error(3)
  t.equal(lost.code, -32007)
  t.equal(lost.data.code, 'GW_ERR_BACKEND_UNAVAILABLE')
  await inbox.until(() => posts(up.requests, 'initialize').length === 2 ? true : undefined, 'the gateway\'s re-initialise')
  t.match(String((posts(up.requests, 'initialize')[1]?.body as JsonRpcRequest).id), /^gw-init-/)
  await conn.send(call(4, 'echo', { message: 'after drop' }))
  t.equal(toolText(await inbox.result(4)), 'echo: after drop')
  t.equal(posts(up.requests, 'notifications/initialized').length, 2)
  t.notOk(inbox.messages.some(m => 'id' in m && String(m.id).startsWith('gw-init-')), 'no gateway-minted response reached onMessage')
  t.equal(inbox.exits.length, 0)

  await conn.close()
  await inbox.until(() => up.streams.size === 0 ? true : undefined, 'the SSE stream closed by close()')
  await conn.close()
})

t.test('legacy: reconnect attempts exhausted -> in-flight requests answered, then onExit', async t => {
  const up = await startLegacyUpstream()
  t.teardown(up.close)
  const { conn, inbox } = await open(t, { config: httpConfig(up.url, { transport: 'sse', reconnect: { maxAttempts: 1, baseDelayMs: 10, maxDelayMs: 20 } }) })
  await handshake(conn, inbox)
  await conn.send(call(2, 'hang'))
  await inbox.until(() => posts(up.requests, 'tools/call').length === 1 ? true : undefined, 'the call upstream')
  await up.close()
  const exit = await inbox.until(() => inbox.exits[0], 'onExit')
  t.match(exit.reason, /reconnect attempts exhausted/)
  t.equal((await inbox.error(2)).code, -32007)
  const errorAt = inbox.messages.findIndex(m => 'id' in m && m.id === 2)
  t.ok(errorAt >= 0, 'the in-flight request was answered before onExit')
  await t.rejects(conn.send(call(3, 'echo', { message: 'x' })), { code: 'GW_ERR_BACKEND_UNAVAILABLE' })
  t.equal(inbox.exits.length, 1, 'onExit once')
})

t.test('legacy: an endpoint on another origin is refused', async t => {
  const http = await listen((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('event: endpoint\ndata: http://evil.example/messages\n\n')
  })
  t.teardown(http.close)
  const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/sse`, { transport: 'sse', reconnect: { maxAttempts: 0, baseDelayMs: 10, maxDelayMs: 10 } }) })
  await conn.send(req(1, 'initialize', initParams))
  t.equal((await inbox.error(1)).code, -32007, 'the queued request failed')
  await inbox.until(() => inbox.exits[0], 'onExit')
})

t.test('failures', async t => {
  t.test('connection refused -> -32007 at once', async t => {
    const port = await closedPort()
    const { conn, inbox } = await open(t, { config: httpConfig(`http://127.0.0.1:${port}/mcp`) })
    await conn.send(req(1, 'initialize', initParams))
    const err = await inbox.error(1)
    t.equal(err.code, -32007)
    t.match(err.data, { source: 'gateway', code: 'GW_ERR_BACKEND_UNAVAILABLE' })
    t.match(err.message, /ECONNREFUSED/)
    await t.rejects(conn.send(initialized), { code: 'GW_ERR_BACKEND_UNAVAILABLE' }, 'a notification rejects')
    t.equal(inbox.exits.length, 0)
  })

  t.test('socket reset after the first SSE event (with an id) -> resumed with GET + Last-Event-ID', async t => {
    const seen: Recorded[] = []
    const http = await listen((request, res) => {
      void (async () => {
        const text = request.method === 'POST' ? await readBody(request) : ''
        seen.push({ method: request.method ?? '', url: request.url ?? '', headers: request.headers, body: text === '' ? undefined : JSON.parse(text) })
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        if (request.method === 'POST') {
          res.write('id: ev-1\nretry: 10\ndata: \n\n')
          setTimeout(() => res.socket?.destroy(), 20)
        } else {
          res.end(`id: ev-2\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: 1, result: { resumed: true } })}\n\n`)
        }
      })()
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`) })
    await conn.send(call(1, 'x'))
    t.same(await inbox.result(1), { resumed: true })
    const get = seen.find(r => r.method === 'GET')
    t.equal(get?.headers['last-event-id'], 'ev-1', 'resumed from the last event id')
    t.equal(get?.headers.accept, 'text/event-stream')
  })

  t.test('socket reset after the first SSE event (no id) -> the event, then -32007', async t => {
    const http = await listen((request, res) => {
      void readBody(request).then(() => {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 't', progress: 1 } })}\n\n`)
        setTimeout(() => res.socket?.destroy(), 20)
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`) })
    await conn.send(call(1, 'x'))
    const err = await inbox.error(1)
    t.equal(err.code, -32007)
    t.ok(inbox.messages.some(m => 'method' in m && m.method === 'notifications/progress'), 'the event before the reset was delivered')
  })

  t.test('5xx -> -32007 with the status', async t => {
    const http = await listen((request, res) => {
      void readBody(request).then(() => res.writeHead(503, { 'content-type': 'text/plain' }).end('overloaded'))
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`) })
    await conn.send(call(1, 'x'))
    const err = await inbox.error(1)
    t.equal(err.code, -32007)
    t.equal(err.data.status, 503)
    t.match(err.message, /HTTP 503/)
    await t.rejects(conn.send({ jsonrpc: '2.0', id: 'srv-1', result: {} }), { code: 'GW_ERR_BACKEND_UNAVAILABLE', message: /HTTP 503/ }, 'a response POST answered 503 rejects')
  })

  t.test('slow upstream -> -32006 and notifications/cancelled upstream', async t => {
    const seen: unknown[] = []
    const http = await listen((request, res) => {
      void readBody(request).then(text => {
        const body = JSON.parse(text) as { id?: unknown }
        seen.push(body)
        if (body.id === undefined) res.writeHead(202).end()
        // requests: never answered
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`, { requestTimeoutMs: 300 }) })
    await conn.send(call(9, 'slow'))
    const err = await inbox.error(9)
    t.equal(err.code, -32006)
    t.equal(err.data.code, 'GW_ERR_BACKEND_TIMEOUT')
    const cancelled = await inbox.until(() => seen.find(m => (m as { method?: string }).method === 'notifications/cancelled'), 'notifications/cancelled upstream')
    t.match(cancelled, { params: { requestId: 9 } })
    t.equal(inbox.messages.filter(m => 'id' in m && m.id === 9).length, 1, 'exactly one answer')
  })

  t.test('a request the client cancelled gets no timeout error later', async t => {
    const seen: unknown[] = []
    const http = await listen((request, res) => {
      void readBody(request).then(text => {
        const body = JSON.parse(text) as { id?: unknown }
        seen.push(body)
        if (body.id === undefined) res.writeHead(202).end()
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`, { requestTimeoutMs: 300 }) })
    await conn.send(call(10, 'slow'))
    await conn.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 10, reason: 'user' } })
    await conn.send(call(11, 'slow'))
    // 11's deadline started after 10's: once 11 timed out, 10 would have too had it been kept.
    t.equal((await inbox.error(11)).code, -32006)
    t.notOk(inbox.messages.some(m => 'id' in m && m.id === 10), 'nothing delivered for the cancelled request')
    t.match(seen.find(m => (m as { method?: string }).method === 'notifications/cancelled'), { params: { requestId: 10, reason: 'user' } }, 'the client\'s cancel went upstream')
  })

  t.test('garbage bodies -> -32007', async t => {
    const http = await listen((request, res) => {
      void readBody(request).then(text => {
        const body = JSON.parse(text) as { id: number }
        if (body.id === 1) res.writeHead(200, { 'content-type': 'application/json' }).end('this is not json')
        else if (body.id === 2) res.writeHead(200, { 'content-type': 'application/json' }).end('{"hello":"world"}')
        else if (body.id === 3) res.writeHead(200, { 'content-type': 'text/event-stream' }).end('data: {nope\n\n')
        else res.writeHead(200, { 'content-type': 'text/html' }).end('<html></html>')
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`) })
    for (const id of [1, 2, 3, 4]) await conn.send(call(id, 'x'))
    for (const id of [1, 2, 3, 4]) {
      const err = await inbox.error(id)
      t.equal(err.code, -32007, `garbage ${id}`)
      t.equal(err.data.status, 200)
    }
    t.match((await inbox.error(1)).message, /not JSON/)
    t.match((await inbox.error(2)).message, /not JSON-RPC/)
  })

  t.test('close() while a request hangs resolves promptly; DELETE answered 405 is fine', async t => {
    const methods: string[] = []
    const http = await listen((request, res) => {
      methods.push(request.method ?? '')
      void readBody(request).then(text => {
        if (request.method === 'DELETE') { res.writeHead(405).end(); return }
        const body = JSON.parse(text) as { method: string }
        if (body.method === 'initialize') {
          res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'abc' })
          res.end(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'raw', version: '1' } } }))
          return
        }
        res.writeHead(200, { 'content-type': 'text/event-stream' }) // and nothing more
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`), listen: false })
    await conn.send(req(1, 'initialize', initParams))
    await inbox.result(1)
    t.same(inbox.sessionIds, ['abc'])
    await conn.send(call(2, 'x'))
    await inbox.until(() => methods.length === 2 ? true : undefined, 'the call upstream')
    await conn.close()
    t.same(methods, ['POST', 'POST', 'DELETE'])
    t.notOk(inbox.messages.some(m => 'id' in m && m.id === 2), 'nothing delivered after close()')
  })

  t.test('close() ends every upstream exchange: a request in flight, and an answered one whose stream lingers', async t => {
    const closed: number[] = []
    const http = await listen((request, res) => {
      void readBody(request).then(text => {
        if (request.method === 'DELETE') { res.writeHead(405).end(); return }
        const body = JSON.parse(text) as { id: number, method: string }
        if (body.method === 'initialize') {
          res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'abc' })
          res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'raw', version: '1' } } }))
          return
        }
        res.on('close', () => { closed.push(body.id) })
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        // Call 3 is answered, and its stream stays open (it lingers); call 2 never is.
        if (body.id === 3) res.write(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: 3, result: {} })}\n\n`)
      })
    })
    t.teardown(http.close)
    const { conn, inbox } = await open(t, { config: httpConfig(`${http.url}/mcp`), listen: false })
    await conn.send(req(1, 'initialize', initParams))
    await inbox.result(1)
    await conn.send(call(2, 'x'))
    await conn.send(call(3, 'y'))
    await inbox.result(3)
    const started = Date.now()
    await conn.close()
    await inbox.until(() => closed.length === 2 ? true : undefined, 'both upstream exchanges to end')
    t.same([...closed].sort(), [2, 3], 'both ended')
    t.ok(Date.now() - started < 2000, 'at close, not when the linger timer would have (5 s)')
  })

  t.test('the factory refuses a stdio config', async t => {
    await t.rejects(httpBackendFactory({ server: 'x', sid: 's', log: silent, handlers: new Inbox().handlers, config: { transport: 'stdio', command: 'x', args: [], env: {}, inheritEnv: [], maxSessions: 1, requestTimeoutMs: 1, maxLineBytes: 1024, stopGraceMs: 0, restart: { maxRestarts: 0, windowMs: 1000, baseDelayMs: 0, maxDelayMs: 0 } } }),
      { code: 'GW_ERR_CONFIG_INVALID' } satisfies Partial<GatewayError>)
  })
})
