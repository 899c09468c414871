// Regressions of the pool under pooled sessions (`sessions: pooled`), with the full-server
// fixture as a real child: what bench/pooled-idle.ts and the pooled conformance run found.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { scrape } from '../helpers/prometheus.js'
import { textOf } from '../helpers/wait.js'

async function connect (t: Test, url: string): Promise<Client> {
  const client = new Client({ name: 'issue26', version: '1' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

t.test('a burst of new pooled sessions starts one child, not one per initialize', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 2 }) } })
  await Promise.all(Array.from({ length: 8 }, async () => await connect(t, `${gw.url}/mcp/full`)))
  const metrics = await scrape(gw.url)
  // The pool opens poolSize (2) at boot: the burst adds none of its own (it opened one per initialize).
  t.ok(metrics.sum('mcpgw_pool_connections', { server: 'full' }) <= 2, 'no more than the warm connections described the backend to all eight')
})

t.test('every log of a call reaches a pooled session whose level the pool sets before it', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { sessions: 'pooled' }) } })
  const client = await connect(t, `${gw.url}/mcp/full`)
  const logs: string[] = []
  client.setNotificationHandler(LoggingMessageNotificationSchema, n => { logs.push(String(n.params.data)) })
  // The connection hears logging/setLevel just before the call: two requests in flight on it.
  await client.setLoggingLevel('debug')
  const result = await client.callTool({ name: 'log', arguments: { count: 3, level: 'info' } })
  t.equal(textOf(result), 'sent 3 of 3')
  t.same(logs, ['log 1 of 3', 'log 2 of 3', 'log 3 of 3'], 'the first log too, on the call\'s stream')
})
