// MCP 2026-07-28 through the gateway (docs/behaviour.md): the v2 SDK client pinned to the modern
// revision, and in `auto` mode, next to the v1 SDK client on the same URL, in front of a legacy
// stdio backend (the full-server fixture, a real child) and a legacy Streamable HTTP backend (the
// v1 SDK's server), over real sockets. Raw HTTP checks what a client library would hide: JSON vs
// SSE, the 400/404 statuses, MRTR state handling, cancellation on close. Several replicas:
// test/integration/modern-replicas.test.ts.
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as TransportV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { CreateMessageResultSchema, type CreateMessageRequest } from '@modelcontextprotocol/sdk/types.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'
import { MemoryBusHub } from '../../src/state/bus-memory.js'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'
import { MAX_PARKED_PER_PRINCIPAL } from '../../src/http/modern.js'
import { envelope, last, MODERN_VERSION, modernFetch, modernPost, resultOf, type Answer } from '../helpers/modern.js'

const V = MODERN_VERSION

async function modernClient (t: Test, url: string, mode: 'pin' | 'auto' = 'pin'): Promise<ClientV2> {
  const client = new ClientV2({ name: 'modern-test', version: '1' }, {
    capabilities: { sampling: {}, elicitation: { form: {} }, roots: {} },
    versionNegotiation: { mode: mode === 'pin' ? { pin: V } : 'auto' }
  })
  client.setRequestHandler('sampling/createMessage', async request => {
    const first = request.params.messages[0]?.content
    const said = first !== undefined && !Array.isArray(first) && first.type === 'text' ? first.text : '?'
    return { role: 'assistant', model: 'test-model', content: { type: 'text', text: `model says: ${said}` } }
  })
  client.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { answer: 'forty-two' } }))
  client.setRequestHandler('roots/list', async () => ({ roots: [{ uri: 'file:///tmp/modern-root', name: 'root' }] }))
  await client.connect(new TransportV2(new URL(url)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

t.test('stdio backend: the v2 client pinned to 2026-07-28 and the v1 client, on one URL at once', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const modern = await modernClient(t, url)
  t.equal(modern.getProtocolEra(), 'modern', 'the v2 client speaks 2026-07-28 to the gateway')
  const legacy = new ClientV1({ name: 'legacy-test', version: '1' })
  await legacy.connect(new TransportV1(new URL(url)))
  t.teardown(async () => { await legacy.close().catch(() => {}) })

  const [m, l] = await Promise.all([
    modern.callTool({ name: 'echo', arguments: { text: 'from 2026' } }),
    legacy.callTool({ name: 'echo', arguments: { text: 'from 2025' } })
  ])
  t.equal(textOf(m), 'from 2026', 'modern call answered')
  t.equal(textOf(l), 'from 2025', 'legacy session call answered')
  const tools = await modern.listTools()
  t.ok(tools.tools.some(tool => tool.name === 'echo'), 'tools/list through the pool')

  const progress: number[] = []
  const done = await modern.callTool({ name: 'progress', arguments: { steps: 3, delayMs: 5 } }, { onprogress: p => { progress.push(p.progress) } })
  t.match(textOf(done), /^done 3 steps$/, 'the backend saw a progress token')
  t.same(progress, [1, 2, 3], 'progress reached the request that carried the token')

  // Mid-call server-to-client requests become input_required rounds; the client library answers
  // them and retries, and the backend's call completes with the answers.
  t.equal(textOf(await modern.callTool({ name: 'sample', arguments: { prompt: 'hello' } })), 'model says: hello', 'sampling bridged')
  t.match(textOf(await modern.callTool({ name: 'elicit', arguments: { message: 'question?' } })), /"action":"accept".*forty-two/, 'elicitation bridged')
  t.match(textOf(await modern.callTool({ name: 'roots', arguments: {} })), /modern-root/, 'roots bridged')
})

t.test('auto mode probes server/discover and stays modern; discover states the backend as a modern server', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const client = await modernClient(t, url, 'auto')
  t.equal(client.getProtocolEra(), 'modern')
  t.equal(client.getServerVersion()?.name, 'full-server', 'serverInfo from the backend')
  const a = await modernPost(url, 'server/discover', { _meta: envelope() })
  const b = await modernPost(url, 'server/discover', { _meta: envelope() })
  t.equal(a.status, 200)
  t.same(resultOf(a).supportedVersions, [V])
  t.match(resultOf(a), { resultType: 'complete', ttlMs: Number, cacheScope: 'private', capabilities: { tools: {} }, _meta: { 'io.modelcontextprotocol/serverInfo': { name: 'full-server' } } })
  t.same(resultOf(a), resultOf(b), 'the same answer each time')
})

t.test('raw wire: statuses, JSON or SSE, logs only when asked, no session id', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const plain = await modernPost(url, 'tools/call', { name: 'echo', arguments: { text: 'x' }, _meta: envelope() })
  t.equal(plain.status, 200)
  t.match(plain.contentType, /application\/json/, 'an answer with nothing before it is one JSON body')
  t.match(resultOf(plain), { resultType: 'complete', content: [{ text: 'x' }] })

  const quiet = await modernPost(url, 'tools/call', { name: 'log', arguments: { count: 2, level: 'error' }, _meta: envelope() })
  t.notOk(quiet.messages.some(m => m.method === 'notifications/message'), 'no log line without logLevel')
  const loud = await modernPost(url, 'tools/call', { name: 'log', arguments: { count: 2, level: 'error' }, _meta: envelope({}, { 'io.modelcontextprotocol/logLevel': 'warning' }) })
  t.match(loud.contentType, /text\/event-stream/, 'a log line first: SSE')
  t.equal(loud.messages.filter(m => m.method === 'notifications/message').length, 2, 'log lines at or above the asked level')
  const above = await modernPost(url, 'tools/call', { name: 'log', arguments: { count: 2, level: 'info' }, _meta: envelope({}, { 'io.modelcontextprotocol/logLevel': 'warning' }) })
  t.notOk(above.messages.some(m => m.method === 'notifications/message'), 'lines below the asked level are dropped')

  const ping = await modernPost(url, 'ping', { _meta: envelope() }, 9)
  t.equal(ping.status, 404)
  t.match(last(ping), { id: 9, error: { code: -32601 } })
  const unknown = await modernPost(url, 'no/such/method', { _meta: envelope() }, 10)
  t.equal(unknown.status, 404, "the backend's -32601 is a 404 in this era")
  t.match(last(unknown), { id: 10, error: { code: -32601 } })
  const mismatch = await modernPost(url, 'tools/list', { _meta: envelope() }, 11, { 'mcp-method': 'tools/call' })
  t.equal(mismatch.status, 400)
  t.match(last(mismatch), { id: 11, error: { code: -32020 } })
  const old = await modernPost(url, 'tools/list', { _meta: envelope({}, { 'io.modelcontextprotocol/protocolVersion': '2030-01-01' }) }, 12, { 'mcp-protocol-version': '2030-01-01' })
  t.equal(old.status, 400)
  t.match(last(old), { id: 12, error: { code: -32022, data: { supported: [V], requested: '2030-01-01' } } })
  const notification = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': V }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1 } }) })
  t.equal(notification.status, 202, 'a modern notification is accepted and ignored')
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': V, 'mcp-method': 'tools/list' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { _meta: envelope() } }) })
  t.equal(res.headers.get('mcp-session-id'), null, 'no session id is minted for a modern request')
  await res.text()
})

t.test('MRTR by hand: input_required, the retry completes the call, state is single use and tamper-proof, undeclared capability is -32021', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const params = { name: 'sample', arguments: { prompt: 'round one' } }
  const refused = await modernPost(url, 'tools/call', { ...params, _meta: envelope() }, 1)
  t.equal(refused.status, 400, 'sampling not declared: 400')
  t.match(last(refused), { id: 1, error: { code: -32021, data: { requiredCapabilities: { sampling: {} } } } })

  const first = await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }) }, 2)
  t.equal(first.status, 200)
  const round = resultOf(first)
  t.equal(round.resultType, 'input_required')
  t.type(round.requestState, 'string')
  const keys = Object.keys(round.inputRequests as Record<string, unknown>)
  t.equal(keys.length, 1, 'one input request')
  const key = keys[0] as string
  t.match((round.inputRequests as Record<string, unknown>)[key], { method: 'sampling/createMessage', params: { messages: [{ content: { text: 'round one' } }] } })

  const state = round.requestState as string
  const tampered = await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }), requestState: `${state.slice(0, -3)}AAA`, inputResponses: {} }, 3)
  t.equal(tampered.status, 400, 'a tampered state is refused')
  t.match(last(tampered), { id: 3, error: { code: -32602 } })

  const answer = { role: 'assistant', model: 'm', content: { type: 'text', text: 'answered by hand' } }
  const second = await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }), requestState: state, inputResponses: { [key]: answer } }, 4)
  t.equal(second.status, 200)
  t.match(resultOf(second), { resultType: 'complete', content: [{ text: 'answered by hand' }] }, 'the parked call completed with the answer')
  const replay = await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }), requestState: state, inputResponses: { [key]: answer } }, 5)
  t.equal(replay.status, 400, 'a used state is refused')
  t.match(last(replay), { id: 5, error: { code: -32602 } })

  // A retry that leaves the input unanswered is asked again, with a fresh state.
  const again = resultOf(await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }) }, 6))
  const missing = await modernPost(url, 'tools/call', { ...params, _meta: envelope({ sampling: {} }), requestState: again.requestState, inputResponses: {} }, 7)
  t.match(resultOf(missing), { resultType: 'input_required', inputRequests: Object.fromEntries(Object.keys(again.inputRequests as object).map(k => [k, { method: 'sampling/createMessage' }])) }, 'the unanswered input is asked again')
  t.not(resultOf(missing).requestState, again.requestState, 'with a new state')
})

t.test('closing the response cancels the call upstream', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { poolSize: 1 }) } })
  const url = `${gw.url}/mcp/full`
  // A warm pool: the slow call is delivered at once, not after a child starts.
  t.match(resultOf(await modernPost(url, 'tools/call', { name: 'echo', arguments: { text: 'warm' }, _meta: envelope() })), { content: [{ text: 'warm' }] })
  const abort = new AbortController()
  const pending = fetch(url, {
    method: 'POST',
    signal: abort.signal,
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': V, 'mcp-method': 'tools/call', 'mcp-name': 'slow' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'slow', arguments: { ms: 10_000 }, _meta: envelope() } })
  }).catch(() => null)
  await new Promise(resolve => setTimeout(resolve, 300))
  abort.abort()
  await pending
  const seen = await eventually('the backend saw the cancellation', async () => {
    const r = resultOf(await modernPost(url, 'tools/call', { name: 'cancelled-requests', arguments: {}, _meta: envelope() }))
    const ids = JSON.parse(textOf(r)) as unknown[]
    return ids.length > 0 ? ids : undefined
  })
  t.equal(seen.length, 1, 'the one pooled child was told, once')
})

t.test('subscriptions/listen: acknowledgement first, then list_changed tagged with the subscription id', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { poolSize: 1 }) } })
  const url = `${gw.url}/mcp/full`
  const client = await modernClient(t, url)
  const changed: unknown[] = []
  client.setNotificationHandler('notifications/tools/list_changed', n => { changed.push(n) })
  const subscription = await client.listen({ toolsListChanged: true, promptsListChanged: true })
  t.match(subscription.honoredFilter, { toolsListChanged: true, promptsListChanged: true })
  await client.callTool({ name: 'add-tool', arguments: {} })
  await eventually('tools/list_changed on the listen stream', () => changed.length > 0 ? true : undefined)
  await subscription.close()
  t.equal(await subscription.closed, 'local')

  // resourceSubscriptions: subscribed upstream while the stream lasts.
  const updated: Array<{ params: { uri: string } }> = []
  client.setNotificationHandler('notifications/resources/updated', n => { updated.push(n as { params: { uri: string } }) })
  const resources = await client.listen({ resourceSubscriptions: ['test://counter'] })
  t.same(resources.honoredFilter, { resourceSubscriptions: ['test://counter'] }, 'the subscription is acknowledged')
  await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://other' } })
  await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } })
  await eventually('resources/updated on the listen stream', () => updated.length > 0 ? true : undefined)
  t.same(updated.map(n => n.params.uri), ['test://counter'], 'only the subscribed resource')
  await resources.close()
})

t.test('Streamable HTTP backend: modern requests run on a pooled backend session', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { remote: { transport: 'streamable-http', url: upstream.url, poolSize: 2 } } })
  const url = `${gw.url}/mcp/remote`
  const client = await modernClient(t, url)
  const auto = await modernClient(t, url, 'auto')
  t.equal(auto.getProtocolEra(), 'modern', 'auto mode finds the modern face in front of an HTTP backend')
  const legacy = new ClientV1({ name: 'legacy-http', version: '1' })
  await legacy.connect(new TransportV1(new URL(url)))
  t.teardown(async () => { await legacy.close().catch(() => {}) })
  const [a, l] = await Promise.all([auto.callTool({ name: 'echo', arguments: { message: 'auto' } }), legacy.callTool({ name: 'echo', arguments: { message: 'v1' } })])
  t.equal(textOf(a), 'echo: auto')
  t.equal(textOf(l), 'echo: v1', 'a v1 session on the same URL at once')
  const answers = await Promise.all([1, 2, 3, 4, 5].map(async i => await client.callTool({ name: 'echo', arguments: { message: `m${i}` } })))
  t.same(answers.map(textOf), [1, 2, 3, 4, 5].map(i => `echo: m${i}`), 'every call answered with its own result')
  const opened = upstream.sessions.size
  t.ok(opened >= 1 && opened <= 8, `one backend session per concurrent call at most, plus the v1 session (${opened})`)
  for (let i = 0; i < 5; i++) await client.callTool({ name: 'echo', arguments: { message: 'again' } })
  t.equal(upstream.sessions.size, opened, 'sequential calls reuse the pooled sessions: no session per request')
  t.equal(textOf(await client.callTool({ name: 'ask-sampling', arguments: {} })), 'sampled: model says: say something', 'sampling bridged from an HTTP backend')
})

t.test('http.keepAliveMs paces the SSE keep-alives of a streamed answer and of a listen stream', async t => {
  const gw = await startGateway(t, { http: { keepAliveMs: 1000 }, servers: { full: stdioFixture('full-server', [], { poolSize: 1 }) } })
  const url = `${gw.url}/mcp/full`
  /** The raw text of a streamed response, read for `ms` (comments included), then the stream is closed. */
  const streamed = async (method: string, params: Record<string, unknown>, ms: number): Promise<string> => {
    const abort = new AbortController()
    const res = await modernFetch(url, method, params, 1, {}, abort.signal)
    t.match(res.headers.get('content-type'), /^text\/event-stream/, `${method} streams`)
    const timer = setTimeout(() => { abort.abort() }, ms)
    let text = ''
    try {
      for await (const chunk of res.body ?? []) text += Buffer.from(chunk as Uint8Array).toString()
    } catch {} finally { clearTimeout(timer) }
    return text
  }
  // The first progress step makes the answer a stream; the next step comes 2.5 s later.
  const call = streamed('tools/call', { name: 'progress', arguments: { steps: 2, delayMs: 2500 }, _meta: envelope({}, { progressToken: 'p' }) }, 2000)
  const listen = streamed('subscriptions/listen', { notifications: { toolsListChanged: true }, _meta: envelope() }, 2000)
  t.match(await call, /^: keepalive$/m, 'a keep-alive on the answer stream within 2 s (the default would wait 15 s)')
  t.match(await listen, /^: keepalive$/m, 'and on the listen stream')
})

t.test('one caller may not park more than its share of calls: 429 with Retry-After, the others still served', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { remote: { transport: 'streamable-http', url: upstream.url, protocol: 'legacy' } } })
  const url = `${gw.url}/mcp/remote`
  const ask = async (id: number): Promise<Answer> => await modernPost(url, 'tools/call', { name: 'ask-sampling', arguments: {}, _meta: envelope({ sampling: {} }) }, id)
  const rounds = await Promise.all(Array.from({ length: MAX_PARKED_PER_PRINCIPAL }, async (_, i) => await ask(i + 1)))
  t.ok(rounds.every(r => resultOf(r).resultType === 'input_required'), `${MAX_PARKED_PER_PRINCIPAL} calls parked`)
  const over = await ask(100)
  t.equal(over.status, 429, 'one more is refused')
  t.ok(Number(over.headers.get('retry-after')) > 0, 'with Retry-After')
  t.match(last(over), { id: 100, error: { code: -32000 } })
  const first = resultOf(rounds[0] as Answer)
  const key = Object.keys(first.inputRequests as object)[0] as string
  const done = await modernPost(url, 'tools/call', { name: 'ask-sampling', arguments: {}, _meta: envelope({ sampling: {} }), requestState: first.requestState, inputResponses: { [key]: { role: 'assistant', model: 'm', content: { type: 'text', text: 'ok' } } } }, 101)
  t.equal(textOf(resultOf(done)), 'sampled: ok', 'a parked call still completes')
})

t.test('a retry forwarded to the replica holding its call, refused there at the parked-call cap: 429 with its Retry-After', async t => {
  // The tool asks twice; its second ask waits until the test has filled the cap again.
  let firstAnswered = (): void => {}
  const answered = new Promise<void>(resolve => { firstAnswered = resolve })
  let openGate = (): void => {}
  const gate = new Promise<void>(resolve => { openGate = resolve })
  const ask = (text: string): CreateMessageRequest =>
    ({ method: 'sampling/createMessage', params: { messages: [{ role: 'user', content: { type: 'text', text } }], maxTokens: 10 } })
  const upstream = await startStreamableUpstream({
    tools: mcp => mcp.registerTool('ask-twice', { description: 'Asks the client to sample twice' }, async extra => {
      await extra.sendRequest(ask('first'), CreateMessageResultSchema)
      firstAnswered()
      await gate
      await extra.sendRequest(ask('second'), CreateMessageResultSchema)
      return { content: [{ type: 'text', text: 'asked twice' }] }
    })
  })
  t.teardown(upstream.close)
  // Two replicas in this process, on one in-process bus and one memory store.
  const store = new MemorySessionStore()
  const memory = { store, eventLog: new MemoryEventLog(store, 1000) }
  const hub = new MemoryBusHub()
  const servers = { servers: { remote: { transport: 'streamable-http', url: upstream.url, protocol: 'legacy' } } }
  const a = await startGateway(t, servers, { replicaId: 'A', hub, memory })
  const b = await startGateway(t, servers, { replicaId: 'B', hub, memory })
  t.teardown(async () => { await store.close() })
  const call = async (base: string, tool: string, id: number, retry: Record<string, unknown> = {}): Promise<Answer> =>
    await modernPost(`${base}/mcp/remote`, 'tools/call', { name: tool, arguments: {}, _meta: envelope({ sampling: {} }), ...retry }, id)
  const sampled = { role: 'assistant', model: 'm', content: { type: 'text', text: 'ok' } }

  const first = resultOf(await call(a.url, 'ask-twice', 1))
  t.equal(first.resultType, 'input_required', 'the call is parked on A')
  const others = await Promise.all(Array.from({ length: MAX_PARKED_PER_PRINCIPAL - 1 }, async (_, i) => await call(a.url, 'ask-sampling', 10 + i)))
  t.ok(others.every(r => resultOf(r).resultType === 'input_required'), 'A holds the cap of parked calls')
  const key = Object.keys(first.inputRequests as object)[0] as string
  // The retry lands on B and goes to A, which takes the call back (one slot frees) and answers the backend.
  const retry = call(b.url, 'ask-twice', 2, { requestState: first.requestState, inputResponses: { [key]: sampled } })
  await answered
  t.equal(resultOf(await call(a.url, 'ask-sampling', 100)).resultType, 'input_required', 'the freed slot is taken again')
  openGate()
  const refused = await retry
  t.equal(refused.status, 429, "the backend's second ask finds the cap reached: the forwarded retry is refused")
  t.match(refused.headers.get('retry-after'), /^[1-9][0-9]*$/, 'with an integer Retry-After, though the refusal was made on A')
  t.match(last(refused), { id: 2, error: { code: -32000 } })
})
