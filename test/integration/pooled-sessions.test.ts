// Pooled sessions: sessions of a `sessions: pooled` stdio server share the (server,
// tenant) pool's children. Driven by the official SDK client (v1) over real sockets against a
// gateway in memory mode, with the full-server fixture as the real stdio backend. What is checked
// is what pooled sessions must do: children follow concurrency, nothing of one session reaches another,
// session-level notifications fan out, a busy pool answers 503 with Retry-After, tenants are bounded.
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema, LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema, ToolListChangedNotificationSchema, type ClientCapabilities
} from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { bearer, callTool, isolationTenants, newKey, openSession, post, PUBLIC_URL } from '../helpers/auth.js'
import { envelope, modernPost } from '../helpers/modern.js'
import { SseReader } from '../helpers/sse-client.js'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

const FULL_CAPABILITIES: ClientCapabilities = { sampling: {}, elicitation: {}, roots: { listChanged: true } }

function pooledFull (extra: Record<string, unknown> = {}): Record<string, unknown> {
  return stdioFixture('full-server', [], { sessions: 'pooled', ...extra })
}

async function gatewayWith (t: Test, server: Record<string, unknown>, extra: Record<string, unknown> = {}): Promise<RunningGateway> {
  return await startGateway(t, { servers: { full: server }, ...extra })
}

async function connect (t: Test, gw: RunningGateway, name: string, capabilities: ClientCapabilities = {}, legacy = false): Promise<Client> {
  const client = new Client({ name, version: '1.0.0' }, { capabilities })
  const transport = legacy
    ? new SSEClientTransport(new URL(`${gw.url}/sse/full`))
    : new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/full`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

/** The stdio children the gateway runs now (mcpgw_backend_children_by_mode on /metrics). */
async function children (gw: RunningGateway, mode: 'pooled' | 'dedicated'): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('mcpgw_backend_children_by_mode{') && l.includes('server="full"') && l.includes(`mode="${mode}"`))
  return Number(line?.split(' ').pop() ?? NaN)
}

/** Initialised connections of the pool of server `full` (mcpgw_pool_connections). */
async function readyConnections (gw: RunningGateway): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('mcpgw_pool_connections{server="full"}'))
  return Number(line?.split(' ').pop() ?? NaN)
}

t.test('poolSize children start at boot and after a reload, before any session; a failing child does not stop the gateway', async t => {
  const gw = await startGateway(t, { servers: { full: pooledFull({ poolSize: 3, poolMax: 4 }), broken: { transport: 'stdio', command: process.execPath, args: ['-e', 'process.exit(3)'], sessions: 'pooled', poolSize: 2 } } })
  // Started is not ready (a loaded machine takes seconds to initialise a child): wait for the pool's.
  await eventually('three warm connections', async () => await readyConnections(gw) === 3 ? true : undefined, 60_000, 250)
  t.equal(await children(gw, 'pooled'), 3, 'poolSize children of the pooled server, initialised, no session yet')
  // They are initialised: the first sessions and calls start no other child.
  const client = await connect(t, gw, 'warm')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'first' } })), 'first')
  const slept = await Promise.all([0, 1, 2].map(async () => textOf(await client.callTool({ name: 'slow', arguments: { ms: 300 } }))))
  t.same(slept, ['slept 300 ms', 'slept 300 ms', 'slept 300 ms'], 'three concurrent calls answered')
  t.equal(await children(gw, 'pooled'), 3, 'the warm ones: the session and its calls started no other child')
  const health = await fetch(`${gw.url}/healthz`)
  t.equal(health.status, 200, 'the gateway serves though the broken server never starts')
  // A reload that changes the server: its pool starts again at the new size.
  await gw.gateway.live.apply(parseConfig({ listen: { host: '127.0.0.1', port: 0 }, log: { level: 'silent' }, servers: { full: pooledFull({ poolSize: 2, poolMax: 4, requestTimeoutMs: 30_000 }) } }))
  await eventually('two warm connections after the reload', async () => await readyConnections(gw) === 2 && await children(gw, 'pooled') === 2 ? true : undefined, 60_000, 250)
  t.equal(await children(gw, 'pooled'), 2, 'the new poolSize')
})

t.test('twenty sessions share the pool: children follow concurrency, not sessions', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 2, poolMax: 4 }))
  const clients: Client[] = []
  for (let i = 0; i < 20; i++) clients.push(await connect(t, gw, `c${i}`))
  t.match(clients[0]?.getServerVersion(), { name: 'full-server' }, 'initialize answered with the backend server info')
  t.match(clients[0]?.getServerCapabilities(), { tools: { listChanged: true }, resources: { subscribe: true } }, 'and its capabilities')
  t.ok(await children(gw, 'pooled') <= 2, 'twenty initialised sessions hold no more children than poolSize')
  t.equal(await children(gw, 'dedicated'), 0, 'and none dedicated')
  // One at a time: the one warm connection serves them all.
  const sequential = new Set<string>()
  for (const c of clients) sequential.add(textOf(await c.callTool({ name: 'pid', arguments: {} })))
  t.equal(sequential.size, 1, 'sequential calls of twenty sessions run on one child')
  // All at once: at most poolMax children, every call answered with its own text.
  const answers = await Promise.all(clients.map(async (c, i) => textOf(await c.callTool({ name: 'echo', arguments: { text: `hello ${i}` } }))))
  t.same(answers, clients.map((_, i) => `hello ${i}`), 'each session gets its own answer')
  const slept = await Promise.all(clients.map(async c => textOf(await c.callTool({ name: 'slow', arguments: { ms: 200 } }))))
  t.ok(slept.every(s => s === 'slept 200 ms'), 'twenty concurrent slow calls all answered (five rounds of poolMax)')
  const pids = await Promise.all(clients.map(async c => textOf(await c.callTool({ name: 'pid', arguments: {} }))))
  t.ok(new Set(pids).size <= 4, `concurrent calls ran on at most poolMax children (${new Set(pids).size})`)
  t.ok(await children(gw, 'pooled') <= 4, 'no more than poolMax children')
})

t.test('nothing of one session reaches another: sampling, elicitation, roots, progress and logs of 24 concurrent sessions', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 2, poolMax: 6, poolWaitMs: 60_000 }))
  const N = 24
  let misdelivered = 0
  const sessions = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const client = new Client({ name: `iso-${i}`, version: '1.0.0' }, { capabilities: FULL_CAPABILITIES })
    client.setRequestHandler(CreateMessageRequestSchema, async req => {
      const prompt = (req.params.messages[0]?.content as { text?: string }).text
      if (prompt !== `prompt of ${i}`) misdelivered++
      return { role: 'assistant', content: { type: 'text', text: `sampled by ${i}` }, model: 'test' }
    })
    client.setRequestHandler(ElicitRequestSchema, async req => {
      if (req.params.message !== `question of ${i}`) misdelivered++
      return { action: 'accept', content: { answer: `answer of ${i}` } }
    })
    client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [{ uri: `file:///root-${i}`, name: `root ${i}` }] }))
    const logs: string[] = []
    client.setNotificationHandler(LoggingMessageNotificationSchema, n => { logs.push(`${n.params.level}:${String(n.params.data)}`) })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/full`)))
    t.teardown(async () => { await client.close().catch(() => {}) })
    // Half the sessions want only errors, half everything.
    const level = i % 2 === 0 ? 'error' : 'debug'
    await client.setLoggingLevel(level)
    return { client, logs, level, i }
  }))

  await Promise.all(sessions.map(async ({ client, i }) => {
    const progress: number[] = []
    const steps = 1 + (i % 4)
    const [sampled, elicited, roots, progressed, logged] = await Promise.all([
      client.callTool({ name: 'sample', arguments: { prompt: `prompt of ${i}` } }),
      client.callTool({ name: 'elicit', arguments: { message: `question of ${i}` } }),
      client.callTool({ name: 'roots', arguments: {} }),
      client.callTool({ name: 'progress', arguments: { steps, delayMs: 5 } }, undefined, { onprogress: p => { progress.push(p.progress) } }),
      client.callTool({ name: 'log', arguments: { count: 2, level: 'info' } })
    ])
    const wrong = (what: string, got: string): void => { misdelivered++; t.comment(`session ${i}: ${what} was ${got}`) }
    if (textOf(sampled) !== `sampled by ${i}`) wrong('sampling', textOf(sampled))
    if (!textOf(elicited).includes(`"answer of ${i}"`)) wrong('elicitation', textOf(elicited))
    if (!textOf(roots).includes(`"file:///root-${i}"`)) wrong('roots', textOf(roots))
    if (textOf(progressed) !== `done ${steps} steps` || progress.join(',') !== Array.from({ length: steps }, (_, k) => k + 1).join(',')) misdelivered++
    if (!/^sent \d of 2$/.test(textOf(logged))) misdelivered++
  }))
  t.equal(misdelivered, 0, 'no answer, progress, sampling, elicitation or roots request of one session reached another')

  await eventually('the debug sessions got their logs', () => sessions.filter(s => s.level === 'debug').every(s => s.logs.length === 2) ? true : undefined)
  for (const s of sessions) {
    if (s.level === 'error') t.equal(s.logs.length, 0, `session ${s.i} (level error) got no info logs`)
    else t.same(s.logs, ['info:log 1 of 2', 'info:log 2 of 2'], `session ${s.i} (level debug) got its own two logs`)
  }
})

t.test('a session that declared no sampling is never asked, and another session is not asked in its place', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolMax: 1 }))
  let asked = 0
  const other = await connect(t, gw, 'other', FULL_CAPABILITIES)
  other.setRequestHandler(CreateMessageRequestSchema, async () => { asked++; return { role: 'assistant', content: { type: 'text', text: 'x' }, model: 'm' } })
  const plain = await connect(t, gw, 'plain', {})
  const result = await plain.callTool({ name: 'sample', arguments: { prompt: 'p' } }).then(r => r, (err: Error) => ({ isError: true, content: [{ type: 'text', text: err.message }] }))
  t.equal(result.isError, true, 'the call fails')
  t.match(textOf(result), /does not support sampling|sampling/i, 'saying the client cannot sample')
  t.equal(asked, 0, 'the other session was not asked')
  t.equal(textOf(await other.callTool({ name: 'echo', arguments: { text: 'still fine' } })), 'still fine', 'the shared child carries on')
})

t.test('list_changed reaches every session of the server once; resources/updated only the subscribers', async t => {
  // One child, so the subscription and the change are on the same backend.
  const gw = await gatewayWith(t, pooledFull({ poolSize: 1, poolMax: 1 }))
  const changed = [0, 0, 0, 0]
  const updated = [0, 0, 0, 0]
  const clients = await Promise.all(changed.map(async (_, i) => {
    const c = await connect(t, gw, `fan-${i}`)
    c.setNotificationHandler(ToolListChangedNotificationSchema, () => { changed[i] = (changed[i] ?? 0) + 1 })
    c.setNotificationHandler(ResourceUpdatedNotificationSchema, () => { updated[i] = (updated[i] ?? 0) + 1 })
    return c
  }))
  // The SDK opens its GET stream after initialize: wait until the gateway holds all four.
  await eventually('four GET streams', async () => {
    const text = await (await fetch(`${gw.url}/metrics`)).text()
    return /mcpgw_client_streams_open\{stream="get"\} 4/.test(text) ? true : undefined
  })
  const [a, b, c, d] = clients as [Client, Client, Client, Client]
  await a.callTool({ name: 'add-tool', arguments: { name: 'fresh-tool' } })
  await eventually('every session heard list_changed', () => changed.every(n => n >= 1) ? true : undefined)
  await new Promise(resolve => setTimeout(resolve, 300))
  t.same(changed, [1, 1, 1, 1], 'each session heard it exactly once')
  t.ok((await d.listTools()).tools.some(tool => tool.name === 'fresh-tool'), 'and the new tool is listed')

  await a.subscribeResource({ uri: 'test://counter' })
  await b.subscribeResource({ uri: 'test://counter' })
  const touched = JSON.parse(textOf(await c.callTool({ name: 'touch-resource', arguments: {} })))
  t.equal(touched.subscribed, true, 'one upstream subscription for the two sessions')
  await eventually('both subscribers heard resources/updated', () => updated[0] === 1 && updated[1] === 1 ? true : undefined)
  await b.unsubscribeResource({ uri: 'test://counter' })
  await c.callTool({ name: 'touch-resource', arguments: {} })
  await eventually('the remaining subscriber heard it again', () => updated[0] === 2 ? true : undefined)
  await new Promise(resolve => setTimeout(resolve, 300))
  t.same(updated, [2, 1, 0, 0], 'resources/updated reached only the sessions subscribed at the time')
  await a.unsubscribeResource({ uri: 'test://counter' })
  const after = JSON.parse(textOf(await c.callTool({ name: 'touch-resource', arguments: {} })))
  t.equal(after.subscribed, false, 'the upstream subscription ends with the last subscriber')
})

t.test('a slow call does not stall other sessions\' quick calls', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 1, poolMax: 3 }))
  const slowClient = await connect(t, gw, 'slow')
  const quick = await Promise.all([0, 1, 2, 3, 4].map(async i => await connect(t, gw, `quick-${i}`)))
  let slowDone = false
  const slow = slowClient.callTool({ name: 'slow', arguments: { ms: 4000 } }).then(r => { slowDone = true; return r })
  await new Promise(resolve => setTimeout(resolve, 200))
  for (let round = 0; round < 4; round++) {
    const answers = await Promise.all(quick.map(async (c, i) => textOf(await c.callTool({ name: 'echo', arguments: { text: `q${round}.${i}` } }))))
    t.same(answers, quick.map((_, i) => `q${round}.${i}`), `round ${round} of quick calls answered`)
  }
  t.equal(slowDone, false, 'all quick calls were answered while the slow one still ran')
  t.equal(textOf(await slow), 'slept 4000 ms', 'and the slow one completes')
})

t.test('a pool at poolMax: a request waits, then gets 503 with Retry-After', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 1, poolMax: 1, poolWaitMs: 300 }))
  const holder = await connect(t, gw, 'holder')
  const raw = await openSession(gw.url, 'full', {})
  const slow = holder.callTool({ name: 'slow', arguments: { ms: 2500 } })
  await new Promise(resolve => setTimeout(resolve, 300))
  const res = await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, { 'mcp-session-id': raw.sid, 'mcp-protocol-version': raw.version })
  t.equal(res.status, 503, 'HTTP 503')
  t.equal(res.headers.get('retry-after'), '1', 'with Retry-After')
  const body = await res.json() as { id: unknown, error: { code: number, message: string, data: { retryAfter: number } } }
  t.equal(body.id, 7, 'the JSON-RPC error answers the request')
  t.equal(body.error.code, -32007, 'as a backend that cannot take it now')
  t.match(body.error.message, /busy/, 'saying the pool is busy')
  t.equal(textOf(await slow), 'slept 2500 ms', 'the running call is unaffected')
  const again = await callTool(gw.url, 'full', {}, raw, 'echo', { text: 'later' }, 8)
  t.equal((again.message?.result as { content: Array<{ text: string }> }).content[0]?.text, 'later', 'once the child is free the session is served')
  // A burst within the wait: each request waits its turn and is answered.
  const burst = await Promise.all([1, 2, 3].map(async i => await callTool(gw.url, 'full', {}, raw, 'slow', { ms: 50 }, 10 + i)))
  t.same(burst.map(b => b.status), [200, 200, 200], 'requests that fit the wait are served in turn')
})

t.test('legacy HTTP+SSE sessions run on the pool too', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolMax: 2 }))
  const client = new Client({ name: 'legacy', version: '1.0.0' }, { capabilities: FULL_CAPABILITIES })
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({ role: 'assistant', content: { type: 'text', text: 'legacy sample' }, model: 'm' }))
  await client.connect(new SSEClientTransport(new URL(`${gw.url}/sse/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  t.match(client.getServerVersion(), { name: 'full-server' })
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'over sse' } })), 'over sse')
  t.equal(textOf(await client.callTool({ name: 'sample', arguments: { prompt: 'p' } })), 'legacy sample', 'a server-to-client request reaches the legacy stream')
  t.equal(await children(gw, 'dedicated'), 0, 'no child of its own')
})

t.test('legacy HTTP+SSE: a pooled session answers initialize with the version the client asked for, as a dedicated one does', async t => {
  const gw = await startGateway(t, { servers: { full: pooledFull(), ded: stdioFixture('full-server') } })
  for (const server of ['full', 'ded']) {
    for (const asked of ['2025-06-18', '2024-11-05']) {
      const abort = new AbortController()
      const stream = new SseReader(await fetch(`${gw.url}/sse/${server}`, { headers: { accept: 'text/event-stream' }, signal: abort.signal }))
      t.teardown(() => { abort.abort() })
      const [endpoint] = await stream.until(events => events.some(e => e.event === 'endpoint'))
      const url = new URL(endpoint?.data ?? '', gw.url)
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: asked, capabilities: {}, clientInfo: { name: 'legacy-version', version: '1' } } })
      })
      t.equal(res.status, 202)
      // A dedicated child starts first: a loaded machine may take seconds.
      await stream.until(events => events.some(e => e.data.includes('"id":1')), 60_000)
      const answer = stream.events.filter(e => e.event !== 'endpoint' && e.data !== '').map(e => JSON.parse(e.data) as Record<string, unknown>).find(m => m.id === 1) as { result: { protocolVersion: string } }
      t.equal(answer.result.protocolVersion, asked, `${server === 'full' ? 'pooled' : 'dedicated'} session asked for ${asked} gets it`)
      abort.abort()
    }
  }
})

t.test('DELETE ends a pooled session: 404 after, the pool stays', async t => {
  const gw = await gatewayWith(t, pooledFull())
  const raw = await openSession(gw.url, 'full', {})
  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { 'mcp-session-id': raw.sid, 'mcp-protocol-version': raw.version } })
  t.equal(del.status, 200)
  const after = await callTool(gw.url, 'full', {}, raw, 'echo', { text: 'x' })
  t.equal(after.status, 404, 'the ended session is gone')
  t.ok(await children(gw, 'pooled') >= 1, 'its pool is not')
})

t.test('tenants: pools are per tenant, and limits.concurrentRequests bounds one tenant with 429 and Retry-After', async t => {
  const { owner, stranger, config } = isolationTenants()
  const tenants = config.tenants as Record<string, Record<string, unknown>>
  ;(tenants.acme as Record<string, unknown>).limits = { concurrentRequests: 2 }
  const gw = await startGateway(t, { ...config, servers: { full: pooledFull({ poolMax: 4 }) } })
  const mine = await openSession(gw.url, 'full', bearer(owner.key))
  const theirs = await openSession(gw.url, 'full', bearer(stranger.key))
  const pidOf = async (cred: Record<string, string>, s: { sid: string, version: string }): Promise<string> =>
    ((await callTool(gw.url, 'full', cred, s, 'pid', {}, 3)).message?.result as { content: Array<{ text: string }> }).content[0]?.text ?? ''
  t.not(await pidOf(bearer(owner.key), mine), await pidOf(bearer(stranger.key), theirs), 'two tenants never share a child')

  const slow = [1, 2].map(async i => await callTool(gw.url, 'full', bearer(owner.key), mine, 'slow', { ms: 1500 }, 20 + i))
  await new Promise(resolve => setTimeout(resolve, 300))
  const third = await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 30, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }, { ...bearer(owner.key), 'mcp-session-id': mine.sid, 'mcp-protocol-version': mine.version })
  t.equal(third.status, 429, 'a third request in flight is refused')
  t.equal(third.headers.get('retry-after'), '1', 'with Retry-After')
  t.match(await third.json(), { id: 30, error: { code: -32000, message: /requests at once/ } })
  const other = await callTool(gw.url, 'full', bearer(stranger.key), theirs, 'echo', { text: 'beta' }, 31)
  t.equal(other.status, 200, 'another tenant is not affected')
  const done = await Promise.all(slow)
  t.same(done.map(d => d.status), [200, 200], 'the two in flight complete')
  const fourth = await callTool(gw.url, 'full', bearer(owner.key), mine, 'echo', { text: 'after' }, 32)
  t.equal(fourth.status, 200, 'and slots come back when they end')
})

t.test('dedicated mode is unchanged: a child per session', async t => {
  const gw = await gatewayWith(t, stdioFixture('full-server'))
  const a = await connect(t, gw, 'a')
  const b = await connect(t, gw, 'b')
  t.not(textOf(await a.callTool({ name: 'pid', arguments: {} })), textOf(await b.callTool({ name: 'pid', arguments: {} })), 'two sessions, two children')
  t.equal(await children(gw, 'dedicated'), 2)
})

t.test('the v2 SDK client: a 2025-11-25 session and 2026-07-28 requests run on one pool', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 1, poolMax: 1 }))
  const v2 = async (pin: '2025-11-25' | '2026-07-28'): Promise<ClientV2> => {
    // 'legacy': a 2025-era session (initialize, Mcp-Session-Id); a pin of 2026-07-28: stateless requests.
    const client = new ClientV2({ name: `v2-${pin}`, version: '1' }, { capabilities: { sampling: {} }, versionNegotiation: { mode: pin === '2025-11-25' ? 'legacy' : { pin } } })
    client.setRequestHandler('sampling/createMessage', async () => ({ role: 'assistant', model: 'm', content: { type: 'text', text: `v2 ${pin} sampled` } }))
    await client.connect(new TransportV2(new URL(`${gw.url}/mcp/full`)))
    t.teardown(async () => { await client.close().catch(() => {}) })
    return client
  }
  const session = await v2('2025-11-25')
  const stateless = await v2('2026-07-28')
  t.equal(textOf(await session.callTool({ name: 'echo', arguments: { text: 'v2 session' } })), 'v2 session')
  t.equal(textOf(await session.callTool({ name: 'sample', arguments: { prompt: 'p' } })), 'v2 2025-11-25 sampled', 'sampling reaches the v2 session')
  t.equal(textOf(await stateless.callTool({ name: 'echo', arguments: { text: 'v2 modern' } })), 'v2 modern')
  const pids = [textOf(await session.callTool({ name: 'pid', arguments: {} })), textOf(await stateless.callTool({ name: 'pid', arguments: {} }))]
  t.equal(pids[0], pids[1], 'both eras ran on the one pooled child (poolMax 1)')
  t.equal(await children(gw, 'pooled'), 1, 'one child in all')
})

t.test('limits.concurrentRequests holds on the dedicated and 2026-07-28 paths too', async t => {
  const key = newKey('busy-bot')
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { ded: {}, full: {} }, limits: { concurrentRequestsPerSubject: 1 } } },
    servers: { ded: stdioFixture('full-server'), full: pooledFull() }
  })
  const cred = bearer(key.key)
  const ded = await openSession(gw.url, 'ded', cred)
  const slow = callTool(gw.url, 'ded', cred, ded, 'slow', { ms: 1500 }, 40)
  await new Promise(resolve => setTimeout(resolve, 300))
  const onDedicated = await callTool(gw.url, 'ded', cred, ded, 'echo', { text: 'x' }, 41)
  t.equal(onDedicated.status, 429, 'a second request of the subject on a dedicated session is refused')
  const modern = await modernPost(`${gw.url}/mcp/full`, 'tools/call', { name: 'echo', arguments: { text: 'x' }, _meta: envelope() }, 42, cred)
  t.equal(modern.status, 429, 'so is a 2026-07-28 request of the same subject')
  t.equal(modern.headers.get('retry-after'), '1')
  t.equal((await slow).status, 200, 'the one in flight completes')
  const later = await modernPost(`${gw.url}/mcp/full`, 'tools/call', { name: 'echo', arguments: { text: 'later' }, _meta: envelope() }, 43, cred)
  t.equal(later.status, 200, 'and the next is served')
})

t.test('a pooled session idle past sessions.idleTimeoutMs is gone (404); the pool is not', async t => {
  const gw = await startGateway(t, { sessions: { idleTimeoutMs: 1000 }, servers: { full: pooledFull() } })
  const raw = await openSession(gw.url, 'full', {})
  t.equal((await callTool(gw.url, 'full', {}, raw, 'echo', { text: 'x' })).status, 200)
  // Untouched (every request would refresh it) for twice the timeout.
  await new Promise(resolve => setTimeout(resolve, 2500))
  t.equal((await callTool(gw.url, 'full', {}, raw, 'echo', { text: 'x' }, 3)).status, 404, '404 once idle past the timeout')
  const fresh = await openSession(gw.url, 'full', {})
  t.equal((await callTool(gw.url, 'full', {}, fresh, 'echo', { text: 'y' })).status, 200, 'a new session is served at once')
})

t.test('a batch (2025-03-26) larger than poolMax is answered whole: its requests take connections as they come free', async t => {
  const gw = await gatewayWith(t, pooledFull({ poolSize: 1, poolMax: 2, poolWaitMs: 10_000 }))
  const init = await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-03-26', capabilities: {}, clientInfo: { name: 'batch', version: '1' } } })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await init.text()
  const headers = { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-03-26' }
  await (await post(gw.url, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/initialized' }, headers)).text()
  const batch = [1, 2, 3, 4, 5].map(id => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'slow', arguments: { ms: 100 } } }))
  const res = await post(gw.url, '/mcp/full', batch, headers)
  t.equal(res.status, 200)
  const messages = (res.headers.get('content-type') ?? '').includes('event-stream')
    ? await (async () => { const reader = new SseReader(res); await reader.finished; return reader.messages() })()
    : await res.json() as Array<Record<string, unknown>>
  const answered = messages.filter(m => 'result' in m).map(m => m.id).sort()
  t.same(answered, [1, 2, 3, 4, 5], 'five answers through a pool of two')
})
