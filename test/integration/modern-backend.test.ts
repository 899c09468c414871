// A modern (2026-07-28) HTTP backend behind the gateway (docs/behaviour.md): the era is probed
// once (`protocol: auto`), modern requests are relayed as they are (headers, envelope,
// input_required and its requestState), the client's credential never goes upstream, closing the
// response cancels upstream, and a tenant's tool policy still applies. A legacy backend on `auto`
// is probed once and served through the pool. A 2025 client's session in front of a modern backend
// is bridged: envelope from its initialize, input_required rounds as server-to-client requests.
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as TransportV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startModernUpstream } from '../fixtures/modern-upstream.js'
import { sseEvent, startRawUpstream, startStreamableUpstream, type RawUpstream } from '../fixtures/http-upstreams.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { eventually, textOf } from '../helpers/wait.js'
import { last, modernPost } from '../helpers/modern.js'

const V = '2026-07-28'
const meta = { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': { elicitation: {} } }

t.test('modern backend: probed once, relayed as is, MRTR passes through, cancel on close', async t => {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  const gw = await startGateway(t, {
    servers: { modern: { transport: 'streamable-http', url: upstream.url, headers: { 'x-gateway-secret': 'configured' } } }
  })
  const url = `${gw.url}/mcp/modern`
  const client = new ClientV2({ name: 'modern-backend', version: '1' }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: V } } })
  client.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { ok: true } }))
  await client.connect(new TransportV2(new URL(url)))
  t.teardown(async () => { await client.close().catch(() => {}) })

  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'hi' } })), 'modern echo: hi', 'a call relayed to the modern backend')
  t.equal(client.getServerVersion()?.name, 'modern-upstream', "discover is the backend's own")
  t.equal(textOf(await client.callTool({ name: 'confirm', arguments: {} })), 'confirmed: {"ok":true}', "the backend's own input_required round passes through both ways")

  const probes = upstream.requests.filter(r => (r.body as { id?: unknown } | undefined)?.id?.toString().startsWith('gw-probe') === true)
  t.equal(probes.length, 1, 'the era was probed once')
  const relayed = upstream.requests.find(r => (r.body as { method?: string } | undefined)?.method === 'tools/call')
  t.equal(relayed?.headers['mcp-method'], 'tools/call', 'Mcp-Method goes upstream')
  t.equal(relayed?.headers['mcp-name'], 'echo', 'Mcp-Name goes upstream')
  t.equal(relayed?.headers['mcp-protocol-version'], V)
  t.equal(relayed?.headers['x-gateway-secret'], 'configured', "the server's configured headers go upstream")

  const abort = new AbortController()
  const pending = modernPost(url, 'tools/call', { name: 'slow', arguments: { tag: 'cancel-me' }, _meta: meta }, 1, {}, abort.signal).catch(() => null)
  await eventually('the slow call reached the backend', () => upstream.requests.some(r => JSON.stringify(r.body).includes('cancel-me')) ? true : undefined)
  abort.abort()
  await pending
  t.ok(await eventually('the backend saw its request cancelled', () => upstream.aborted.includes('cancel-me') ? true : undefined).catch(() => false), 'closing the response cancelled the upstream request')

})

t.test('a 2025 client in front of a modern-only backend: its session is bridged, input_required rounds become server-to-client requests', async t => {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { modern: { transport: 'streamable-http', url: upstream.url, protocol: 'modern' } } })
  const client = new ClientV1({ name: 'legacy-client', version: '1' }, { capabilities: { elicitation: {} } })
  const asked: unknown[] = []
  client.setRequestHandler(ElicitRequestSchema, async request => {
    asked.push(request.params)
    return { action: 'accept', content: { ok: true } }
  })
  await client.connect(new TransportV1(new URL(`${gw.url}/mcp/modern`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  t.equal(client.getServerVersion()?.name, 'modern-upstream', "initialize answered from the backend's server/discover")
  t.ok(client.getServerCapabilities()?.tools !== undefined, "with the backend's capabilities")
  t.ok((await client.listTools()).tools.some(tool => tool.name === 'echo'))
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'old' } })), 'modern echo: old')
  t.equal(textOf(await client.callTool({ name: 'confirm', arguments: {} })), 'confirmed: {"ok":true}', 'the input_required round was answered by the client over its session')
  t.match(asked, [{ message: 'Sure?' }], 'as an elicitation/create request')
  t.equal(textOf(await client.callTool({ name: 'regional', arguments: { region: 'Zürich' } })), 'region Zürich', 'a marked argument went upstream as its Mcp-Param header too')
  const regional = upstream.requests.filter(r => JSON.stringify(r.body).includes('"regional"') && (r.body as { method?: string }).method === 'tools/call').at(-1)
  t.equal(regional?.headers['mcp-param-region'], `=?base64?${Buffer.from('Zürich').toString('base64')}?=`, 'Base64-encoded, as it is not header-safe')
  await client.setLoggingLevel('warning')
  const sent = upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'tools/call').at(-1)?.body as { params: { _meta: Record<string, unknown> } }
  t.match(sent.params._meta, { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': { elicitation: {} }, 'io.modelcontextprotocol/clientInfo': { name: 'legacy-client' } }, "each request carried an envelope built from the client's initialize")
  await client.callTool({ name: 'echo', arguments: { message: 'after setLevel' } })
  const last = upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'tools/call').at(-1)?.body as { params: { _meta: Record<string, unknown> } }
  t.equal(last.params._meta['io.modelcontextprotocol/logLevel'], 'warning', 'the session log level rides in the envelope')
  t.notOk(upstream.requests.some(r => (r.body as { method?: string } | undefined)?.method === 'initialize'), 'no initialize ever reached the modern backend')
})

t.test('protocol auto: a 2025 session finds the modern-only server by the probe and is bridged', async t => {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { modern: { transport: 'streamable-http', url: upstream.url } } })
  for (let i = 0; i < 2; i++) {
    const client = new ClientV1({ name: `auto-${i}`, version: '1' })
    await client.connect(new TransportV1(new URL(`${gw.url}/mcp/modern`)))
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `s${i}` } })), `modern echo: s${i}`, `session ${i} bridged`)
    await client.close()
  }
  const probes = upstream.requests.filter(r => String((r.body as { id?: unknown } | undefined)?.id).startsWith('gw-probe'))
  t.equal(probes.length, 1, 'probed once for both sessions')
})

t.test('legacy backend on protocol auto: probed once, then served through the pool', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { remote: { transport: 'streamable-http', url: upstream.url } } })
  const url = `${gw.url}/mcp/remote`
  for (let i = 0; i < 3; i++) {
    const body = last(await modernPost(url, 'tools/call', { name: 'echo', arguments: { message: `m${i}` }, _meta: meta })) as { result: Record<string, unknown> }
    t.equal(textOf(body.result), `echo: m${i}`)
    t.equal(body.result.resultType, 'complete', 'bridged: a modern result')
  }
  const probes = upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'server/discover')
  t.equal(probes.length, 1, 'one probe, then the answer is kept')
})

t.test('tenants in front of a modern backend: no credential passthrough, tool policy applied', async t => {
  const upstream = await startModernUpstream()
  t.teardown(upstream.close)
  const key = newKey('bot')
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { modern: { tools: { deny: ['secret'] }, upstream: { headers: { 'x-tenant-token': 'acme-upstream' } } } } } },
    servers: { modern: { transport: 'streamable-http', url: upstream.url, protocol: 'modern' } }
  })
  const url = `${gw.url}/mcp/modern`
  const listed = last(await modernPost(url, 'tools/list', { _meta: meta }, 1, bearer(key.key))) as { result: { tools: Array<{ name: string }> } }
  const names = listed.result.tools.map(tool => tool.name)
  t.ok(names.includes('echo'))
  t.notOk(names.includes('secret'), 'a denied tool is not listed')
  const denied = last(await modernPost(url, 'tools/call', { name: 'secret', arguments: {}, _meta: meta }, 1, bearer(key.key))) as { error?: { code: number } }
  t.equal(denied.error?.code, -32602, 'a denied tool is refused before the backend')
  const called = upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'tools/list')
  t.ok(called.length > 0)
  for (const r of upstream.requests) {
    t.equal(r.headers.authorization, undefined, "the client's credential never goes upstream")
  }
  t.equal(called[0]?.headers['x-tenant-token'], 'acme-upstream', "the tenant's upstream header does")
  t.notOk(upstream.requests.some(r => JSON.stringify(r.body).includes('"secret"') && (r.body as { method?: string }).method === 'tools/call'), 'the denied call never reached the backend')
})

/**
 * A raw modern-only server whose SSE answers end with a log notification (level "error") after the
 * response; a 2025 request gets -32022.
 */
async function startTrailingUpstream (t: Test): Promise<RawUpstream> {
  const results: Record<string, unknown> = {
    'server/discover': { resultType: 'complete', supportedVersions: [V], capabilities: { tools: {} } },
    'tools/list': { resultType: 'complete', tools: ['open', 'secret'].map(name => ({ name, inputSchema: { type: 'object' } })) }
  }
  const upstream = await startRawUpstream((request, res) => {
    const result = results[request.method]
    if (result === undefined) {
      res.writeHead(400, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', id: request.id ?? null, error: { code: -32022, message: 'Unsupported protocol version', data: { supported: [V] } } }))
      return
    }
    const log = sseEvent({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'error', data: 'after the answer' } })
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.end(log + sseEvent({ jsonrpc: '2.0', id: request.id, result }) + log)
  })
  t.teardown(upstream.close)
  return upstream
}

t.test('the answer in a modern SSE body is its response, not a notification after it (SPEC H-26-5)', async t => {
  const upstream = await startTrailingUpstream(t)
  const key = newKey('bot')
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { probed: {}, pinned: { tools: { deny: ['secret'] } } } } },
    servers: {
      probed: { transport: 'streamable-http', url: upstream.url },
      pinned: { transport: 'streamable-http', url: upstream.url, protocol: 'modern' }
    }
  })
  const toolsIn = async (server: string, id: number): Promise<unknown> => {
    const answer = await modernPost(`${gw.url}/mcp/${server}`, 'tools/list', { _meta: meta }, id, bearer(key.key))
    const response = answer.messages.find(m => m.id === id) as { result?: { tools?: Array<{ name: string }> } } | undefined
    return response?.result?.tools?.map(tool => tool.name)
  }
  t.same(await toolsIn('probed', 1), ['open', 'secret'], 'the probe read the discover response: a modern server, relayed as it is')
  t.notOk(upstream.methods.includes('initialize'), 'never taken for a 2025 server')
  t.same(await toolsIn('pinned', 2), ['open'], 'under a tool policy the response is read, filtered and sent: the trailing log line is not the answer')
})

t.test('2026-07-28 Tasks extension: tasks/get, tasks/update and tasks/cancel reach a modern backend; Mcp-Name is checked against the task id', async t => {
  const upstream = await startModernUpstream({ modernOnly: true, tasks: true })
  t.teardown(upstream.close)
  const gw = await startGateway(t, {
    servers: {
      modern: { transport: 'streamable-http', url: upstream.url, protocol: 'modern' },
      local: stdioFixture('full-server')
    }
  })
  const url = `${gw.url}/mcp/modern`
  const created = await modernPost(url, 'tools/call', { name: 'long_job', arguments: { seconds: 1, label: 'report' }, _meta: meta }, 1)
  const handle = last(created).result as { resultType?: string, taskId?: string }
  t.equal(handle.resultType, 'task', 'the backend\'s task handle reaches the client')
  const taskId = handle.taskId ?? ''
  t.match(taskId, /^task-/)

  const working = await modernPost(url, 'tasks/get', { taskId, _meta: meta }, 2)
  t.equal(working.status, 200)
  t.match(last(working).result, { taskId, status: 'working', resultType: 'complete' }, 'tasks/get is relayed, not refused as a removed method')
  const sentGet = upstream.requests.find(r => (r.body as { method?: string } | undefined)?.method === 'tasks/get')
  t.equal(sentGet?.headers['mcp-name'], taskId, 'Mcp-Name carries the task id upstream')

  const mismatched = await modernPost(url, 'tasks/get', { taskId, _meta: meta }, 3, { 'mcp-name': 'task-someone-else' })
  t.equal(mismatched.status, 400, 'an Mcp-Name naming another task is refused before anything goes upstream')
  t.equal((last(mismatched).error as { code?: number } | undefined)?.code, -32020)
  t.equal(upstream.requests.filter(r => (r.body as { id?: number } | undefined)?.id === 3).length, 0, 'the mismatched request never reached the backend')

  const updated = await modernPost(url, 'tasks/update', { taskId, inputResponses: {}, _meta: meta }, 4)
  t.match(last(updated).result, { resultType: 'complete' }, 'tasks/update is relayed')

  const done = await eventually('the task to complete', async () => {
    const got = last(await modernPost(url, 'tasks/get', { taskId, _meta: meta }, 5)).result as { status?: string }
    return got.status === 'completed' ? got : undefined
  }, 10_000, 200)
  t.match(done, { status: 'completed', result: { content: [{ type: 'text', text: 'done: report' }] } }, 'the result comes inline with tasks/get')

  const second = last(await modernPost(url, 'tools/call', { name: 'long_job', arguments: { seconds: 60, label: 'cancel-me' }, _meta: meta }, 6)).result as { taskId: string }
  const cancelled = await modernPost(url, 'tasks/cancel', { taskId: second.taskId, _meta: meta }, 7)
  t.match(last(cancelled).result, { resultType: 'complete' }, 'tasks/cancel is relayed')
  t.match(last(await modernPost(url, 'tasks/get', { taskId: second.taskId, _meta: meta }, 8)).result, { status: 'cancelled' })

  const unknown = await modernPost(url, 'tasks/get', { taskId: 'task-made-up', _meta: meta }, 9)
  t.equal((last(unknown).error as { code?: number } | undefined)?.code, -32602, 'an unknown task id: the backend\'s -32602')

  for (const method of ['tasks/result', 'tasks/list']) {
    const removed = await modernPost(url, method, { taskId, _meta: meta }, 10)
    t.equal(removed.status, 404, `${method} is removed in this era's extension`)
    t.equal((last(removed).error as { code?: number } | undefined)?.code, -32601)
  }

  // A server the gateway serves such requests from itself has no task of this era: every id is unknown there.
  const local = await modernPost(`${gw.url}/mcp/local`, 'tasks/get', { taskId, _meta: meta }, 11)
  t.equal(local.status, 200)
  t.match(last(local).error, { code: -32602, message: /Unknown task/ }, 'a pooled server answers -32602 for any task id')
  const localCancel = await modernPost(`${gw.url}/mcp/local`, 'tasks/cancel', { taskId: 'x', _meta: meta }, 12)
  t.equal((last(localCancel).error as { code?: number } | undefined)?.code, -32602)
})
