// Traces: spans exported over real OTLP/HTTP to an in-test receiver, from a real gateway
// in front of a real stdio backend; W3C trace context read from the client (header and
// params._meta, SEP-414) and written into the backend request's _meta.
import { execFile } from 'node:child_process'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { promisify } from 'node:util'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { shortHash } from '../../src/telemetry/logger.js'
import { tracesUrl } from '../../src/telemetry/tracing.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'
import { fixture, startGateway, stdioFixture } from '../helpers/gateway.js'
import { CLIENT, SERVER, startOtlpReceiver, type ReceivedSpan } from '../helpers/otlp-receiver.js'
import { SseReader } from '../helpers/sse-client.js'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const VERSION = '2025-11-25'

/** A client's own trace context: 00-<trace id>-<span id>-<flags>. */
const CLIENT_TRACE = '0af7651916cd43dd8448eb211c80319c'
const CLIENT_SPAN = 'b7ad6b7169203331'
const META_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736'
const META_SPAN = '00f067aa0ba902b7'

interface Session { url: string, sid: string }

async function post (s: Session, body: unknown, headers: Record<string, string> = {}): Promise<Record<string, unknown>> {
  const res = await fetch(`${s.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': s.sid, 'mcp-protocol-version': VERSION, ...headers }, body: JSON.stringify(body) })
  const reader = new SseReader(res)
  await reader.finished
  const [message] = reader.messages()
  if (message === undefined) throw new Error(`no answer (${res.status})`)
  return message
}

async function open (url: string, headers: Record<string, string> = {}): Promise<Session> {
  const res = await fetch(`${url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, ...headers }, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'trace-test', version: '1' } } }) })
  const sid = res.headers.get('mcp-session-id') ?? ''
  await new SseReader(res).finished
  await fetch(`${url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': VERSION }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  return { url, sid }
}

const toolText = (answer: Record<string, unknown>): string =>
  ((answer.result as { content: Array<{ text: string }> }).content[0]?.text ?? '')

function one (spans: ReceivedSpan[], name: string, kind: number): ReceivedSpan {
  const found = spans.filter(s => s.name === name && s.kind === kind)
  if (found.length !== 1) throw new Error(`expected one ${kind === SERVER ? 'SERVER' : 'CLIENT'} span '${name}', got ${found.length}: ${spans.map(s => s.name).join(', ')}`)
  return found[0] as ReceivedSpan
}

t.test('SERVER and CLIENT spans with the MCP attributes, parents from the client, _meta to the backend', async t => {
  const receiver = await startOtlpReceiver(t)
  const gw = await startGateway(t, { tracing: { otlpEndpoint: receiver.url, serviceName: 'gw-test' }, servers: { full: stdioFixture('full-server') } })
  const s = await open(gw.url, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` })

  // _meta names the message's context and wins over the header of the POST.
  const metaAnswer = await post(s, {
    jsonrpc: '2.0', id: 'm1', method: 'tools/call',
    params: { name: 'meta', arguments: {}, _meta: { traceparent: `00-${META_TRACE}-${META_SPAN}-01`, tracestate: 'vendor=x', progressToken: 'keep-me' } }
  }, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` })
  const backendMeta = JSON.parse(toolText(metaAnswer)) as Record<string, unknown>
  // The header only.
  await post(s, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'echo', arguments: { text: 'hi' } } }, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` })
  // No context at all: a new trace.
  await post(s, { jsonrpc: '2.0', id: 3, method: 'prompts/get', params: { name: 'greet', arguments: { name: 'Ada' } } })
  await post(s, { jsonrpc: '2.0', id: 4, method: 'resources/read', params: { uri: 'test://static' } })
  await post(s, { jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'fail', arguments: {} } })
  await post(s, { jsonrpc: '2.0', id: 6, method: 'no/such-method', params: {} })
  await post(s, { jsonrpc: '2.0', id: 7, method: 'ping' })
  await post(s, { jsonrpc: '2.0', id: 8, method: 'tools/call', params: { name: 'x'.repeat(1000), arguments: {} } })
  await gw.close() // flushes the batch processor
  const spans = receiver.spans

  t.ok(receiver.requests.length > 0 && receiver.requests.every(r => r.path === '/v1/traces' && r.contentType.startsWith('application/json')), 'OTLP/HTTP JSON on /v1/traces')
  t.ok(spans.every(sp => sp.service === 'gw-test' && sp.instance === gw.gateway.replicaId), 'service.name and service.instance.id on the resource')

  const init = one(spans, 'initialize', SERVER)
  t.equal(init.traceId, CLIENT_TRACE, 'initialize joins the trace of the traceparent header')
  t.equal(init.parentSpanId, CLIENT_SPAN)
  const initClient = one(spans, 'initialize', CLIENT)
  t.equal(initClient.parentSpanId, init.spanId, 'the backend hop is a child of the SERVER span')

  const server = one(spans, 'tools/call meta', SERVER)
  const client = one(spans, 'tools/call meta', CLIENT)
  t.equal(server.traceId, META_TRACE, 'params._meta.traceparent is the parent (over the header)')
  t.equal(server.parentSpanId, META_SPAN)
  t.equal(client.traceId, META_TRACE)
  t.equal(client.parentSpanId, server.spanId)
  t.match(server.attributes, {
    'mcp.method.name': 'tools/call',
    'gen_ai.tool.name': 'meta',
    'gen_ai.operation.name': 'execute_tool',
    'jsonrpc.request.id': 'm1',
    'mcp.session.id': shortHash(s.sid),
    'mcp.protocol.version': VERSION,
    'network.transport': 'tcp',
    'network.protocol.name': 'http',
    'mcp_gateway.server': 'full'
  })
  t.notOk(Object.values(server.attributes).includes(s.sid), 'the session id itself is never exported')
  t.match(client.attributes, { 'mcp.method.name': 'tools/call', 'gen_ai.tool.name': 'meta', 'network.transport': 'pipe', 'jsonrpc.request.id': /^\d+$/ })
  t.equal(server.status, 0, 'a successful call is no error')

  // The backend received the CLIENT span's context in _meta; other _meta keys pass through.
  t.equal(backendMeta.traceparent, `00-${META_TRACE}-${client.spanId}-01`, 'backend _meta.traceparent names the CLIENT span')
  t.equal(backendMeta.tracestate, 'vendor=x', 'tracestate travels on')
  t.equal(backendMeta.progressToken, 'keep-me')

  const echo = one(spans, 'tools/call echo', SERVER)
  t.equal(echo.traceId, CLIENT_TRACE, 'the HTTP traceparent header is the parent without _meta')
  t.equal(echo.parentSpanId, CLIENT_SPAN)

  const prompt = one(spans, 'prompts/get greet', SERVER)
  t.equal(prompt.attributes['gen_ai.prompt.name'], 'greet')
  t.equal(prompt.parentSpanId, '', 'no client context: a root span')
  t.not(prompt.traceId, CLIENT_TRACE)
  t.equal(one(spans, 'prompts/get greet', CLIENT).traceId, prompt.traceId)

  const read = one(spans, 'resources/read', SERVER)
  t.equal(read.attributes['mcp.resource.uri'], 'test://static', 'the resource URI is an attribute, not part of the name')

  const fail = one(spans, 'tools/call fail', SERVER)
  t.equal(fail.attributes['error.type'], 'tool_error', 'a tool result with isError is a tool_error')
  t.equal(fail.status, 2)

  const unknown = one(spans, 'no/such-method', SERVER)
  t.equal(unknown.attributes['rpc.response.status_code'], '-32601')
  t.equal(unknown.attributes['error.type'], undefined, 'method not found is the caller\'s mistake, not a server error')
  t.equal(unknown.status, 0)
  const unknownClient = one(spans, 'no/such-method', CLIENT)
  t.equal(unknownClient.attributes['error.type'], '-32601', 'on the CLIENT span every JSON-RPC error is an error')
  t.equal(unknownClient.status, 2)

  t.equal(one(spans, `tools/call ${'x'.repeat(128)}`, SERVER).attributes['gen_ai.tool.name'], 'x'.repeat(128), 'a hostile tool name is cut to 128 characters')
  one(spans, 'ping', SERVER)
  t.equal(spans.filter(sp => sp.name === 'ping' && sp.kind === CLIENT).length, 0, 'ping is answered by the gateway: no backend hop')
  t.equal(spans.filter(sp => sp.name.startsWith('notifications/')).length, 0, 'notifications get no span')
})

t.test('legacy HTTP+SSE: the SERVER span ends when the answer is written to the session stream', async t => {
  const receiver = await startOtlpReceiver(t)
  const gw = await startGateway(t, { tracing: { otlpEndpoint: receiver.url }, servers: { full: stdioFixture('full-server') } })
  const client = new Client({ name: 'legacy', version: '1' })
  await client.connect(new SSEClientTransport(new URL(`${gw.url}/sse/full`)))
  const result = await client.callTool({ name: 'meta', arguments: {} })
  const meta = JSON.parse((result.content as Array<{ text: string }>)[0]?.text ?? '{}') as Record<string, unknown>
  await client.close()
  await gw.close()
  const server = one(receiver.spans, 'tools/call meta', SERVER)
  const backend = one(receiver.spans, 'tools/call meta', CLIENT)
  t.equal(backend.parentSpanId, server.spanId)
  t.match(server.attributes['mcp.protocol.version'], /^\d{4}-\d{2}-\d{2}$/, 'the version negotiated in initialize')
  t.equal(server.status, 0, 'answered, not ended by the stream closing')
  t.equal(meta.traceparent, `00-${server.traceId}-${backend.spanId}-01`)
})

t.test('a Streamable HTTP backend gets the CLIENT span in the request body\'s _meta', async t => {
  const receiver = await startOtlpReceiver(t)
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, { tracing: { otlpEndpoint: receiver.url }, servers: { full: { transport: 'streamable-http', url: upstream.url } } })
  const s = await open(gw.url)
  const answer = await post(s, { jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'echo', arguments: { message: 'm' } } }, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` })
  t.equal(toolText(answer), 'echo: m')
  await gw.close()
  const server = one(receiver.spans, 'tools/call echo', SERVER)
  const client = one(receiver.spans, 'tools/call echo', CLIENT)
  t.equal(client.parentSpanId, server.spanId)
  t.match(client.attributes, { 'network.transport': 'tcp', 'network.protocol.name': 'http', 'jsonrpc.request.id': '9' })
  const sent = upstream.requests.find(r => (r.body as { method?: string } | undefined)?.method === 'tools/call')?.body as { params: { _meta: Record<string, unknown> } }
  t.equal(sent.params._meta.traceparent, `00-${CLIENT_TRACE}-${client.spanId}-01`)
})

t.test('a request whose client stream closes first ends its SERVER span with the reason', async t => {
  const receiver = await startOtlpReceiver(t)
  const gw = await startGateway(t, { tracing: { otlpEndpoint: receiver.url }, servers: { full: stdioFixture('full-server') } })
  const s = await open(gw.url)
  const abort = new AbortController()
  const res = await fetch(`${s.url}/mcp/full`, { method: 'POST', signal: abort.signal, headers: { ...HEADERS, 'mcp-session-id': s.sid, 'mcp-protocol-version': VERSION }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'slow', arguments: { ms: 3000 } } }) })
  t.equal(res.status, 200)
  abort.abort()
  await new SseReader(res).finished
  await new Promise(resolve => setTimeout(resolve, 300))
  await gw.close()
  const server = one(receiver.spans, 'tools/call slow', SERVER)
  t.equal(server.attributes['error.type'], 'client-closed')
  t.equal(server.status, 2)
  // The CLIENT span ended too (the gateway's shutdown failed the call in flight).
  t.ok(one(receiver.spans, 'tools/call slow', CLIENT).attributes['error.type'] !== undefined)
})

t.test('sampleRatio 0 records no new trace but follows a client\'s sampled flag', async t => {
  const receiver = await startOtlpReceiver(t)
  const gw = await startGateway(t, { tracing: { otlpEndpoint: `${receiver.url}/v1/traces`, sampleRatio: 0 }, servers: { full: stdioFixture('full-server') } })
  const s = await open(gw.url)
  const unsampled = await post(s, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'meta', arguments: {} } })
  await post(s, { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, { traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01` })
  await gw.close()
  t.same(receiver.spans.filter(sp => sp.name !== 'tools/call echo'), [], 'nothing of the unsampled requests is exported')
  t.equal(one(receiver.spans, 'tools/call echo', SERVER).traceId, CLIENT_TRACE)
  t.equal(one(receiver.spans, 'tools/call echo', CLIENT).traceId, CLIENT_TRACE)
  // Not recorded, but the context still travels (flags 00), so the backend can follow the decision.
  t.match(JSON.parse(toolText(unsampled)), { traceparent: /^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/ })
})

t.test('tracing off: the OpenTelemetry SDK is never loaded; on: it is (the probe can see it)', async t => {
  const run = promisify(execFile)
  const probe = fixture('tracing-probe')
  const receiver = await startOtlpReceiver(t)
  const off = JSON.parse((await run(process.execPath, [probe, fixture('full-server')])).stdout) as { answer: string, loaded: string[] }
  t.equal(off.answer, 'probe', 'the probe served a tool call through the gateway')
  // prom-client (metrics) loads the OpenTelemetry API, a no-op facade, for its exemplars; the SDK,
  // exporter and resources (what tracing costs) must stay unloaded.
  t.same(off.loaded.filter(path => !path.includes('/@opentelemetry/api/')), [], 'no OpenTelemetry SDK module loaded')
  const on = JSON.parse((await run(process.execPath, [probe, fixture('full-server'), receiver.url])).stdout) as { answer: string, loaded: string[] }
  t.equal(on.answer, 'probe')
  t.ok(on.loaded.some(p => p.includes('@opentelemetry/sdk-trace-base')), 'with tracing on the SDK is loaded')
})

t.test('config: defaults, and a bad endpoint is refused', async t => {
  const config = parseConfig({ tracing: { otlpEndpoint: 'http://collector:4318' }, servers: { full: stdioFixture('full-server') } }, {})
  t.same(config.tracing, { otlpEndpoint: 'http://collector:4318', sampleRatio: 1, serviceName: 'mcp-gateway' })
  t.equal(parseConfig({ servers: { full: stdioFixture('full-server') } }, {}).tracing, undefined, 'off by default')
  t.throws(() => parseConfig({ tracing: { otlpEndpoint: 'collector:4318' }, servers: { full: stdioFixture('full-server') } }, {}), { message: /\/tracing\/otlpEndpoint/ })
  t.throws(() => parseConfig({ tracing: { otlpEndpoint: 'http://c:4318', sampleRatio: 2 }, servers: { full: stdioFixture('full-server') } }, {}), { message: /\/tracing\/sampleRatio/ })
  t.equal(tracesUrl('http://c:4318'), 'http://c:4318/v1/traces')
  t.equal(tracesUrl('http://c:4318/'), 'http://c:4318/v1/traces')
  t.equal(tracesUrl('http://c:4318/v1/traces'), 'http://c:4318/v1/traces')
})
