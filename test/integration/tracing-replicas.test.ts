// One trace across two gateway processes on one Redis. The session's child lives on A
// (initialize landed there); the traced request lands on B, whose SERVER span's context crosses
// the bus in the deliver envelope, so A's CLIENT span toward the backend is its child.
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { CLIENT, SERVER, startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from '../helpers/otlp-receiver.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
const VERSION = '2025-11-25'
const TRACE = '5b8efff798038103d269b633813fc60c'
const PARENT = 'eee19b7ec3c1b174'

async function postTo (replica: ReplicaProcess, sid: string, body: unknown, headers: Record<string, string> = {}): Promise<Array<Record<string, unknown>>> {
  const res = await fetch(`${replica.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-protocol-version': VERSION, ...(sid === '' ? {} : { 'mcp-session-id': sid }), ...headers }, body: JSON.stringify(body) })
  if (res.status === 202) return []
  const reader = new SseReader(res)
  await reader.finished
  return reader.messages()
}

/** Two gateway processes on one Redis, tracing to an in-test OTLP receiver. */
async function twoReplicas (t: Test): Promise<{ receiver: OtlpReceiver, a: ReplicaProcess, b: ReplicaProcess }> {
  const redis = await startRedis(t)
  const receiver = await startOtlpReceiver(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 },
    tracing: { otlpEndpoint: receiver.url },
    servers: { full: stdioFixture('full-server') }
  }
  const [a, b] = await Promise.all([startReplica(t, 'A', config), startReplica(t, 'B', config)])
  return { receiver, a, b }
}

const replicaOf = (replica: ReplicaProcess): string => String(replica.logs.find(l => typeof l.replica === 'string')?.replica ?? '')

t.test('a request landing on a non-owner replica is one trace: SERVER span on B, CLIENT span on A', async t => {
  const { receiver, a, b } = await twoReplicas(t)

  const initRes = await fetch(`${a.url}/mcp/full`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'trace', version: '1' } } }) })
  const sid = initRes.headers.get('mcp-session-id') ?? ''
  await new SseReader(initRes).finished
  await postTo(b, sid, { jsonrpc: '2.0', method: 'notifications/initialized' })

  // Forced onto B, which does not own the child: the call crosses the bus to A.
  const [answer] = await postTo(b, sid, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'meta', arguments: {} } }, { traceparent: `00-${TRACE}-${PARENT}-01` })
  const backendMeta = JSON.parse((answer?.result as { content: Array<{ text: string }> }).content[0]?.text ?? '{}') as Record<string, unknown>

  // A graceful stop flushes each replica's batch of spans.
  await Promise.all([a.stop(), b.stop()])
  const spans = receiver.spans.filter(s => s.name === 'tools/call meta')
  const server = spans.find(s => s.kind === SERVER) as ReceivedSpan
  const client = spans.find(s => s.kind === CLIENT) as ReceivedSpan
  t.equal(spans.length, 2, 'one SERVER and one CLIENT span')
  t.ok(server !== undefined && client !== undefined)
  t.equal(server.instance, replicaOf(b), 'the SERVER span comes from B, which received the request')
  t.equal(client.instance, replicaOf(a), 'the CLIENT span comes from A, which owns the backend')
  t.not(replicaOf(a), replicaOf(b))
  t.equal(server.traceId, TRACE, 'the client\'s trace')
  t.equal(server.parentSpanId, PARENT, 'the client\'s span is the parent on B')
  t.equal(client.traceId, TRACE, 'one trace across the replicas')
  t.equal(client.parentSpanId, server.spanId, 'A\'s CLIENT span is a child of B\'s SERVER span (context in the bus envelope)')
  t.equal(backendMeta.traceparent, `00-${TRACE}-${client.spanId}-01`, 'the backend on A got the CLIENT span in _meta')
})

t.test('legacy HTTP+SSE: a POST on B for a stream held by A is one trace too', async t => {
  const { receiver, a, b } = await twoReplicas(t)
  const abort = new AbortController()
  t.teardown(() => { abort.abort() })
  // A opens the session: it holds the one stream and owns the child.
  const stream = new SseReader(await fetch(`${a.url}/sse/full`, { headers: { accept: 'text/event-stream' }, signal: abort.signal }))
  const endpoint = (await stream.until(events => events.some(e => e.event === 'endpoint'))).find(e => e.event === 'endpoint')?.data ?? ''
  const answered = (id: number): boolean => stream.events.some(e => e.event === 'message' && (JSON.parse(e.data) as { id?: unknown }).id === id)
  const postB = async (body: unknown, headers: Record<string, string> = {}): Promise<number> =>
    (await fetch(`${b.url}${endpoint}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })).status
  t.equal(await postB({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2024-11-05', capabilities: {}, clientInfo: { name: 'legacy', version: '1' } } }), 202)
  await stream.until(() => answered(0))
  await postB({ jsonrpc: '2.0', method: 'notifications/initialized' })
  t.equal(await postB({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, { traceparent: `00-${TRACE}-${PARENT}-01` }), 202)
  await stream.until(() => answered(1))
  abort.abort()
  await Promise.all([a.stop(), b.stop()])
  const server = receiver.spans.find(s => s.name === 'tools/call echo' && s.kind === SERVER) as ReceivedSpan
  const client = receiver.spans.find(s => s.name === 'tools/call echo' && s.kind === CLIENT) as ReceivedSpan
  t.equal(server?.instance, replicaOf(b), 'the SERVER span on B, ended once the POST was handed on (A writes the answer)')
  t.equal(server.parentSpanId, PARENT)
  t.equal(server.status, 0)
  t.equal(client?.instance, replicaOf(a))
  t.equal(client.traceId, TRACE)
  t.equal(client.parentSpanId, server.spanId)
})
