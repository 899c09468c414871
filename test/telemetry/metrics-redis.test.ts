// Metrics in Redis mode: gateway processes on one Redis behind a round-robin balancer.
// Each replica counts what it did (an operation once, on the owner), the bus and Redis are timed,
// a restarted replica starts from zero while the others keep counting, and a Redis outage shows
// up as command errors.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { scrape, type Scrape } from '../helpers/prometheus.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { eventually, textOf } from '../helpers/wait.js'

const OPS = 'mcp_server_operation_duration_seconds_count'
const ECHO = { mcp_method_name: 'tools/call', gen_ai_tool_name: 'echo' }

async function connect (t: Test, url: string): Promise<Client> {
  const client = new Client({ name: 'metrics-redis', version: '1' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

async function scrapeAll (replicas: ReplicaProcess[]): Promise<Scrape[]> {
  return await Promise.all(replicas.map(async r => await scrape(r.url)))
}

const total = (scrapes: Scrape[], name: string, labels: Record<string, string> = {}): number => scrapes.reduce((n, s) => n + s.sum(name, labels), 0)

t.test('replicas on one Redis: operations counted once, bus and Redis timed, a restarted replica and a Redis outage', async t => {
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 1000 },
    servers: { full: stdioFixture('full-server') }
  }
  const a = await startReplica(t, 'A', config)
  const b = await startReplica(t, 'B', config)
  const proxy = await startRoundRobinProxy(t, [a.url, b.url])
  const client = await connect(t, proxy.url)
  await client.listTools() // a tool name becomes a label value once the backend listed it
  for (let i = 0; i < 6; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `n${i}` } })), `n${i}`)

  let scrapes = await scrapeAll([a, b])
  t.equal(total(scrapes, OPS, ECHO), 6, 'six calls, each counted once (on the owner), across the replicas')
  t.equal(total(scrapes, 'mcpgw_sessions_open', { server: 'full' }), 1, 'one session, owned by one replica')
  t.ok(total(scrapes, 'mcpgw_bus_envelopes_sent_total', { kind: 'deliver' }) > 0, 'client messages went over the bus to the owner')
  t.equal(total(scrapes, 'mcpgw_bus_envelopes_received_total'), total(scrapes, 'mcpgw_bus_envelopes_sent_total'), 'every envelope sent was received')
  t.equal(total(scrapes, 'mcpgw_bus_envelope_lag_seconds_count'), total(scrapes, 'mcpgw_bus_envelopes_received_total'), 'and its lag observed')
  for (const s of scrapes) t.ok(s.sum('mcpgw_redis_command_duration_seconds_count', { command: 'evalsha' }) > 0, 'scripts are timed on every replica')

  // B restarts (killed, a new process in its place): it starts from zero, A keeps its counts.
  const before = (await scrape(a.url)).sum(OPS, ECHO)
  await b.kill()
  const b2 = await startReplica(t, 'B2', config)
  proxy.setTargets([a.url, b2.url])
  const fresh = await scrape(b2.url)
  t.equal(fresh.sum(OPS), 0, 'the new replica starts from zero')
  t.ok(fresh.has('process_start_time_seconds'), 'with its process metrics')
  const again = await connect(t, proxy.url)
  await again.listTools()
  for (let i = 0; i < 4; i++) t.equal(textOf(await again.callTool({ name: 'echo', arguments: { text: `m${i}` } })), `m${i}`)
  scrapes = await scrapeAll([a, b2])
  t.ok(scrapes[0]!.sum(OPS, ECHO) >= before, 'A\'s counter never went back')
  t.equal(total(scrapes, OPS, ECHO) - before, 4, 'the new calls, counted once')
  t.ok(total(scrapes, 'mcpgw_bus_envelopes_received_total') > 0, 'the bus works with the new replica')

  // Redis goes away: the replicas' commands fail, and that is counted.
  await redis.stop()
  await eventually('Redis command errors to be counted', async () => {
    const now = await scrape(a.url).catch(() => undefined)
    return now !== undefined && now.sum('mcpgw_redis_command_errors_total') > 0 ? true : undefined
  }, 15_000)
  t.pass('Redis command errors counted while Redis was down')
  await redis.restart()
})

t.test('the gateway process serves /metrics on metrics.listen, behind its token', async t => {
  const token = 'process-scrape-token-0123456789'
  const replica = await startReplica(t, 'M', { metrics: { token, listen: { host: '127.0.0.1', port: 0 } }, servers: { full: stdioFixture('full-server') } })
  const line = replica.logs.find(l => l.msg === 'mcp-gateway listening')
  const address = line?.metricsAddress
  if (typeof address !== 'string') throw new Error(`no metricsAddress in ${JSON.stringify(line)}`)
  t.not(address, replica.url, 'an address of its own')
  t.equal((await fetch(`${replica.url}/metrics`, { headers: { authorization: `Bearer ${token}` } })).status, 404, 'not on the main listener')
  t.equal((await fetch(`${address}/metrics`)).status, 401, 'the token is needed')
  const client = await connect(t, replica.url)
  await client.listTools()
  const m = await scrape(address, { authorization: `Bearer ${token}` })
  t.equal(m.sum(OPS, { mcp_method_name: 'tools/list' }), 1, 'the process\'s metrics')
  t.ok(m.has('process_resident_memory_bytes'))
})
