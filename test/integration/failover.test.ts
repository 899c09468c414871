// Failover without loss. Three gateway processes on one Redis behind a non-sticky
// round-robin balancer, the official SDK client and raw HTTP. The replica running a session's
// stdio child is SIGKILLed: the session carries on elsewhere (its child restarted and
// re-initialised with the client's setup), requests in flight get -32007, nothing ends in silence.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis, type RedisServer } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess, type RoundRobinProxy } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { startLegacyUpstream } from '../fixtures/http-upstreams.js'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

interface Cluster { redis: RedisServer, prefix: string, replicas: ReplicaProcess[], proxy: RoundRobinProxy }

async function cluster (t: Test, server: Record<string, unknown> = {}, n = 3): Promise<Cluster> {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  // The default lease (10 s): a dead owner must be noticed from its heartbeat, not its lease.
  // readinessGraceMs 0: the Redis-outage test below asserts /readyz turns 503 at once.
  const config = { redis: { url: redis.url, keyPrefix: prefix, connectTimeoutMs: 2000, readinessGraceMs: 0 }, servers: { full: stdioFixture('full-server', [], server) } }
  const replicas = await Promise.all(['A', 'B', 'C'].slice(0, n).map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  return { redis, prefix, replicas, proxy }
}

/** The replica id a process logs with. */
function replicaIdOf (replica: ReplicaProcess): string {
  const line = replica.logs.find(l => typeof l.replica === 'string')
  return String(line?.replica)
}

async function ownerOf (c: Cluster, t: Test, sid: string): Promise<ReplicaProcess> {
  const inspect = await testRedis(t, c.redis.url)
  const owner = await inspect.get(sessionKeys(c.prefix, sid).owner)
  const replica = c.replicas.find(r => replicaIdOf(r) === owner)
  if (replica === undefined) throw new Error(`no replica owns the session (owner ${String(owner)})`)
  return replica
}

async function connect (t: Test, url: string): Promise<Client> {
  const client = new Client({ name: 'failover', version: '1' }, { capabilities: {} })
  const debugFetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const res = await fetch(input, init)
    if (process.env.FAILOVER_DEBUG !== undefined) {
      const h = new Headers(init?.headers)
      console.error('FETCH', new Date().toISOString(), init?.method, h.get('last-event-id'), res.status, init?.body === undefined ? '' : String(init.body).slice(0, 80))
    }
    return res
  }
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/full`), { fetch: debugFetch }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

/** A raw POST of one request; the JSON-RPC messages of its stream (or its plain HTTP status). */
async function rawCall (url: string, sid: string, id: number, method = 'tools/list', params?: unknown): Promise<{ status: number, messages: Array<Record<string, unknown>> }> {
  const res = await fetch(`${url}/mcp/full`, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' },
    body: JSON.stringify({ jsonrpc: '2.0', id, method, ...(params !== undefined ? { params } : {}) }),
    signal: AbortSignal.timeout(20_000)
  })
  if (res.status !== 200) { await res.body?.cancel(); return { status: res.status, messages: [] } }
  const reader = new SseReader(res)
  await reader.finished
  return { status: res.status, messages: reader.messages() }
}

async function rawSession (url: string): Promise<string> {
  const init = await fetch(`${url}/mcp/full`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }) })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await new SseReader(init).finished
  const ack = await fetch(`${url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  await ack.body?.cancel()
  return sid
}

t.test('owner SIGKILLed: the session carries on elsewhere with its setup replayed; in-flight calls get -32007', async t => {
  const c = await cluster(t)
  const client = await connect(t, c.proxy.url)
  const sid = (client.transport as StreamableHTTPClientTransport).sessionId ?? ''
  await client.setLoggingLevel('error')
  await client.subscribeResource({ uri: 'test://counter' })
  t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 2, level: 'info' } })), 'sent 0 of 2', 'log level error is in force')
  const before = JSON.parse(textOf(await client.callTool({ name: 'touch-resource', arguments: {} }))) as { subscribed: boolean, counter: number }
  t.ok(before.subscribed, 'subscribed before')
  const oldPid = Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))
  const owner = await ownerOf(c, t, sid)

  // Calls in flight on the owner when it dies.
  const inFlight = [1, 2, 3].map(async () => await client.callTool({ name: 'slow', arguments: { ms: 30_000 } }).then(() => null, (err: unknown) => err))
  await new Promise(resolve => setTimeout(resolve, 500))
  const killedAt = Date.now()
  await owner.kill()
  // The balancer's health check notices the dead replica.
  c.proxy.setTargets(c.replicas.filter(r => r !== owner).map(r => r.url))

  const errors = await Promise.all(inFlight)
  const waited = Date.now() - killedAt
  for (const err of errors) {
    t.ok(err instanceof McpError, 'an in-flight call ended with a JSON-RPC error')
    t.equal((err as McpError).code, -32007, 'code -32007')
    t.match((err as McpError).message, /lost with the replica/, 'saying the backend was lost')
    t.match((err as McpError).data, { source: 'gateway', code: 'GW_ERR_BACKEND_LOST' })
  }
  t.ok(waited < 15_000, `answered within seconds, not at the client's timeout (${waited} ms)`)
  if (process.env.FAILOVER_DEBUG !== undefined) {
    for (const r of c.replicas) for (const l of r.logs) if (l.level as number >= 40 || (l.msg === 'request' && l.method !== 'POST')) console.error(r.name, JSON.stringify(l))
  }

  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'after' } })), 'after', 'the next call works')
  t.equal((client.transport as StreamableHTTPClientTransport).sessionId, sid, 'same session id')
  const newPid = Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))
  t.not(newPid, oldPid, 'on a new child')
  t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 2, level: 'info' } })), 'sent 0 of 2', 'the log level was replayed')
  const after = JSON.parse(textOf(await client.callTool({ name: 'touch-resource', arguments: {} }))) as { subscribed: boolean, counter: number }
  t.ok(after.subscribed, 'the subscription was replayed')
  t.equal(after.counter, 1, 'the backend\'s in-memory state is lost (a fresh counter), as documented')
  const newOwner = await ownerOf(c, t, sid)
  t.not(newOwner, owner, 'another replica owns the session now')
  for (let i = 0; i < 4; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `n${i}` } })), `n${i}`)
})

t.test('no silence: every POST after an owner kill gets exactly one answer; the session goes on', async t => {
  const c = await cluster(t)
  const [a, b, cc] = c.replicas as [ReplicaProcess, ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a.url) // A owns the child
  t.equal((await rawCall(b.url, sid, 1)).status, 200)
  await a.kill()
  const started = Date.now()
  // Right after the kill (A's heartbeat still lives), then on: each POST gets one answer, a
  // result or -32007, never an empty stream.
  for (let i = 0; i < 6; i++) {
    const target = i % 2 === 0 ? b : cc
    const { status, messages } = await rawCall(target.url, sid, 10 + i)
    t.equal(status, 200, `POST ${i}: 200`)
    const answers = messages.filter(m => m.id === 10 + i)
    t.equal(answers.length, 1, `POST ${i}: exactly one answer (${JSON.stringify(answers[0])?.slice(0, 120)})`)
    const answer = answers[0] ?? {}
    t.ok('result' in answer || (answer.error as { code?: number } | undefined)?.code === -32007, `POST ${i}: a result or -32007`)
  }
  t.ok(Date.now() - started < 20_000, `all answered within seconds (${Date.now() - started} ms)`)
  const last = await rawCall(b.url, sid, 99)
  t.ok('result' in (last.messages.find(m => m.id === 99) ?? {}), 'the session works on')
})

t.test('onOwnerLoss: end: the session of a dead owner is a plain 404, and no log keys come back', async t => {
  const c = await cluster(t, { onOwnerLoss: 'end' })
  const [a, b] = c.replicas as [ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a.url)
  t.equal((await rawCall(b.url, sid, 1)).status, 200)
  await a.kill()
  const status = await eventually('a plain 404', async () => {
    const { status, messages } = await rawCall(b.url, sid, 2)
    if (status === 200) {
      // Before the heartbeat expired: the request still gets its one answer, -32007.
      t.equal(messages.filter(m => m.id === 2 && (m.error as { code?: number } | undefined)?.code === -32007).length, 1, 'a -32007 answer, not an empty stream')
      return undefined
    }
    return status
  }, 15_000)
  t.equal(status, 404, '404 before any stream is opened')
  const inspect = await testRedis(t, c.redis.url)
  await new Promise(resolve => setTimeout(resolve, 500))
  t.same(await inspect.keys(`${c.prefix}:{${sid}}*`), [], 'no key of the deleted session is recreated')
})

t.test('Redis goes away mid-call: the call gets a JSON-RPC error, /readyz 503', async t => {
  const c = await cluster(t, {}, 1)
  const [a] = c.replicas as [ReplicaProcess]
  const client = await connect(t, a.url)
  const call = client.callTool({ name: 'slow', arguments: { ms: 20_000 } }).then(() => null, (err: unknown) => err)
  await new Promise(resolve => setTimeout(resolve, 300))
  const stoppedAt = Date.now()
  await c.redis.stop()
  const err = await call
  t.ok(err instanceof McpError, 'the call ended with a JSON-RPC error')
  t.match((err as McpError).message, /store/i, 'saying the store is unreachable')
  t.ok(Date.now() - stoppedAt < 10_000, `within seconds (${Date.now() - stoppedAt} ms)`)
  t.equal((await fetch(`${a.url}/readyz`)).status, 503, '/readyz 503 while Redis is down')
})

t.test('a legacy `sse` upstream session outlives its owner too', async t => {
  const upstream = await startLegacyUpstream()
  t.teardown(async () => { await upstream.close() })
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const config = { redis: { url: redis.url, keyPrefix: prefix, connectTimeoutMs: 2000 }, servers: { legacy: { transport: 'sse', url: upstream.url } } }
  const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const c: Cluster = { redis, prefix, replicas, proxy }
  const client = new Client({ name: 'failover-legacy', version: '1' }, { capabilities: {} })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/legacy`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'before' } })), 'echo: before')
  const sid = (client.transport as StreamableHTTPClientTransport).sessionId ?? ''
  const owner = await ownerOf(c, t, sid)
  await owner.kill()
  proxy.setTargets(replicas.filter(r => r !== owner).map(r => r.url))
  const after = await eventually('the next call to work', async () => {
    try { return textOf(await client.callTool({ name: 'echo', arguments: { message: 'after' } })) } catch { return undefined }
  }, 20_000)
  t.equal(after, 'echo: after', 'the session carries on over a new upstream connection')
  t.not(await ownerOf(c, t, sid), owner, 'owned by another replica now')
})
