// Tenant limits and tool policy on the wire: one gateway process with API-key tenants,
// a real stdio backend, raw fetch for the refusals and the official SDK client for the policy.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { initMessage, newKey, openSession, post, PUBLIC_URL, type TestKey } from '../helpers/auth.js'
import { startRedis, randomPrefix } from '../helpers/redis-server.js'
import { parseConfig } from '../../src/config/load.js'
import { eventually, textOf } from '../helpers/wait.js'
import { startStreamableUpstream } from '../fixtures/http-upstreams.js'

const alice = newKey('alice')
const bob = newKey('bob')
const other = newKey('other')
const apiKey = (k: TestKey): Record<string, string> => ({ 'x-api-key': k.key })

async function gateway (t: Test, acme: Record<string, unknown>, extra: Record<string, unknown> = {}): Promise<RunningGateway> {
  return await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [alice.entry, bob.entry], servers: { full: {} }, ...acme },
      beta: { apiKeys: [other.entry], servers: { full: {} }, limits: {} }
    },
    servers: { full: stdioFixture('full-server') },
    ...extra
  })
}

/** A cheap charged request: GET without a session id (400 when it passes the limiter). */
async function probe (gw: RunningGateway, key: TestKey): Promise<Response> {
  return await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', ...apiKey(key) } })
}

interface ErrorBody { jsonrpc: string, id: unknown, error: { code: number, message: string, data: { code: string, source: string } } }

t.test('rate limit: the burst, then 429 with an integer Retry-After and a JSON-RPC body', async t => {
  // A refill of one request per 100 s: nothing refills during the test.
  const gw = await gateway(t, { limits: { requestsPerSecond: 0.01, burst: 3 } })
  const statuses: number[] = []
  for (let i = 0; i < 3; i++) statuses.push((await probe(gw, alice)).status)
  t.same(statuses, [400, 400, 400], 'the burst passes the limiter (400: no session id)')
  const res = await probe(gw, bob)
  t.equal(res.status, 429, 'the tenant budget is shared by its subjects')
  const retryAfter = res.headers.get('retry-after')
  t.match(retryAfter, /^[1-9][0-9]*$/, 'Retry-After is a positive integer')
  t.ok(Number(retryAfter) > 90 && Number(retryAfter) <= 100, `about one interval (${retryAfter} s)`)
  const body = await res.json() as ErrorBody
  t.equal(body.jsonrpc, '2.0')
  t.equal(body.id, null)
  t.equal(body.error.code, -32000)
  t.equal(body.error.data.code, 'GW_ERR_RATE_LIMITED')
  t.equal((await post(gw.url, '/mcp/full', initMessage(), apiKey(alice))).status, 429, 'initialize too')
  t.equal((await probe(gw, other)).status, 400, 'another tenant is not limited')
  for (let i = 0; i < 10; i++) {
    t.equal((await fetch(`${gw.url}/healthz`)).status, 200)
    t.equal((await fetch(`${gw.url}/readyz`)).status, 200)
  }
})

t.test('rate limit per subject: one subject cannot spend the tenant budget', async t => {
  const gw = await gateway(t, { limits: { requestsPerSecond: 100, burst: 100, requestsPerSecondPerSubject: 0.01, burstPerSubject: 2 } })
  const aliceStatuses = []
  for (let i = 0; i < 4; i++) aliceStatuses.push((await probe(gw, alice)).status)
  t.same(aliceStatuses, [400, 400, 429, 429])
  t.equal((await probe(gw, bob)).status, 400, 'bob still has his budget')
})

t.test('limits follow a replaced tenant table (config reload) at once', async t => {
  const gw = await gateway(t, {})
  for (let i = 0; i < 5; i++) t.equal((await probe(gw, alice)).status, 400, 'no limits yet')
  gw.gateway.tenants.replace(parseConfig({
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [alice.entry], servers: { full: {} }, limits: { requestsPerSecond: 0.01, burst: 1, sessions: 1 } } },
    servers: { full: stdioFixture('full-server') }
  }))
  t.equal((await probe(gw, alice)).status, 400)
  t.equal((await probe(gw, alice)).status, 429, 'the new rate limit applies')
})

t.test('a tool policy follows a replaced tenant table, in sessions already open', async t => {
  const gw = await gateway(t, {})
  const client = new Client({ name: 'reload', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/full`), { requestInit: { headers: apiKey(alice) } }))
  t.teardown(() => client.close())
  t.ok((await client.listTools()).tools.length > 3, 'every tool before')
  gw.gateway.tenants.replace(parseConfig({
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [alice.entry], servers: { full: { tools: { allow: ['echo'] } } } } },
    servers: { full: stdioFixture('full-server') }
  }))
  t.same((await client.listTools()).tools.map(tool => tool.name), ['echo'], 'only echo after the reload')
  const err = await client.callTool({ name: 'pid', arguments: {} }).then(() => null, (e: unknown) => e)
  t.equal((err as McpError | null)?.code, -32602)
})

t.test('session quota: initialize beyond it is 429; DELETE frees the slot', async t => {
  const gw = await gateway(t, { limits: { sessions: 3, sessionsPerSubject: 2 } })
  const a1 = await openSession(gw.url, 'full', apiKey(alice))
  await openSession(gw.url, 'full', apiKey(alice))
  const refused = await post(gw.url, '/mcp/full', initMessage(), apiKey(alice))
  t.equal(refused.status, 429, 'alice is at her quota of 2')
  t.match(refused.headers.get('retry-after'), /^[1-9][0-9]*$/, 'with an integer Retry-After, as every 429')
  const body = await refused.json() as ErrorBody
  t.equal(body.id, 1, 'the error answers the initialize request')
  t.equal(body.error.data.code, 'GW_ERR_SESSION_QUOTA')
  t.match(body.error.message, /quota of 2 open sessions/)
  await openSession(gw.url, 'full', apiKey(bob))
  const tenantFull = await post(gw.url, '/mcp/full', initMessage(), apiKey(bob))
  t.equal(tenantFull.status, 429, 'acme is at its quota of 3')
  t.match((await tenantFull.json() as ErrorBody).error.message, /tenant 'acme'/)
  await openSession(gw.url, 'full', apiKey(other))
  t.pass('another tenant is not affected')

  const del = await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers: { ...apiKey(alice), 'mcp-session-id': a1.sid, 'mcp-protocol-version': a1.version } })
  t.equal(del.status, 200)
  await openSession(gw.url, 'full', apiKey(alice))
  t.pass('the deleted session\'s slot is free again')
  t.equal((await post(gw.url, '/mcp/full', initMessage(), apiKey(bob))).status, 429, 'and the quota holds again')
})

t.test('session quota: idle expiry frees the slot', async t => {
  const gw = await gateway(t, { limits: { sessionsPerSubject: 1 } }, { sessions: { idleTimeoutMs: 1000 } })
  await openSession(gw.url, 'full', apiKey(alice))
  t.equal((await post(gw.url, '/mcp/full', initMessage(), apiKey(alice))).status, 429)
  await eventually('the idle session expired', async () => {
    const res = await post(gw.url, '/mcp/full', initMessage(), apiKey(alice))
    await res.body?.cancel()
    return res.status === 200 ? true : undefined
  }, 10_000)
  t.pass('a new session once the idle one expired')
})

t.test('legacy HTTP+SSE: the quota applies to GET /sse too', async t => {
  const gw = await gateway(t, { limits: { sessionsPerSubject: 1 } })
  const first = await fetch(`${gw.url}/sse/full`, { headers: { accept: 'text/event-stream', ...apiKey(alice) } })
  t.equal(first.status, 200)
  const second = await fetch(`${gw.url}/sse/full`, { headers: { accept: 'text/event-stream', ...apiKey(alice) } })
  t.equal(second.status, 429)
  t.equal((await second.json() as ErrorBody).error.data.code, 'GW_ERR_SESSION_QUOTA')
  await first.body?.cancel()
})

t.test('tool policy through the SDK client: tools/list filtered, a denied call never reaches the backend', async t => {
  const gw = await gateway(t, { servers: { full: { tools: { allow: ['echo', 'add*', 'pid'], deny: ['add-*'] } } } })
  const client = new Client({ name: 'policy-test', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/full`), { requestInit: { headers: apiKey(alice) } }))
  t.teardown(() => client.close())
  const { tools } = await client.listTools()
  t.same(tools.map(tool => tool.name).sort(), ['add', 'echo', 'pid'], 'only allowed tools, deny wins over add*')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'hi' } })), 'hi')
  const pid = textOf(await client.callTool({ name: 'pid', arguments: {} }))
  for (const name of ['add-tool', 'crash', 'no-such-tool']) {
    const err = await client.callTool({ name, arguments: {} }).then(() => null, (e: unknown) => e)
    t.ok(err instanceof McpError, `${name}: a JSON-RPC error`)
    t.equal((err as McpError).code, -32602, `${name}: unknown tool`)
    t.match((err as McpError).message, `Unknown tool: ${name}`)
  }
  // 'crash' would have killed the child: the same child still answers, so no denied call reached it.
  t.equal(textOf(await client.callTool({ name: 'pid', arguments: {} })), pid, 'the backend never saw the denied calls')
  const { tools: after } = await client.listTools()
  t.notOk(after.some(tool => tool.name.startsWith('add-tool')), 'add-tool was not run either')
})

t.test('tool policy on a Streamable HTTP backend (direct session): the upstream never sees a denied call', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [alice.entry], servers: { remote: { tools: { deny: ['hang', 'ask-*'] } } } } },
    servers: { remote: { transport: 'streamable-http', url: upstream.url } }
  })
  const client = new Client({ name: 'policy-http', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/remote`), { requestInit: { headers: apiKey(alice) } }))
  t.teardown(() => client.close())
  t.same((await client.listTools()).tools.map(tool => tool.name).sort(), ['echo', 'progress-log'])
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'hi' } })), 'echo: hi')
  for (const name of ['hang', 'ask-sampling']) {
    const err = await client.callTool({ name, arguments: {} }).then(() => null, (e: unknown) => e)
    t.equal((err as McpError | null)?.code, -32602, `${name}: unknown tool`)
  }
  const called = upstream.requests.flatMap(r => {
    const body = r.body as { method?: string, params?: { name?: string } } | undefined
    return body?.method === 'tools/call' ? [body.params?.name] : []
  })
  t.same(called, ['echo'], 'only the allowed call reached the upstream')
})

t.test('tool policy: a denied tools/call is a 200 whose JSON-RPC answer is -32602 (raw wire)', async t => {
  const gw = await gateway(t, { servers: { full: { tools: { deny: ['echo'] } } } })
  const session = await openSession(gw.url, 'full', apiKey(alice))
  const res = await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } },
    { ...apiKey(alice), 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version })
  t.equal(res.status, 200)
  const text = await res.text()
  t.match(text, /"id":7/)
  t.match(text, /"code":-32602/)
  t.match(text, /Unknown tool: echo/)
})

t.test('Redis down: requests of a rate-limited tenant fail closed with 503 and Retry-After', async t => {
  const redis = await startRedis(t)
  const gw = await gateway(t, { limits: { requestsPerSecond: 50 } }, { redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 1000 } })
  t.equal((await probe(gw, alice)).status, 400, 'charged and passed while Redis is up')
  await redis.stop()
  const res = await eventually('the limiter notices Redis is gone', async () => {
    const r = await probe(gw, alice)
    return r.status === 503 ? r : undefined
  })
  t.match(res.headers.get('retry-after'), /^[1-9][0-9]*$/)
  t.equal((await res.json() as ErrorBody).error.data.code, 'GW_ERR_STORE_UNAVAILABLE')
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, '/healthz is not limited and stays up')
  await redis.restart()
  await eventually('requests pass again once Redis is back', async () => (await probe(gw, alice)).status === 400 ? true : undefined)
  t.pass('recovered without a restart')
})
