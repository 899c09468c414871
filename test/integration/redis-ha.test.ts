// The store fails over too (docs/replicas.md). A Sentinel-managed primary that the test fails over
// (SIGKILL), and a real 3-master Redis Cluster under three gateway replicas; every script must run
// there (all its keys named, one session's keys in one slot).
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { randomPrefix } from '../helpers/redis-server.js'
import { startCluster, startSentinelSetup } from '../helpers/redis-topologies.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { eventually, textOf } from '../helpers/wait.js'

async function connect (t: Test, url: string): Promise<Client> {
  const client = new Client({ name: 'ha', version: '1' }, { capabilities: {} })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

t.test('Redis Sentinel: the primary is killed, Sentinel promotes the replica, sessions go on', async t => {
  const setup = await startSentinelSetup(t)
  const gw = await startGateway(t, {
    redis: { url: setup.primary.url, sentinels: [setup.sentinel.url], name: setup.name, keyPrefix: randomPrefix(), connectTimeoutMs: 2000 },
    servers: { full: stdioFixture('full-server') }
  })
  const client = await connect(t, gw.url)
  const sid = (client.transport as StreamableHTTPClientTransport).sessionId
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'before' } })), 'before')
  await new Promise(resolve => setTimeout(resolve, 300)) // replication is asynchronous
  const oldPort = setup.primaryPort()
  t.equal(oldPort, setup.primary.port, 'Sentinel names the first primary')
  await setup.primary.kill()
  await eventually('Sentinel to promote the replica', async () => setup.primaryPort() === setup.replica.port ? true : undefined, 20_000)
  const text = await eventually('a call to succeed after the failover', async () => {
    try {
      return textOf(await client.callTool({ name: 'echo', arguments: { text: 'after' } }))
    } catch { return undefined }
  }, 20_000)
  t.equal(text, 'after', 'the session works on the promoted primary')
  t.equal((client.transport as StreamableHTTPClientTransport).sessionId, sid, 'same session')
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200, '/readyz is back to 200')
  const fresh = await connect(t, gw.url)
  t.equal(textOf(await fresh.callTool({ name: 'echo', arguments: { text: 'new' } })), 'new', 'new sessions work')
})

t.test('Redis Cluster: three replicas on a 3-master cluster; every flow, a replica kill and DELETE', async t => {
  const cluster = await startCluster(t)
  const prefix = randomPrefix()
  const config = {
    redis: { url: cluster.urls[0], cluster: cluster.urls, keyPrefix: prefix, connectTimeoutMs: 3000 },
    servers: { full: stdioFixture('full-server') }
  }
  const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const clients = [await connect(t, proxy.url), await connect(t, proxy.url)]
  for (const [i, client] of clients.entries()) {
    for (let n = 0; n < 4; n++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `c${i}n${n}` } })), `c${i}n${n}`)
    const progress: number[] = []
    await client.callTool({ name: 'progress', arguments: { steps: 3, delayMs: 5 } }, undefined, { onprogress: p => { progress.push(p.progress) } })
    t.same(progress, [1, 2, 3], 'progress on the request\'s stream')
  }
  const listChanged = new Promise<void>(resolve => clients[0]!.setNotificationHandler(ToolListChangedNotificationSchema, async () => { resolve() }))
  await clients[0]!.callTool({ name: 'add-tool', arguments: {} })
  await listChanged
  t.pass('a GET-stream notification arrived')
  const sessionKeys = cluster.keys(`${prefix}:*`).filter(k => k.includes('{'))
  const slots = new Set(sessionKeys.map(k => /\{([^}]+)\}/.exec(k)?.[1]))
  t.ok(sessionKeys.length > 4 && slots.size === 2, `session keys (${sessionKeys.length}) of 2 sessions, each under its own hash tag`)

  // A replica dies (it may own either session): the sessions carry on, on the cluster.
  const killed = replicas[0] as ReplicaProcess
  await killed.kill()
  proxy.setTargets(replicas.slice(1).map(r => r.url))
  const after = await eventually('the session to carry on', async () => {
    try { return textOf(await clients[0]!.callTool({ name: 'echo', arguments: { text: 'after' } })) } catch { return undefined }
  }, 20_000)
  t.equal(after, 'after')

  for (const client of clients) await (client.transport as StreamableHTTPClientTransport).terminateSession()
  await eventually('every session key to go', async () => cluster.keys(`${prefix}:{*`).length === 0 ? true : undefined, 10_000)
  t.pass('DELETE removed every key of both sessions from the cluster')
})
