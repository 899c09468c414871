// Three gateway processes, one Redis, and a round-robin load balancer with no
// stickiness. The official SDK client must not notice that its requests land on different
// replicas: requests, responses, GET-stream notifications, progress, logs, server-to-client
// requests, cancellation, resumption, DELETE, legacy SSE, a replica killed, Redis restarted.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema, LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema, ToolListChangedNotificationSchema
} from '@modelcontextprotocol/sdk/types.js'
import { Redis } from 'ioredis'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis, type RedisServer } from '../helpers/redis-server.js'
import { replicaKey, sessionKeys } from '../../src/state/redis/keys.js'
import { COMPLETED_STREAM_TTL_MS, POST_DEADLINE_GRACE_MS, WAKE_ENTRY_MAX_CHARS } from '../../src/routing/replica/streams.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'

const LEASE_MS = 1500

async function cluster (t: Test, n = 3, redis?: RedisServer, serverOptions: Record<string, unknown> = {}, leaseMs = LEASE_MS): Promise<{ redis: RedisServer, prefix: string, replicas: ReplicaProcess[], proxy: Awaited<ReturnType<typeof startRoundRobinProxy>> }> {
  const server = redis ?? await startRedis(t)
  const prefix = randomPrefix()
  const config = {
    // readinessGraceMs 0: the Redis restart test asserts that /readyz follows Redis at once.
    redis: { url: server.url, keyPrefix: prefix, leaseMs, connectTimeoutMs: 2000, readinessGraceMs: 0 },
    servers: { full: stdioFixture('full-server', [], serverOptions) }
  }
  const replicas = await Promise.all(['A', 'B', 'C', 'D'].slice(0, n).map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  return { redis: server, prefix, replicas, proxy }
}

async function connect (t: Test, url: string, legacy = false): Promise<Client> {
  const client = new Client({ name: 'multi', version: '1' }, { capabilities: { sampling: {}, elicitation: {}, roots: { listChanged: true } } })
  client.setRequestHandler(CreateMessageRequestSchema, async req => ({
    role: 'assistant', model: 'test-model', content: { type: 'text', text: `sampled: ${JSON.stringify(req.params.messages[0]?.content)}` }
  }))
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { answer: 'yes' } }))
  client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [{ uri: 'file:///tmp/root-a', name: 'a' }] }))
  const transport = legacy ? new SSEClientTransport(new URL(`${url}/sse/full`)) : new StreamableHTTPClientTransport(new URL(`${url}/mcp/full`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}



const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }

/** initialize on one replica (it owns the child), notifications/initialized on another; the session id. */
async function rawSession (initOn: ReplicaProcess, initializedOn: ReplicaProcess): Promise<string> {
  const init = await fetch(`${initOn.url}/mcp/full`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }) })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await new SseReader(init).finished
  await fetch(`${initializedOn.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
  return sid
}

t.test('the SDK client works through a non-sticky round-robin over 3 replicas', async t => {
  const { proxy } = await cluster(t)
  const client = await connect(t, proxy.url)

  // Requests and responses, spread over every replica.
  for (let i = 0; i < 6; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `n${i}` } })), `n${i}`)
  t.ok(proxy.counts.every(c => c >= 3), `every replica took requests: ${proxy.counts.join(',')}`)

  // Backend notifications for the session reach the GET stream, wherever it is held.
  const listChanged = new Promise<void>(resolve => client.setNotificationHandler(ToolListChangedNotificationSchema, async () => { resolve() }))
  await client.callTool({ name: 'add-tool', arguments: {} })
  await listChanged
  t.pass('tools/list_changed arrived')
  await client.subscribeResource({ uri: 'test://counter' })
  const updated = new Promise<string>(resolve => client.setNotificationHandler(ResourceUpdatedNotificationSchema, async n => { resolve(n.params.uri) }))
  await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } })
  t.equal(await updated, 'test://counter', 'resources/updated arrived')

  // Logs of a request, in order.
  const logs: unknown[] = []
  client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push(n.params.data) })
  await client.setLoggingLevel('debug')
  await client.callTool({ name: 'log', arguments: { count: 3, level: 'info' } })
  await eventually('3 log messages', async () => logs.length >= 3 ? true : undefined)
  t.equal(logs.length, 3)

  // Progress reaches the stream of the request that carried the token.
  const progress: number[] = []
  await client.callTool({ name: 'progress', arguments: { steps: 4, delayMs: 10 } }, undefined, { onprogress: p => { progress.push(p.progress) } })
  t.same(progress, [1, 2, 3, 4], 'every progress notification, in order')

  // Server-to-client requests raised by the child on the owner reach the client on another
  // replica's stream; the answers, POSTed to yet another, reach the child.
  t.match(textOf(await client.callTool({ name: 'sample', arguments: { prompt: 'hello' } })), /sampled: .*hello/)
  t.match(textOf(await client.callTool({ name: 'elicit', arguments: { message: 'ok?' } })), /accept/)
  t.match(textOf(await client.callTool({ name: 'roots', arguments: {} })), /root-a/)
})

t.test('cancellation POSTed to any replica reaches the child; DELETE ends the session everywhere', async t => {
  const { proxy } = await cluster(t)
  const client = await connect(t, proxy.url)
  const ac = new AbortController()
  const slow = client.callTool({ name: 'slow', arguments: { ms: 5000 } }, undefined, { signal: ac.signal })
  await new Promise(resolve => setTimeout(resolve, 300))
  ac.abort('test cancels')
  await t.rejects(slow)
  const cancelled = await eventually('the backend to see the cancellation', async () => {
    const list = JSON.parse(textOf(await client.callTool({ name: 'cancelled-requests', arguments: {} }))) as unknown[]
    return list.length > 0 ? list : undefined
  })
  t.equal(cancelled.length, 1, 'the child saw exactly one notifications/cancelled')

  const pid = Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))
  t.ok(pid > 0)
  const transport = client.transport as StreamableHTTPClientTransport
  const sid = transport.sessionId ?? ''
  await transport.terminateSession()
  await eventually('the child to stop', async () => { try { process.kill(pid, 0); return undefined } catch { return true } })
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`${proxy.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'tools/list' }) })
    t.equal(res.status, 404, `replica ${i}: the deleted session is gone`)
  }
})

t.test('legacy HTTP+SSE: the stream on one replica, the POSTs on others', async t => {
  const { proxy } = await cluster(t)
  const client = await connect(t, proxy.url, true)
  for (let i = 0; i < 4; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `legacy${i}` } })), `legacy${i}`)
  t.match(textOf(await client.callTool({ name: 'sample', arguments: { prompt: 'old' } })), /sampled/)
})

t.test('a stream dropped on one replica resumes on another with Last-Event-ID, nothing lost', async t => {
  const { replicas } = await cluster(t)
  const [a, b, c] = replicas as [ReplicaProcess, ReplicaProcess, ReplicaProcess]
  const headers = HEADERS
  const sid = await rawSession(a, b)
  const ac = new AbortController()
  const call = await fetch(`${b.url}/mcp/full`, {
    method: 'POST',
    headers: { ...headers, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'progress', arguments: { steps: 5, delayMs: 200 }, _meta: { progressToken: 'p' } } }),
    signal: ac.signal
  })
  const first = new SseReader(call)
  await first.until(ev => ev.some(e => e.data.includes('notifications/progress')))
  const seen = [...first.events]
  ac.abort()
  await new Promise(resolve => setTimeout(resolve, 1500)) // the answer arrives while the client is away
  const resumed = await fetch(`${c.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': seen[seen.length - 1]?.id ?? '' } })
  t.equal(resumed.status, 200)
  const rest = new SseReader(resumed)
  await rest.finished
  const all = [...seen, ...rest.events].filter(e => e.data !== '')
  const ids = all.map(e => e.id)
  t.equal(new Set(ids).size, ids.length, 'no message twice')
  const progress = all.filter(e => e.data.includes('notifications/progress')).map(e => (JSON.parse(e.data) as { params: { progress: number } }).params.progress)
  t.same(progress, [1, 2, 3, 4, 5], 'every progress notification exactly once, in order')
  t.ok(rest.messages().some(m => m.id === 7 && 'result' in m), 'the result came on the resumed stream')
})

t.test('owner replica killed with onOwnerLoss: end: its sessions get 404 quickly, other sessions are unaffected', async t => {
  // The default (carry-on) is tested in failover.test.ts.
  const { replicas } = await cluster(t, 3, undefined, { onOwnerLoss: 'end' })
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const onA = await connect(t, a.url) // initialize on A: A owns its child
  const onB = await connect(t, b.url)
  t.equal(textOf(await onA.callTool({ name: 'echo', arguments: { text: 'before' } })), 'before')
  const sidA = (onA.transport as StreamableHTTPClientTransport).sessionId ?? ''
  await a.kill()
  const started = Date.now()
  const status = await eventually('404 for the dead owner\'s session', async () => {
    const res = await fetch(`${b.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sidA }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) })
    await res.body?.cancel()
    return res.status === 404 ? res.status : undefined
  }, 15_000)
  t.equal(status, 404)
  t.ok(Date.now() - started < LEASE_MS * 4, `404 within a few leases (${Date.now() - started} ms)`)
  t.equal(textOf(await onB.callTool({ name: 'echo', arguments: { text: 'still here' } })), 'still here', 'the other session goes on')
})

t.test('Redis restart: /readyz follows Redis, new sessions get 503 meanwhile, then it recovers by itself', async t => {
  const { redis, replicas } = await cluster(t, 2)
  const [a] = replicas as [ReplicaProcess]
  t.equal((await fetch(`${a.url}/readyz`)).status, 200)
  await redis.stop()
  await eventually('/readyz to fail', async () => (await fetch(`${a.url}/readyz`)).status === 503 ? true : undefined)
  const res = await fetch(`${a.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }) })
  t.equal(res.status, 503, 'new session refused while Redis is down')
  await res.body?.cancel()
  t.equal((await fetch(`${a.url}/healthz`)).status, 200, 'the process itself is fine')
  await redis.restart()
  await eventually('/readyz to recover', async () => (await fetch(`${a.url}/readyz`)).status === 200 ? true : undefined, 15_000)
  const client = await connect(t, a.url)
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'back' } })), 'back', 'a new session works after the restart')
  t.ok(replicas.every(r => r.child.exitCode === null), 'no replica crashed')
})

t.test('leases and TTLs: every key has a TTL after real traffic; an owner that loses its lease stops its child', async t => {
  const { redis, prefix, proxy } = await cluster(t)
  const client = await connect(t, proxy.url)
  await client.callTool({ name: 'progress', arguments: { steps: 2, delayMs: 5 } }, undefined, { onprogress: () => {} })
  await client.callTool({ name: 'sample', arguments: { prompt: 'ttl' } })
  await client.callTool({ name: 'add-tool', arguments: {} })
  const pid = Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))
  const inspect = await testRedis(t, redis.url)
  const keys = await inspect.keys(`${prefix}*`)
  t.ok(keys.length >= 5, `the gateway wrote keys (${keys.length})`)
  const ttls = await Promise.all(keys.map(async key => [key, await inspect.pttl(key)] as const))
  t.same(ttls.filter(([, ttl]) => ttl < 0), [], 'no key without a TTL')
  // A completed call's log is kept for a late resume, briefly: not the session's idle timeout.
  const answered = ttls.filter(([key]) => /:ev:[rj]1_/.test(key))
  t.ok(answered.length >= 3, `the calls' logs are there (${answered.length})`)
  t.same(answered.filter(([, ttl]) => ttl > COMPLETED_STREAM_TTL_MS), [], 'each kept for at most a minute')

  const sid = (client.transport as StreamableHTTPClientTransport).sessionId ?? ''
  // Another replica holds the owner's lease now (as after it lapsed and was taken over); a lease
  // that lapsed and nobody took is claimed back instead (owner-lease.test).
  await inspect.set(sessionKeys(prefix, sid).owner, 'another-replica', 'PX', 60_000)
  await eventually('the owner to stop its child', async () => { try { process.kill(pid, 0); return undefined } catch { return true } }, LEASE_MS * 5)
  t.pass('the child stopped when its owner lost the lease')
})

t.test('a holder replica killed mid-stream: the client resumes on another replica, nothing lost', async t => {
  const { replicas } = await cluster(t)
  const [a, b, c] = replicas as [ReplicaProcess, ReplicaProcess, ReplicaProcess]
  const headers = HEADERS
  const sid = await rawSession(a, a)
  // A owns the child; B holds the POST stream of this call. Kill B while the call runs.
  const call = await fetch(`${b.url}/mcp/full`, {
    method: 'POST',
    headers: { ...headers, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'progress', arguments: { steps: 4, delayMs: 300 }, _meta: { progressToken: 9 } } })
  })
  const first = new SseReader(call)
  await first.until(ev => ev.some(e => e.data.includes('notifications/progress')))
  const seen = [...first.events]
  await b.kill()
  await first.finished
  const resumed = await fetch(`${c.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': seen[seen.length - 1]?.id ?? '' } })
  t.equal(resumed.status, 200)
  const rest = new SseReader(resumed)
  await rest.finished
  const all = [...seen, ...rest.events].filter(e => e.data !== '')
  const progress = all.filter(e => e.data.includes('notifications/progress')).map(e => (JSON.parse(e.data) as { params: { progress: number } }).params.progress)
  t.same(progress, [1, 2, 3, 4], 'every progress notification exactly once, in order')
  t.ok(rest.messages().some(m => m.id === 9 && 'result' in m), 'the result came on the stream resumed on C')
})

/**
 * A slow call (progress notifications) POSTed to `on`, read until its first progress, then `on`
 * is killed and its heartbeat removed (as if lapsed: the others see it gone at once). Returns the
 * last event id the client saw, to resume from.
 */
async function callThenKill (t: Test, on: ReplicaProcess, sid: string, redisUrl: string, prefix: string, steps: number, delayMs: number): Promise<string> {
  const call = await fetch(`${on.url}/mcp/full`, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'progress', arguments: { steps, delayMs }, _meta: { progressToken: 9 } } })
  })
  const first = new SseReader(call)
  await first.until(ev => ev.some(e => e.data.includes('notifications/progress')))
  const replica = on.logs.find(l => typeof l.replica === 'string')?.replica as string
  await on.kill()
  const inspect = await testRedis(t, redisUrl)
  await inspect.del(replicaKey(prefix, replica))
  return first.events[first.events.length - 1]?.id ?? ''
}

t.test('the replica that took a call dies, its owner lives: the call gets its result, not an error', async t => {
  const { replicas, prefix, redis } = await cluster(t)
  const [a, b, c] = replicas as [ReplicaProcess, ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a, a)
  // B takes the POST and routes it to A, the owner, which serves it; then B dies.
  const last = await callThenKill(t, b, sid, redis.url, prefix, 10, 300)
  const resumed = await fetch(`${c.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': last } })
  const rest = new SseReader(resumed)
  await rest.finished
  t.ok(rest.messages().some(m => m.id === 9 && 'result' in m), 'the result from A, the replica serving the call: B\'s death is no reason for an error')
})

t.test('a replica that went on serving a session another one had taken over dies: its calls in flight are answered', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const servers = { full: stdioFixture('full-server') }
  // A renews its lease only every 200 s, so it goes on serving a session it lost for that long
  // (a renewal during the test would find the lease taken and hand the call to B, or re-claim it):
  // the window a replica has between another one's takeover and its own next renewal, held open.
  const a = await startReplica(t, 'A', { redis: { url: redis.url, keyPrefix: prefix, leaseMs: 600_000, connectTimeoutMs: 2000 }, servers })
  const b = await startReplica(t, 'B', { redis: { url: redis.url, keyPrefix: prefix, leaseMs: LEASE_MS, connectTimeoutMs: 2000 }, servers })
  const sid = await rawSession(a, a)
  const inspect = await testRedis(t, redis.url)
  await inspect.del(sessionKeys(prefix, sid).owner) // A's lease as if it had lapsed; A does not know yet
  const echo = await fetch(`${b.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id: 8, method: 'tools/call', params: { name: 'echo', arguments: { text: 'b' } } }) })
  const echoed = new SseReader(echo)
  await echoed.finished
  t.ok(echoed.messages().some(m => m.id === 8 && 'result' in m), 'B took the session over')
  // A still has its relay and its own child: a call sent there is served there; then A dies.
  const last = await callThenKill(t, a, sid, redis.url, prefix, 50, 200)
  const resumed = await fetch(`${b.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': last } })
  t.equal(resumed.status, 200, 'the client resumes its stream on B')
  const rest = new SseReader(resumed)
  // Found within a beat or two when the machine is quiet; the bound is what a loaded one needs.
  const ended = await Promise.race([rest.finished.then(() => true), new Promise<false>(resolve => setTimeout(() => resolve(false), 20_000))])
  t.ok(ended, 'the resumed stream ends, with an answer')
  const answer = rest.messages().find(m => m.id === 9)
  t.equal((answer as { error?: { code?: number } } | undefined)?.error?.code, -32007, 'the call gets -32007: the replica serving it is gone')
})

/**
 * Two replicas (backend deadline 1 s) and a session whose owner is then made a replica that looks
 * alive (its heartbeat is there) but reads no envelope: what a message lost on the bus in a Redis
 * failover looks like from the other replica.
 */
async function ghostOwned (t: Test): Promise<{ a: ReplicaProcess, b: ReplicaProcess, sid: string }> {
  const { replicas, prefix, redis } = await cluster(t, 2, undefined, { requestTimeoutMs: 1000 })
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a, a)
  const inspect = await testRedis(t, redis.url)
  await inspect.set(sessionKeys(prefix, sid).owner, 'ghost', 'PX', 60_000)
  await inspect.set(replicaKey(prefix, 'ghost'), String(Date.now()), 'PX', 60_000)
  return { a, b, sid }
}

t.test('a call routed to an owner that never gets it (its bus envelope lost) is answered at the backend\'s deadline', async t => {
  const { b, sid } = await ghostOwned(t)
  const started = Date.now()
  const call = await fetch(`${b.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'echo', arguments: { text: 'lost' } } }) })
  const reader = new SseReader(call)
  const ended = await Promise.race([reader.finished.then(() => true), new Promise<false>(resolve => setTimeout(() => resolve(false), 1000 + POST_DEADLINE_GRACE_MS + 4000))])
  t.ok(ended, 'the POST stream ends')
  t.match(reader.messages().find(m => m.id === 5), { error: { code: -32006 } }, 'with -32006: the backend did not answer in time')
  t.ok(Date.now() - started >= 1000 + POST_DEADLINE_GRACE_MS - 100, 'after the backend\'s deadline and the grace, not before')
})

t.test('the same lost call, its POST stream dropped and resumed on another replica: answered there at the deadline', async t => {
  const { a, b, sid } = await ghostOwned(t)
  const ac = new AbortController()
  const call = await fetch(`${b.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id: 6, method: 'tools/call', params: { name: 'echo', arguments: { text: 'lost' } } }), signal: ac.signal })
  const first = new SseReader(call)
  await first.until(ev => ev.some(e => e.id !== undefined && e.id !== ''))
  const last = first.events[first.events.length - 1]?.id ?? ''
  ac.abort() // the client goes away before any answer, and comes back on A
  const resumed = await fetch(`${a.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'last-event-id': last } })
  t.equal(resumed.status, 200)
  const rest = new SseReader(resumed)
  const ended = await Promise.race([rest.finished.then(() => true), new Promise<false>(resolve => setTimeout(() => resolve(false), 1000 + POST_DEADLINE_GRACE_MS + 4000))])
  t.ok(ended, 'the resumed stream ends')
  t.match(rest.messages().find(m => m.id === 6), { error: { code: -32006 } }, 'with -32006, written by the deadline B kept after its client left')
})

t.test('round trips: a POST to the owner reads no record (marking checks it exists); a holder elsewhere gets the answer with its wake', async t => {
  const { replicas, prefix, redis } = await cluster(t, 2)
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a, a)
  const inspect = await testRedis(t, redis.url)
  const watcher = new Redis(redis.url, { lazyConnect: true })
  const monitor = await watcher.monitor()
  t.teardown(() => { monitor.disconnect(); watcher.disconnect() })
  const reads: string[] = []
  const logReads: string[] = []
  // Inbox writes: by a script of their own (sendEnvelope, one key), or inside the answer's append.
  const inboxSends: string[] = []
  const inboxWrites: string[] = []
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    const command = args[0]?.toLowerCase()
    if (command === 'hgetall' && args[1] === sessionKeys(prefix, sid).meta) reads.push(args[1])
    if (command === 'xrange' && args[1]?.startsWith(sessionKeys(prefix, sid).events('')) === true) logReads.push(args[1])
    if ((command === 'evalsha' || command === 'eval') && args[2] === '1' && args[3]?.startsWith(`${prefix}:inbox:`) === true) inboxSends.push(args[3])
    if (source === 'lua' && command === 'xadd' && args[1]?.startsWith(`${prefix}:inbox:`) === true) inboxWrites.push(args[1])
  })
  const call = async (on: ReplicaProcess, id: number): Promise<Response> => await fetch(`${on.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { text: `r${id}` } } }) })
  for (let id = 1; id <= 3; id++) {
    const reader = new SseReader(await call(a, id))
    await reader.finished
    t.ok(reader.messages().some(m => m.id === id && 'result' in m), `call ${id} on the owner answered`)
  }
  await new Promise(resolve => setTimeout(resolve, 100))
  inboxSends.length = 0
  inboxWrites.length = 0
  const routed = new SseReader(await call(b, 4))
  await routed.finished
  t.ok(routed.messages().some(m => m.id === 4 && 'result' in m), 'a call on the other replica answered')
  await eventually('the routed call\'s record read', () => reads.length >= 1 ? true : undefined)
  t.equal(reads.length, 1, 'the record was read for the other replica\'s call only')
  t.same(logReads, [], 'and no stream log was read back: the answer came with the wake to the replica holding the POST')
  await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(inboxWrites.length, 2, 'two envelopes for the routed call: the request to the owner, the answer\'s wake to the holder')
  t.equal(inboxSends.length, 1, 'and only the request went by a send of its own: the wake was written by the answer\'s append')
  t.not(inboxWrites[0], inboxWrites[1], 'one to each replica')
  const big = 'x'.repeat(WAKE_ENTRY_MAX_CHARS)
  const large = new SseReader(await fetch(`${b.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', id: 6, method: 'tools/call', params: { name: 'echo', arguments: { text: big } } }) }))
  await large.finished
  t.match(large.messages().find(m => m.id === 6), { result: { content: [{ text: big }] } }, 'a large answer arrives whole')
  await eventually('MONITOR to report the log read', () => logReads.length >= 1 ? true : undefined, 2_000).catch(() => undefined)
  t.ok(logReads.length >= 1, 'read from the log: the bus does not carry it twice')
  // Deleted as by another replica whose end-session envelope has not reached the owner yet.
  await inspect.del(sessionKeys(prefix, sid).meta)
  const gone = await call(a, 5)
  t.equal(gone.status, 404, 'a request to the owner for a session whose record is gone: 404')
  t.match(await gone.json(), { id: 5, error: { code: -32001 } })
})

t.test('concurrent GET streams for one session on different replicas: exactly one is served', async t => {
  // The default lease (10 s): with 1.5 s, a loaded CI machine once delayed a replica's renewal of
  // its stream's holder lease past it, and the other replica rightly took the lapsed stream.
  const { replicas } = await cluster(t, 2, undefined, {}, 10_000)
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const sid = await rawSession(a, b)
  const acs: AbortController[] = []
  t.teardown(() => { for (const ac of acs) ac.abort() })
  const statuses = await Promise.all(Array.from({ length: 20 }, async (_, i) => {
    const ac = new AbortController()
    acs.push(ac)
    const res = await fetch(`${(i % 2 === 0 ? a : b).url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal })
    return res.status
  }))
  t.equal(statuses.filter(s => s === 200).length, 1, `one 200 (${statuses.join(',')})`)
  t.equal(statuses.filter(s => s === 409).length, 19, 'every other one 409')
})
