// Tenant limits across replicas: three gateway processes, one Redis, a non-sticky
// round-robin balancer. One request budget and one session quota for the whole cluster, counted
// by what succeeded; the tool policy holds whichever replica a request or its backend lands on.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { initMessage, newKey, openSession, post, PUBLIC_URL, type TestKey } from '../helpers/auth.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'

const rateKey = newKey('rate-bot')
const quotaKey = newKey('quota-bot')
const policyKey = newKey('policy-bot')
const apiKey = (k: TestKey): Record<string, string> => ({ 'x-api-key': k.key })
const BURST = 12
const SESSIONS = 3

const redis = await startRedis(t)
const prefix = randomPrefix()
const config = {
  auth: { publicUrl: PUBLIC_URL },
  redis: { url: redis.url, keyPrefix: prefix, leaseMs: 1500, connectTimeoutMs: 2000 },
  tenants: {
    // One request per 100 s after the burst: nothing refills during the test.
    rated: { apiKeys: [rateKey.entry], servers: { full: {} }, limits: { requestsPerSecond: 0.01, burst: BURST } },
    quota: { apiKeys: [quotaKey.entry], servers: { full: {} }, limits: { sessions: SESSIONS } },
    policy: { apiKeys: [policyKey.entry], servers: { full: { tools: { allow: ['echo', 'pid'] } } } }
  },
  servers: { full: stdioFixture('full-server') }
}
const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))

t.test('the request budget is one budget for all replicas, not one per replica', async t => {
  const before = [...proxy.counts]
  const statuses = await Promise.all(Array.from({ length: BURST * 3 }, async () => {
    const res = await fetch(`${proxy.url}/mcp/full`, { headers: { accept: 'text/event-stream', ...apiKey(rateKey) } })
    await res.body?.cancel()
    return res.status
  }))
  t.equal(statuses.filter(s => s === 400).length, BURST, `exactly the burst of ${BURST} passed the limiter`)
  t.equal(statuses.filter(s => s === 429).length, BURST * 2, 'everything else was refused with 429')
  t.ok(proxy.counts.every((n, i) => n - (before[i] ?? 0) === BURST), 'every replica took its share of the requests')
  for (const replica of replicas) {
    const res = await fetch(`${replica.url}/mcp/full`, { headers: { accept: 'text/event-stream', ...apiKey(rateKey) } })
    t.equal(res.status, 429, `replica ${replica.name} refuses as well`)
    t.match(res.headers.get('retry-after'), /^[1-9][0-9]*$/)
  }
  const buckets = await (await testRedis(t, redis.url)).keys(`${prefix}:rl:*`)
  t.same(buckets, [`${prefix}:rl:{rated}:t`], 'one bucket under the tenant hash tag')
})

t.test('the session quota holds across replicas; a DELETE on another replica frees a slot', async t => {
  const sessions = []
  for (let i = 0; i < SESSIONS; i++) sessions.push(await openSession(proxy.url, 'full', apiKey(quotaKey)))
  for (const replica of replicas) {
    const res = await post(replica.url, '/mcp/full', initMessage(), apiKey(quotaKey))
    t.equal(res.status, 429, `replica ${replica.name} refuses the fourth session`)
    t.equal((await res.json() as { error: { data: { code: string } } }).error.data.code, 'GW_ERR_SESSION_QUOTA')
  }
  const first = sessions[0]!
  for (const replica of replicas) {
    // The DELETE lands on each replica in turn; only the one that finds the session ends it.
    await fetch(`${replica.url}/mcp/full`, { method: 'DELETE', headers: { ...apiKey(quotaKey), 'mcp-session-id': first.sid, 'mcp-protocol-version': first.version } })
  }
  await openSession(proxy.url, 'full', apiKey(quotaKey))
  t.pass('a new session took the freed slot')
  const again = await Promise.all(replicas.map(async r => (await post(r.url, '/mcp/full', initMessage(), apiKey(quotaKey))).status))
  t.same(again, [429, 429, 429], 'and the quota is full again everywhere')
  const zsets = await (await testRedis(t, redis.url)).keys(`${prefix}:q:*`)
  t.same(zsets, [`${prefix}:q:{quota}:t`], 'one quota set under the tenant hash tag')
})

t.test('the tool policy holds on every replica (SDK client through the balancer)', async t => {
  const client = new Client({ name: 'policy', version: '1' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/full`), { requestInit: { headers: apiKey(policyKey) } }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  for (let i = 0; i < 3; i++) {
    const { tools } = await client.listTools()
    t.same(tools.map(tool => tool.name).sort(), ['echo', 'pid'], `tools/list #${i + 1} is filtered`)
  }
  const pid = textOf(await client.callTool({ name: 'pid', arguments: {} }))
  for (let i = 0; i < 3; i++) {
    const err = await client.callTool({ name: 'crash', arguments: {} }).then(() => null, (e: unknown) => e)
    t.equal((err as McpError | null)?.code, -32602, `denied call #${i + 1}: unknown tool`)
  }
  t.equal(textOf(await client.callTool({ name: 'pid', arguments: {} })), pid, 'the backend never ran the denied calls')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'ok' } })), 'ok')
})

t.test('every refusal is one audit line with its reason, and no log holds a key', async t => {
  const logs = replicas.flatMap(r => r.logs)
  const lines = (fields: Record<string, unknown>): Array<Record<string, unknown>> => logs.filter(l => Object.entries(fields).every(([k, v]) => l[k] === v))
  const rated = lines({ audit: 'request.refused', reason: 'rate limit' })
  t.equal(rated.length, BURST * 2 + replicas.length, 'one line per 429 of the rate limit')
  t.match(rated[0], { tenant: 'rated', server: 'full', status: 429, subject: /^[0-9a-f]{32}$/ })
  const quota = lines({ audit: 'request.refused', reason: 'session quota' })
  t.ok(quota.length >= replicas.length * 2, 'quota refusals are audited')
  t.match(quota[0], { tenant: 'quota', server: 'full', status: 429 })
  const denied = lines({ audit: 'tools.call', outcome: 'denied' })
  t.equal(denied.length, 3)
  t.match(denied[0], { tenant: 'policy', server: 'full', tool: 'crash' })
  const text = JSON.stringify(logs)
  for (const key of [rateKey, quotaKey, policyKey]) {
    t.notOk(text.includes(key.key), `${key.id}: the API key is in no log line`)
    t.notOk(text.includes(`"${key.id}"`), `${key.id}: nor is the subject`)
  }
})
