// Adversarial review of tenant limits (docs/authentication.md): a 429 is a clean answer (integer
// Retry-After, JSON-RPC body); a client cannot dodge the request budget with batches or
// notifications; a failed initialize leaks no session slot; /healthz, /readyz and /metrics are
// never limited. Real gateway, real stdio backend, raw fetch.
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { bearer, initMessage, newKey, post, PUBLIC_URL } from '../helpers/auth.js'
import { SseReader } from '../helpers/sse-client.js'
import { randomPrefix, startRedis, type RedisServer } from '../helpers/redis-server.js'

const key = newKey('ci-bot')
const cred = bearer(key.key)

/** Set for the second pass: the same attacks with the Redis twins (limit scripts, quota sets). */
let redis: RedisServer | undefined

async function gateway (t: Test, limits: Record<string, unknown>): Promise<RunningGateway> {
  return await startGateway(t, {
    ...(redis === undefined ? {} : { redis: { url: redis.url, keyPrefix: randomPrefix() } }),
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { full: {}, broken: {} }, limits } },
    servers: { full: stdioFixture('full-server'), broken: { transport: 'stdio', command: '/nonexistent/mcp-server' } }
  })
}

/** A session at 2025-03-26, the last version with JSON-RPC batches (two requests charged). */
async function session (base: string): Promise<Record<string, string>> {
  const res = await post(base, '/mcp/full', initMessage(1, '2025-03-26'), cred)
  const sid = res.headers.get('mcp-session-id')
  if (res.status !== 200 || sid === null) throw new Error(`initialize got ${res.status}`)
  await new SseReader(res).until(ev => ev.some(e => e.data.includes('"result"')))
  const headers = { ...cred, 'mcp-session-id': sid, 'mcp-protocol-version': '2025-03-26' }
  const ack = await post(base, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/initialized' }, headers)
  if (ack.status !== 202) throw new Error(`initialized got ${ack.status}`)
  return headers
}

async function expect429 (t: Test, res: Response, what: string): Promise<void> {
  t.equal(res.status, 429, `${what}: 429`)
  t.match(res.headers.get('retry-after'), /^[1-9][0-9]*$/, `${what}: an integer Retry-After`)
  t.match(await res.json(), { jsonrpc: '2.0', error: { code: -32000, data: { code: 'GW_ERR_RATE_LIMITED' } } }, `${what}: a JSON-RPC error body`)
}

const pings = (n: number, from = 100): unknown[] => Array.from({ length: n }, (_, i) => ({ jsonrpc: '2.0', id: from + i, method: 'ping' }))

function attacks (t: Test): void {
  t.test('a batch is charged one request per message', async t => {
    // 0.01/s: nothing refills during the test; a budget of 10 requests.
    const gw = await gateway(t, { requestsPerSecond: 0.01, burst: 10 })
    const headers = await session(gw.url) // 2 spent
    const ok = await post(gw.url, '/mcp/full', pings(3), headers) // 3 more: 5 spent
    t.equal(ok.status, 200, 'a batch within the budget passes')
    await ok.body?.cancel()
    // 6 more would make 11: refused (the HTTP request itself costs 1: 6 spent).
    await expect429(t, await post(gw.url, '/mcp/full', pings(6, 200), headers), 'a batch beyond the budget')
    // A batch bigger than the whole burst could never pass: 400 saying so, not a 429 to retry forever (7 spent).
    const huge = await post(gw.url, '/mcp/full', pings(50, 300), headers)
    t.equal(huge.status, 400, 'a batch beyond the burst')
    t.match(await huge.json(), { jsonrpc: '2.0', error: { code: -32600, message: /at most 10 messages/ } }, 'says how many fit')
    // The refused batches cost only their HTTP request: 3 are left, a batch of 3 passes.
    const rest = await post(gw.url, '/mcp/full', pings(3, 400), headers)
    t.equal(rest.status, 200, 'the refused batches cost only their request')
    await rest.body?.cancel()
    await expect429(t, await post(gw.url, '/mcp/full', pings(1, 500)[0], headers), 'the budget is spent')
    await expect429(t, await post(gw.url, '/mcp/full', pings(2, 600), headers), 'and a batch is refused on arrival')
  })
  
    t.test('notifications, responses and failed requests are charged too; the ops routes never', async t => {
    const gw = await gateway(t, { requestsPerSecond: 0.01, burst: 4, sessions: 5 })
    const headers = await session(gw.url) // 2 spent
    t.equal((await post(gw.url, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/roots/list_changed' }, headers)).status, 202, 'a notification passes (3)')
    t.equal((await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 'nope', result: {} }, headers)).status, 202, 'a stray response passes (4)')
    await expect429(t, await post(gw.url, '/mcp/full', { jsonrpc: '2.0', method: 'notifications/roots/list_changed' }, headers), 'a notification over the budget')
    await expect429(t, await post(gw.url, '/mcp/full', { jsonrpc: '2.0', id: 1, result: {} }, headers), 'a response over the budget')
    await expect429(t, await fetch(`${gw.url}/mcp/full`, { method: 'DELETE', headers }), 'a DELETE over the budget')
    await expect429(t, await fetch(`${gw.url}/sse/full`, { headers: { ...cred, accept: 'text/event-stream' } }), 'a legacy GET over the budget')
    for (let i = 0; i < 20; i++) {
      for (const path of ['/healthz', '/readyz', '/metrics']) {
        const res = await fetch(gw.url + path, { headers: cred })
        if (res.status !== 200) t.fail(`${path} answered ${res.status}`)
        // Read whole: a cancelled /metrics body (large in Redis mode) leaves its connection busy,
        // and the gateway's close then waits out the keep-alive timeout (72 s).
        await res.text()
      }
    }
    t.pass('/healthz, /readyz and /metrics answered 200 sixty times over a spent budget')
  })
  
    t.test('a failed initialize leaks no session slot', async t => {
    const gw = await gateway(t, { sessions: 1 })
    for (let i = 0; i < 3; i++) {
      const res = await post(gw.url, '/mcp/broken', initMessage(), cred)
      const text = await res.text()
      t.ok(res.status >= 400 || text.includes('"error"'), `initialize of a server that cannot start fails (${res.status})`)
    }
    const res = await post(gw.url, '/mcp/full', initMessage(), cred)
    t.equal(res.status, 200, 'the one slot is still free')
    await res.body?.cancel()
    const second = await post(gw.url, '/mcp/full', initMessage(), cred)
    t.equal(second.status, 429, 'and now it is taken')
    t.match(await second.json(), { jsonrpc: '2.0', error: { data: { code: 'GW_ERR_SESSION_QUOTA' } } }, 'a JSON-RPC error body')
  })
}

t.test('one process, memory twins', async t => { attacks(t) })

t.test('Redis twins', async t => {
  redis = await startRedis(t)
  attacks(t)
})
