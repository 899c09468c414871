// Metrics: /metrics scraped and parsed after real traffic (the SDK client against a stdio
// child through a gateway in this process), a child crash and restart, hostile label values, the
// token and the own listen address, and messages a client lost to the bounded event log.
import { randomBytes } from 'node:crypto'
import { request } from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { parsePrometheus, scrape } from '../helpers/prometheus.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'
import { createMetrics, MAX_TOOLS_PER_SERVER } from '../../src/telemetry/metrics.js'

const FAST_RESTART = { maxRestarts: 3, windowMs: 60_000, baseDelayMs: 10, maxDelayMs: 50 }
const OPS = 'mcp_server_operation_duration_seconds_count'
const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

async function connect (t: Test, gw: RunningGateway, server = 'full'): Promise<{ client: Client, transport: StreamableHTTPClientTransport }> {
  const client = new Client({ name: 'metrics-test', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, transport }
}

/** A raw session: initialize (answered as JSON or SSE), then notifications/initialized; the session id. */
async function rawSession (url: string, protocolVersion: string): Promise<string> {
  const init = await fetch(url, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }) })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await init.text()
  await fetch(url, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': protocolVersion }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  return sid
}

t.test('after real traffic, /metrics shows operations, sessions, streams and children; a crash and restart are counted', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { restart: FAST_RESTART }) } })
  const { client, transport } = await connect(t, gw)
  await client.listTools()
  for (let i = 0; i < 3; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `n${i}` } })), `n${i}`)
  await client.callTool({ name: 'fail', arguments: {} })
  await client.callTool({ name: 'no-such-tool', arguments: {} }).catch(() => {})
  await client.ping()

  let m = await scrape(gw.url)
  t.ok(m.has('process_cpu_user_seconds_total') && m.has('nodejs_eventloop_lag_seconds'), 'Node\'s default process metrics are there')
  t.equal(m.sum(OPS, { server: 'full', mcp_method_name: 'tools/call', gen_ai_tool_name: 'echo', error_type: '' }), 3, 'three echo calls, by their listed tool name')
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'fail', error_type: 'tool_error' }), 1, 'a CallToolResult with isError is a tool_error')
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'other' }), 1, 'a tool the backend never listed is `other`')
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/list', gen_ai_tool_name: '' }), 1)
  t.equal(m.sum(OPS, { mcp_method_name: 'initialize' }), 1)
  t.equal(m.sum(OPS, { mcp_method_name: 'ping' }), 1)
  t.ok(m.all('mcp_server_operation_duration_seconds_bucket', { mcp_method_name: 'tools/call', le: '+Inf' }).length > 0, 'a histogram, with buckets')
  t.ok(m.all(OPS).every(s => s.labels.tenant === ''), 'no tenant label value without tenants')
  t.equal(m.sum('mcpgw_sessions_open', { server: 'full' }), 1, 'one session open')
  t.equal(m.sum('mcpgw_backend_children_running', { server: 'full' }), 1, 'one child running')
  t.equal(m.sum('mcpgw_backend_children_started_total', { server: 'full' }), 1)
  t.equal(m.sum('mcpgw_backend_children_crashed_total'), 0, 'no crash yet')

  // A child crash: the in-flight call fails, the child is restarted, and all of it is counted.
  await t.rejects(client.callTool({ name: 'crash', arguments: {} }), 'the in-flight call fails')
  m = await eventually('the restart to be counted', async () => {
    const now = await scrape(gw.url)
    return now.sum('mcpgw_backend_children_started_total', { server: 'full' }) === 2 && now.sum('mcpgw_backend_children_running', { server: 'full' }) === 1 ? now : undefined
  })
  t.equal(m.sum('mcpgw_backend_children_crashed_total', { server: 'full' }), 1, 'one crash')
  t.equal(m.sum('mcpgw_backend_children_restarted_total', { server: 'full' }), 1, 'one restart')
  t.equal(m.sum('mcpgw_backend_request_errors_total', { server: 'full', kind: 'unavailable' }), 1, 'the call in flight failed as unavailable')
  t.equal(m.sum(OPS, { gen_ai_tool_name: 'crash', error_type: '-32007' }), 1, 'and is an operation with error.type -32007')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'after' } })), 'after', 'the session goes on')

  // Refusals, by status and reason, from the typed errors.
  const bad = await fetch(`${gw.url}/mcp/full`, { method: 'POST', headers: HEADERS, body: '{not json' })
  t.equal(bad.status, 400)
  const missing = await fetch(`${gw.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': 'x'.repeat(32) }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }) })
  t.equal(missing.status, 404)
  m = await scrape(gw.url)
  t.equal(m.sum('mcpgw_http_refusals_total', { status: '400', reason: 'bad_input', code: 'GW_ERR_PARSE' }), 1, 'a parse error is bad input')
  t.equal(m.sum('mcpgw_http_refusals_total', { status: '404', reason: 'not_found', code: 'GW_ERR_SESSION_NOT_FOUND' }), 1, 'an unknown session')

  // The session ends: its duration is observed and it is no longer open.
  await transport.terminateSession()
  m = await eventually('the session end to be counted', async () => {
    const now = await scrape(gw.url)
    return now.sum('mcp_server_session_duration_seconds_count', { server: 'full' }) === 1 ? now : undefined
  })
  t.equal(m.sum('mcpgw_sessions_open', { server: 'full' }), 0, 'no session open')
  await eventually('the child to stop', async () => (await scrape(gw.url)).sum('mcpgw_backend_children_running') === 0 ? true : undefined)
  // The gateway's own series (and the MCP semantic-convention ones); prom-client's process and
  // Node series carry V8's names (Node 24 has a heap space `shared_trusted_large_object`).
  const ours = m.samples.filter(s => !s.name.startsWith('nodejs_') && !s.name.startsWith('process_'))
  t.ok(ours.some(s => s.name.startsWith('mcpgw_')), 'the gateway\'s own series are checked')
  const idLike = ours.flatMap(s => Object.values(s.labels).filter(v => /^(?!GW_ERR_)[A-Za-z0-9_-]{24,}$/.test(v)).map(v => `${s.name}: ${v}`))
  t.same(idLike, [], 'no label value looks like a session or request id')
})

t.test('gateways in one process keep registries of their own', async t => {
  const servers = { full: stdioFixture('full-server') }
  const a = await startGateway(t, { servers })
  const b = await startGateway(t, { servers })
  const { client } = await connect(t, a)
  await client.callTool({ name: 'echo', arguments: { text: 'x' } })
  t.equal((await scrape(a.url)).sum(OPS, { mcp_method_name: 'tools/call' }), 1, 'A counted its call')
  t.equal((await scrape(b.url)).sum(OPS), 0, 'B saw nothing')
  t.ok((await scrape(b.url)).has('process_resident_memory_bytes'), 'both have the process metrics')
})

t.test('hostile method and tool names leave the series count bounded', async t => {
  const gw = await startGateway(t, { http: { responseMode: 'json' }, servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const version = '2025-03-26' // the last version with JSON-RPC batches
  const sid = await rawSession(url, version)
  const marker = `hostile${randomBytes(4).toString('hex')}`
  let id = 1
  for (let round = 0; round < 8; round++) {
    const batch = Array.from({ length: 500 }, () => round % 2 === 0
      ? { jsonrpc: '2.0', id: id++, method: `${marker}/${randomBytes(6).toString('hex')}` }
      : { jsonrpc: '2.0', id: id++, method: 'tools/call', params: { name: `${marker}-${randomBytes(6).toString('hex')}`, arguments: {} } })
    const res = await fetch(url, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': version }, body: JSON.stringify(batch) })
    t.equal(((await res.json()) as unknown[]).length, 500, `round ${round}: every request answered`)
  }
  const m = await scrape(gw.url)
  t.notOk(m.text.includes(marker), 'no hostile name became a label value')
  const series = m.all(OPS)
  t.equal(m.sum(OPS, { mcp_method_name: 'other' }), 2000, 'unknown methods are `other`')
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/call', gen_ai_tool_name: 'other' }), 2000, 'unlisted tools are `other`')
  t.ok(series.length <= 6, `a handful of series for 4000 hostile requests (${series.length})`)
})

t.test('metrics.token: /metrics needs the bearer token; a refusal is counted as auth', async t => {
  const token = 'scrape-token-0123456789abcdef'
  const gw = await startGateway(t, { metrics: { token }, servers: { full: stdioFixture('full-server') } })
  const none = await fetch(`${gw.url}/metrics`)
  t.equal(none.status, 401, 'no token: 401')
  t.equal(none.headers.get('www-authenticate'), 'Bearer realm="metrics"')
  t.match(await none.json(), { error: { code: -32000, data: { code: 'GW_ERR_METRICS_UNAUTHORIZED' } } })
  t.equal((await fetch(`${gw.url}/metrics`, { headers: { authorization: `Bearer ${token}x` } })).status, 401, 'a wrong token: 401')
  t.equal((await fetch(`${gw.url}/metrics`, { headers: { authorization: `Basic ${token}` } })).status, 401, 'another scheme: 401')
  const m = await scrape(gw.url, { authorization: `bearer ${token}` })
  t.equal(m.sum('mcpgw_http_refusals_total', { status: '401', reason: 'auth', code: 'GW_ERR_METRICS_UNAUTHORIZED' }), 3, 'the refusals, counted')
})

t.test('metrics.listen: /metrics is served on its own address only', async t => {
  const gw = await startGateway(t, { metrics: { listen: { host: '127.0.0.1', port: 0 } }, servers: { full: stdioFixture('full-server') } })
  t.equal((await fetch(`${gw.url}/metrics`)).status, 404, 'not on the main listener')
  const metricsApp = gw.gateway.metricsApp
  if (metricsApp === null) throw new Error('no metrics listener')
  const address = await metricsApp.listen({ host: '127.0.0.1', port: 0 })
  const { client } = await connect(t, gw)
  await client.listTools()
  const m = await scrape(address)
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/list' }), 1, 'the gateway\'s metrics, on the other address')
  t.equal(m.sum('mcpgw_http_refusals_total', { status: '404' }), 1, 'the main listener\'s 404 for /metrics is counted')
  t.equal((await fetch(`${address}/mcp/full`, { method: 'POST', headers: HEADERS, body: '{}' })).status, 404, 'no MCP endpoint there')
})

t.test('pinned http.allowedHosts: /metrics still answers a scrape addressed to an IP, not to another name', async t => {
  const gw = await startGateway(t, { http: { allowedHosts: ['mcp.example.com'] }, servers: { full: stdioFixture('full-server') } })
  const port = new URL(gw.url).port
  const scrapeAs = async (host: string, path = '/metrics'): Promise<number> => await new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers: { host } }, res => { res.resume(); resolve(res.statusCode ?? 0) })
    req.on('error', reject)
    req.end()
  })
  t.equal(await scrapeAs(`10.1.2.3:${port}`), 200, 'a pod IP as Host (Prometheus)')
  t.equal(await scrapeAs(`[fd00::1]:${port}`), 200, 'an IPv6 address as Host')
  t.equal(await scrapeAs('mcp.example.com'), 200, 'the pinned name')
  t.equal(await scrapeAs('rebind.attacker.example'), 403, 'another name is refused, as on every path')
  t.equal(await scrapeAs(`10.1.2.3:${port}`, '/mcp/full'), 403, 'an IP as Host is exempt on /metrics only')
})

t.test('metrics.enabled false: no /metrics and no registry', async t => {
  const gw = await startGateway(t, { metrics: { enabled: false }, servers: { full: stdioFixture('full-server') } })
  const { client } = await connect(t, gw)
  await client.listTools()
  t.equal((await fetch(`${gw.url}/metrics`)).status, 404)
  t.equal(gw.gateway.metrics.registry, null)
})

t.test('messages trimmed from the bounded log before a client read them are counted', async t => {
  const gw = await startGateway(t, { sessions: { eventLogMaxLen: 10 }, servers: { full: stdioFixture('full-server') } })
  const url = `${gw.url}/mcp/full`
  const version = '2025-11-25'
  const sid = await rawSession(url, version)
  const headers = { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': version }
  // Each new tool sends notifications/tools/list_changed to the GET stream, which nobody reads yet.
  for (let i = 1; i <= 15; i++) {
    const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'tools/call', params: { name: 'add-tool', arguments: {} } }) })
    await new SseReader(res).finished
  }
  const controller = new AbortController()
  const get = await fetch(url, { headers: { ...headers, accept: 'text/event-stream' }, signal: controller.signal })
  const reader = new SseReader(get)
  const events = await reader.until(events => events.filter(e => e.data.includes('list_changed')).length >= 10)
  t.equal(events.filter(e => e.data.includes('list_changed')).length, 10, 'the log kept the last 10')
  const m = await eventually('the loss to be counted', async () => {
    const now = await scrape(gw.url)
    return now.sum('mcpgw_event_log_lost_total', { stream: 'get' }) > 0 ? now : undefined
  })
  t.equal(m.sum('mcpgw_event_log_lost_total', { stream: 'get' }), 5, 'the 5 that were trimmed unseen')
  t.equal(m.sum('mcpgw_event_log_lost_total', { stream: 'request' }), 0, 'request streams lost nothing')
  t.equal(m.sum('mcpgw_client_streams_open', { stream: 'get' }), 1, 'the GET stream is open')
  controller.abort()
  await reader.finished

  // The client is away; 15 more notifications arrive, and it resumes from the last one it saw.
  const lastSeen = events.filter(e => e.data.includes('list_changed')).at(-1)?.id ?? ''
  await eventually('the GET stream to be released', async () => (await scrape(gw.url)).sum('mcpgw_client_streams_open', { stream: 'get' }) === 0 ? true : undefined)
  for (let i = 16; i <= 30; i++) {
    const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'tools/call', params: { name: 'add-tool', arguments: {} } }) })
    await new SseReader(res).finished
  }
  const resumed = new AbortController()
  const again = new SseReader(await fetch(url, { headers: { ...headers, accept: 'text/event-stream', 'last-event-id': lastSeen }, signal: resumed.signal }))
  await again.until(events => events.filter(e => e.data.includes('list_changed')).length >= 10)
  const after = await eventually('the second loss to be counted', async () => {
    const now = await scrape(gw.url)
    return now.sum('mcpgw_event_log_lost_total', { stream: 'get' }) > 5 ? now : undefined
  })
  t.equal(after.sum('mcpgw_event_log_lost_total', { stream: 'get' }), 10, 'a resume past trimmed entries counts them too')
  t.equal(after.sum('mcpgw_event_log_resume_cursor_missing_total'), 0, 'the memory log knows a trimmed entry\'s ordinal')
  resumed.abort()
})

t.test('the parser reads what prom-client writes', async t => {
  const parsed = parsePrometheus('# HELP x y\n# TYPE x counter\nx{a="b\\"c",d=""} 3\ny 1.5e-3\n')
  t.same(parsed.samples, [{ name: 'x', labels: { a: 'b"c', d: '' }, value: 3 }, { name: 'y', labels: {}, value: 0.0015 }])
})

t.test('a backend listing thousands of tools: the tool label set is capped (unit)', async t => {
  const metrics = createMetrics({ enabled: true, servers: ['full'], tenants: ['acme'] })
  const session = metrics.forSession('full', 'acme')
  const names = Array.from({ length: 3000 }, (_, i) => `tool-${i}`)
  session.toolsListed({ tools: [...names.map(name => ({ name })), { name: 'x'.repeat(500) }, { name: 42 }, null] })
  for (const name of names) session.operation('tools/call', name, '', 0)
  metrics.forSession('full', 'not-a-tenant').operation('tools/call', 'tool-1', '', 0)
  metrics.forSession('nope', null).operation('no/such', undefined, '', 0)
  const m = parsePrometheus(await metrics.registry!.metrics())
  const series = m.all(OPS)
  t.equal(series.length, MAX_TOOLS_PER_SERVER + 3, 'the capped names, `other`, and one series per bounded tenant or server')
  t.equal(m.sum(OPS, { gen_ai_tool_name: 'other', tenant: 'acme' }), 3000 - MAX_TOOLS_PER_SERVER, 'the rest are `other`')
  t.equal(m.sum(OPS, { tenant: 'other' }), 1, 'a tenant that is not configured is `other`')
  t.equal(m.sum(OPS, { server: 'other', mcp_method_name: 'other' }), 1, 'so are an unknown server and method')
})
