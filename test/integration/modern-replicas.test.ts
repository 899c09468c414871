// 2026-07-28 requests across replicas: two gateway processes on one Redis behind a
// non-sticky round-robin proxy, the v2 SDK client pinned to the modern revision. Stateless requests
// are served by whichever replica gets them (each with its own pool); an MRTR retry that lands on
// the other replica is forwarded to the one holding the parked call, which completes it; a listen
// stream on one replica hears a backend change made through the other.
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as TransportV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import { startModernUpstream } from '../fixtures/modern-upstream.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { eventually, textOf } from '../helpers/wait.js'
import { last, modernPost } from '../helpers/modern.js'

const V = '2026-07-28'

/** Two gateway processes on a Redis of their own, serving `servers`. */
async function twoReplicas (t: Test, servers: Record<string, unknown>): Promise<[ReplicaProcess, ReplicaProcess]> {
  const redis = await startRedis(t)
  const config = { redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 }, servers }
  return await Promise.all([startReplica(t, 'A', config), startReplica(t, 'B', config)])
}

t.test('stateless calls and MRTR rounds alternate between replicas; every call completes once', async t => {
  const legacyHttp = await startStreamableUpstream()
  t.teardown(legacyHttp.close)
  const replicas = await twoReplicas(t, { full: stdioFixture('full-server', [], { poolSize: 1 }), remote: { transport: 'streamable-http', url: legacyHttp.url } })
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const remote = new ClientV2({ name: 'modern-remote', version: '1' }, { versionNegotiation: { mode: { pin: V } } })
  await remote.connect(new TransportV2(new URL(`${proxy.url}/mcp/remote`)))
  t.teardown(async () => { await remote.close().catch(() => {}) })
  const remoteEchoes = await Promise.all([1, 2, 3, 4].map(async i => textOf(await remote.callTool({ name: 'echo', arguments: { message: `r${i}` } }))))
  t.same(remoteEchoes, [1, 2, 3, 4].map(i => `echo: r${i}`), 'a 2025 HTTP backend through both replicas\' pools')
  const client = new ClientV2({ name: 'modern-replicas', version: '1' }, {
    capabilities: { sampling: {}, elicitation: { form: {} } },
    versionNegotiation: { mode: { pin: V } }
  })
  client.setRequestHandler('sampling/createMessage', async request => {
    const first = request.params.messages[0]?.content
    return { role: 'assistant', model: 'm', content: { type: 'text', text: `sampled ${first !== undefined && !Array.isArray(first) && first.type === 'text' ? first.text : '?'}` } }
  })
  client.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { answer: 'yes' } }))
  await client.connect(new TransportV2(new URL(`${proxy.url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })

  const echoes = await Promise.all([1, 2, 3, 4, 5, 6].map(async i => textOf(await client.callTool({ name: 'echo', arguments: { text: `e${i}` } }))))
  t.same(echoes, [1, 2, 3, 4, 5, 6].map(i => `e${i}`), 'stateless calls answered on both replicas')

  // Each call is two HTTP requests (the round, then the retry); with strict alternation every
  // retry lands on the other replica than the one parking the call.
  for (let i = 0; i < 4; i++) {
    t.equal(textOf(await client.callTool({ name: 'sample', arguments: { prompt: `p${i}` } })), `sampled p${i}`, `sampling round ${i} completed across replicas`)
  }
  t.match(textOf(await client.callTool({ name: 'elicit', arguments: { message: 'ok?' } })), /"action":"accept"/, 'elicitation across replicas')

  // The audit lines come over each replica's stdout, the answers over sockets: wait for the lines.
  const completedLines = (): Array<Record<string, unknown>> => replicas.flatMap(r => r.logs).filter(l => l.audit === 'tools.call' && l.tool === 'sample' && l.outcome === 'ok')
  await eventually('the audit lines of the four sampling calls', () => completedLines().length >= 4 ? true : undefined).catch(() => {})
  const logs = replicas.flatMap(r => r.logs)
  t.equal(completedLines().length, 4, 'each sampling call completed exactly once on the backend')
  const resumed = logs.filter(l => l.msg === 'input_required retry resumed for a client of another replica')
  t.ok(resumed.length >= 4, `retries that landed on the other replica were forwarded to the parking one (${resumed.length})`)
})

t.test('a retry whose holder died gets -32007 within seconds, not silence', async t => {
  const [a, b] = await twoReplicas(t, { full: stdioFixture('full-server', [], { poolSize: 1 }) })
  const meta = { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': { sampling: {} } }
  const call = async (base: string, params: Record<string, unknown>): Promise<{ status: number, body: Record<string, unknown> }> => {
    const answer = await modernPost(`${base}/mcp/full`, 'tools/call', { name: 'sample', arguments: { prompt: 'x' }, _meta: meta, ...params })
    return { status: answer.status, body: last(answer) }
  }
  const round = (await call(a.url, {})).body.result as { requestState: string, inputRequests: Record<string, unknown> }
  t.type(round.requestState, 'string', 'the call is parked on A')
  await a.kill()
  const started = Date.now()
  const key = Object.keys(round.inputRequests)[0] as string
  const retry = await call(b.url, { requestState: round.requestState, inputResponses: { [key]: { role: 'assistant', model: 'm', content: { type: 'text', text: 'late' } } } })
  t.equal(retry.status, 502)
  t.match(retry.body, { id: 1, error: { code: -32007 } }, 'the retry is answered with -32007: the call died with its replica')
  t.ok(Date.now() - started < 10_000, `within seconds (${Date.now() - started} ms)`)
})

t.test('a listen stream on one replica hears a change made through another', async t => {
  const [a, b] = await twoReplicas(t, { full: stdioFixture('full-server', [], { poolSize: 1 }) })
  const listener = new ClientV2({ name: 'listener', version: '1' }, { versionNegotiation: { mode: { pin: V } } })
  const changed: unknown[] = []
  listener.setNotificationHandler('notifications/tools/list_changed', n => { changed.push(n) })
  await listener.connect(new TransportV2(new URL(`${a.url}/mcp/full`)))
  t.teardown(async () => { await listener.close().catch(() => {}) })
  const subscription = await listener.listen({ toolsListChanged: true })
  t.match(subscription.honoredFilter, { toolsListChanged: true }, 'listening on A')
  const res = await fetch(`${b.url}/mcp/full`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': V, 'mcp-method': 'tools/call', 'mcp-name': 'add-tool' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'add-tool', arguments: {}, _meta: { 'io.modelcontextprotocol/protocolVersion': V, 'io.modelcontextprotocol/clientCapabilities': {} } } })
  })
  t.equal(res.status, 200, 'the change is made through B')
  await res.text()
  await eventually('tools/list_changed reached the listen stream on A', () => changed.length > 0 ? true : undefined)
  t.equal(changed.length, 1, 'once')
  await subscription.close()
})

t.test('modern backend behind two replicas: 2026 requests relayed by either, a 2025 session bridged across them', async t => {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  const replicas = await twoReplicas(t, { modern: { transport: 'streamable-http', url: upstream.url } })
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const modern = new ClientV2({ name: 'modern', version: '1' }, { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: { pin: V } } })
  modern.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { ok: true } }))
  await modern.connect(new TransportV2(new URL(`${proxy.url}/mcp/modern`)))
  t.teardown(async () => { await modern.close().catch(() => {}) })
  const legacy = new ClientV1({ name: 'legacy', version: '1' }, { capabilities: { elicitation: {} } })
  legacy.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { ok: true } }))
  await legacy.connect(new TransportV1(new URL(`${proxy.url}/mcp/modern`)))
  t.teardown(async () => { await legacy.close().catch(() => {}) })
  for (let i = 0; i < 4; i++) {
    const [m, l] = await Promise.all([
      modern.callTool({ name: 'echo', arguments: { message: `m${i}` } }),
      legacy.callTool({ name: 'echo', arguments: { message: `l${i}` } })
    ])
    t.equal(textOf(m), `modern echo: m${i}`)
    t.equal(textOf(l), `modern echo: l${i}`)
  }
  t.equal(textOf(await modern.callTool({ name: 'confirm', arguments: {} })), 'confirmed: {"ok":true}', "the backend's own MRTR through either replica")
  t.equal(textOf(await legacy.callTool({ name: 'confirm', arguments: {} })), 'confirmed: {"ok":true}', 'the bridged session answers its round from any replica')
})
