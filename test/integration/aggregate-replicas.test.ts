// Aggregate servers across replicas: two gateway processes on one Redis behind a
// round-robin balancer with no stickiness. Any replica serves the aggregate session (its requests
// go to the owner, which holds the member connections); a member's sampling request is answered
// through either replica; when the owner dies, the next request re-initialises every member on
// another replica and is answered.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'

t.test('an aggregate session through two replicas, and its owner killed', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const config = {
    redis: { url: redis.url, keyPrefix: prefix, leaseMs: 1500, connectTimeoutMs: 2000 },
    servers: {
      full: stdioFixture('full-server'),
      shared: stdioFixture('full-server', [], { sessions: 'pooled' }),
      agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'shared' }] }
    }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const [a, b] = replicas as [ReplicaProcess, ReplicaProcess]
  const proxy = await startRoundRobinProxy(t, [a.url, b.url])
  const client = new Client({ name: 'agg-replicas', version: '1' }, { capabilities: { sampling: {} } })
  client.setRequestHandler(CreateMessageRequestSchema, async req => ({
    role: 'assistant', model: 'm', content: { type: 'text', text: `sampled ${(req.params.messages[0]?.content as { text?: string }).text ?? ''}` }
  }))
  const transport = new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/agg`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })

  for (let i = 0; i < 4; i++) {
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `d${i}` } })), `d${i}`)
    t.equal(textOf(await client.callTool({ name: 'shared__echo', arguments: { text: `p${i}` } })), `p${i}`)
  }
  t.ok(proxy.counts.every(c => c >= 4), `both replicas took requests: ${proxy.counts.join(',')}`)
  for (let i = 0; i < 3; i++) {
    t.equal(textOf(await client.callTool({ name: 'sample', arguments: { prompt: `s${i}` } })), `sampled s${i}`, 'a dedicated member asks the client through either replica')
    t.equal(textOf(await client.callTool({ name: 'shared__sample', arguments: { prompt: `q${i}` } })), `sampled q${i}`, 'so does a pooled member')
  }
  const pidBefore = textOf(await client.callTool({ name: 'pid', arguments: {} }))

  // The owner holds the member connections: kill it.
  const ownerId = await (await testRedis(t, redis.url)).get(sessionKeys(prefix, transport.sessionId ?? '').owner)
  const owner = replicas.find(r => r.logs.some(l => l.replica === ownerId)) ?? a
  const survivor = owner === a ? b : a
  t.ok(ownerId !== null && owner.logs.some(l => l.replica === ownerId), `the owner is ${owner.name}`)
  await owner.kill()
  proxy.setTargets([survivor.url])
  const started = Date.now()
  const after = await client.callTool({ name: 'echo', arguments: { text: 'after' } }).catch((err: Error) => {
    t.comment(JSON.stringify(survivor.logs.filter(l => Number(l.level) >= 40 || /took over|delivered again|orphan/i.test(String(l.msg))).slice(-15)))
    throw err
  })
  t.equal(textOf(after), 'after', 'the next request is answered: the members were started again on the survivor')
  t.ok(Date.now() - started < 15_000, `within seconds (${Date.now() - started} ms)`)
  t.not(textOf(await client.callTool({ name: 'pid', arguments: {} })), pidBefore, 'by a new child')
  t.equal(textOf(await client.callTool({ name: 'shared__echo', arguments: { text: 'pooled after' } })), 'pooled after')
  t.ok((await client.listTools()).tools.some(tool => tool.name === 'shared__echo'), 'the merged list is whole again')
})
