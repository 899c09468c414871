// Pooled sessions across replicas: two gateway processes on one Redis behind a
// round-robin balancer with no stickiness, a `sessions: pooled` stdio server. Any replica serves
// a pooled session with its own pool; a server-to-client request's answer finds the replica that
// asked, wherever it lands; list_changed reaches a GET stream held by the other replica; and
// killing a replica costs the session nothing (no child of its own was lost).
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, ElicitRequestSchema, ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'

async function connect (t: Test, url: string, n: number): Promise<Client> {
  const client = new Client({ name: `pooled-${n}`, version: '1' }, { capabilities: { sampling: {}, elicitation: {} } })
  client.setRequestHandler(CreateMessageRequestSchema, async req => ({
    role: 'assistant', model: 'test', content: { type: 'text', text: `client ${n} sampled ${(req.params.messages[0]?.content as { text?: string }).text ?? ''}` }
  }))
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { answer: `client ${n}` } }))
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

t.test('pooled sessions through two replicas with no stickiness', async t => {
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 },
    servers: { full: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 4 }) }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const proxy = await startRoundRobinProxy(t, [a.url, b.url])
  const clients = await Promise.all([0, 1, 2, 3].map(async n => await connect(t, proxy.url, n)))
  const [first] = clients as [Client]

  for (let i = 0; i < 6; i++) t.equal(textOf(await first.callTool({ name: 'echo', arguments: { text: `n${i}` } })), `n${i}`)
  t.ok(proxy.counts.every(c => c >= 3), `both replicas took requests: ${proxy.counts.join(',')}`)

  // Server-to-client requests: asked by whichever replica ran the call, answered through either.
  let wrong = 0
  for (let round = 0; round < 3; round++) {
    await Promise.all(clients.map(async (c, n) => {
      const sampled = textOf(await c.callTool({ name: 'sample', arguments: { prompt: `r${round}` } }))
      if (sampled !== `client ${n} sampled r${round}`) wrong++
      const elicited = textOf(await c.callTool({ name: 'elicit', arguments: { message: 'q' } }))
      if (!elicited.includes(`"client ${n}"`)) wrong++
    }))
  }
  t.equal(wrong, 0, 'every sampling and elicitation answer reached its own call, across replicas')

  // list_changed from one replica's pool reaches a GET stream wherever it is held.
  const heard = clients.map(() => 0)
  clients.forEach((c, n) => { c.setNotificationHandler(ToolListChangedNotificationSchema, () => { heard[n] = (heard[n] ?? 0) + 1 }) })
  await first.callTool({ name: 'add-tool', arguments: {} })
  const deadline = Date.now() + 10_000
  while (heard.some(h => h === 0) && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 50))
  t.ok(heard.every(h => h >= 1), `every session heard tools/list_changed (${heard.join(',')})`)

  // A replica dies: no session had a child there, so the next calls carry on on the other.
  await a.kill()
  proxy.setTargets([b.url])
  const after = await Promise.all(clients.map(async (c, n) => textOf(await c.callTool({ name: 'echo', arguments: { text: `after ${n}` } }))))
  t.same(after, clients.map((_, n) => `after ${n}`), 'every session is served by the surviving replica, without an error')
  t.equal(textOf(await first.callTool({ name: 'sample', arguments: { prompt: 'x' } })), 'client 0 sampled x', 'sampling too')
})
