// The bridge that serves a 2025-era session against a modern (2026-07-28) backend
// (src/backends/modern-session.ts), opened through openHttpBackend against the v2 SDK's
// modern-only server (test/fixtures/modern-upstream.ts) on 127.0.0.1: which configs reach it, and
// the deadline of each bridged request (an answer that never ends, a round the client never answers).
import type { ServerResponse } from 'node:http'
import t, { type Test } from 'tap'
import { pino } from 'pino'
import { closeHttpDispatchers, openHttpBackend, type HttpBackendConnection } from '../../src/backends/http.js'
import { parseConfig } from '../../src/config/load.js'
import type { HttpServerConfig } from '../../src/config/schema.js'
import type { JsonRpcMessage } from '../../src/core/jsonrpc.js'
import { sseEvent, startRawUpstream } from '../fixtures/http-upstreams.js'
import { startModernUpstream, type ModernUpstream } from '../fixtures/modern-upstream.js'
import { callTool, Inbox, initializeParams, request, waitUntil } from './stdio-helpers.js'

t.teardown(closeHttpDispatchers)

const silent = pino({ level: process.env.TEST_LOG ?? 'silent' })

/** A server entry as the gateway's loader makes it: the schema's defaults applied. */
function serverConfig (raw: Record<string, unknown>): HttpServerConfig {
  return parseConfig({ servers: { up: { transport: 'streamable-http', ...raw } } }).servers.up as HttpServerConfig
}

async function modernOnly (t: Test): Promise<ModernUpstream> {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  return upstream
}

/** Opens a session's backend connection and sends the client's initialize; resolves with its answer. */
async function initialize (t: Test, config: HttpServerConfig): Promise<{ conn: HttpBackendConnection, inbox: Inbox, answer: JsonRpcMessage }> {
  const inbox = new Inbox()
  const conn = await openHttpBackend({ server: 'up', sid: 'client-session', log: silent, config, handlers: { onMessage: inbox.push, onExit: () => {}, onBackendSessionId: () => {} } })
  t.teardown(async () => await conn.close())
  await conn.send(request(1, 'initialize', { ...initializeParams, capabilities: { elicitation: {} } }))
  return { conn, inbox, answer: await inbox.response(1) }
}

/** A raw modern upstream's answer to server/discover; true when it was that request. */
function discovered (request: { id?: unknown, method: string }, res: ServerResponse): boolean {
  if (request.method !== 'server/discover') return false
  res.writeHead(200, { 'content-type': 'application/json' })
  res.end(JSON.stringify({ jsonrpc: '2.0', id: request.id, result: { resultType: 'complete', supportedVersions: ['2026-07-28'], capabilities: { resources: {} } } }))
  return true
}

const methodsSent = (upstream: ModernUpstream): unknown[] => upstream.requests.map(r => (r.body as { method?: unknown } | undefined)?.method)

t.test('no protocol setting means what the schema default means (auto): the era is probed, a modern-only server bridged', async t => {
  const upstream = await modernOnly(t)
  const withDefault = serverConfig({ url: upstream.url })
  t.equal(withDefault.protocol, 'auto', "the schema's default")
  const { protocol: _, ...unset } = withDefault
  const { answer } = await initialize(t, unset)
  t.match(answer, { id: 1, result: { serverInfo: { name: 'modern-upstream' } } }, "initialize answered from the backend's server/discover")
  t.notOk(methodsSent(upstream).includes('initialize'), 'no 2025 initialize went to the modern-only server')
})

t.test('a bridged request whose upstream SSE answer never ends: -32006 at the deadline, the upstream request closed', async t => {
  const closed: string[] = []
  const upstream = await startRawUpstream((request, res) => {
    if (discovered(request, res)) return
    // The answer starts (headers and a progress notification) and never ends.
    res.on('close', () => { closed.push(request.method) })
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(sseEvent({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 'p', progress: 1 } }))
  })
  t.teardown(upstream.close)
  const { conn, inbox } = await initialize(t, serverConfig({ url: upstream.url, protocol: 'modern', requestTimeoutMs: 1000 }))
  const started = Date.now()
  await conn.send(request(2, 'resources/read', { uri: 'test://endless' }))
  await inbox.wait(m => 'method' in m && m.method === 'notifications/progress', 'the answer to start streaming')
  t.match(await inbox.response(2), { id: 2, error: { code: -32006, data: { code: 'GW_ERR_BACKEND_TIMEOUT' } } }, "answered with the gateway's timeout error")
  // Timers count from the loop's cached time, which can be a little behind Date.now().
  t.ok(Date.now() - started >= 950, 'at the deadline, not before')
  await waitUntil(() => closed.includes('resources/read'), 'the upstream request to be closed')
  t.pass('the upstream request (its undici body) was released')
})

t.test('a round the client never answers: -32006 at the deadline, the question withdrawn, a late answer goes nowhere', async t => {
  const upstream = await modernOnly(t)
  const { conn, inbox } = await initialize(t, serverConfig({ url: upstream.url, protocol: 'modern', requestTimeoutMs: 1000 }))
  await conn.send(callTool(3, 'confirm'))
  const question = await inbox.wait(m => 'method' in m && m.method === 'elicitation/create', "the round's question")
  const id = (question as { id: string }).id
  t.match(await inbox.response(3), { id: 3, error: { code: -32006 } }, 'the call is answered at the deadline')
  const withdrawn = inbox.messages.findIndex(m => 'method' in m && m.method === 'notifications/cancelled' && (m.params as { requestId?: unknown }).requestId === id)
  t.ok(withdrawn !== -1 && withdrawn < inbox.messages.findIndex(m => 'id' in m && m.id === 3), 'the question was withdrawn (notifications/cancelled) before the answer')
  // A late answer goes nowhere: the question is forgotten (the withdrawal above is what can fail;
  // the request's aborted signal alone would keep undici from sending a retry).
  await conn.send({ jsonrpc: '2.0', id, result: { action: 'accept', content: { ok: true } } })
  await new Promise(resolve => setTimeout(resolve, 200))
  t.equal(inbox.messages.filter(m => 'id' in m && m.id === 3 && !('method' in m)).length, 1, 'and the call keeps its one answer')
})

t.test('a backend that keeps its SSE stream open after the final response: answered at once, the stream released', async t => {
  const closed: string[] = []
  const upstream = await startRawUpstream((request, res) => {
    if (discovered(request, res)) return
    res.on('close', () => { closed.push(request.method) })
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(sseEvent({ jsonrpc: '2.0', id: request.id, result: { resultType: 'complete', contents: [{ uri: 'test://open', text: 'here' }] } }))
  })
  t.teardown(upstream.close)
  const { conn, inbox } = await initialize(t, serverConfig({ url: upstream.url, protocol: 'modern', requestTimeoutMs: 5000 }))
  const started = Date.now()
  await conn.send(request(2, 'resources/read', { uri: 'test://open' }))
  t.match(await inbox.response(2), { id: 2, result: { contents: [{ text: 'here' }] } }, 'the final response is the answer')
  t.ok(Date.now() - started < 2500, 'long before the deadline')
  await waitUntil(() => closed.includes('resources/read'), 'the upstream request to be closed')
  t.pass('the stream the backend kept open was released')
})
