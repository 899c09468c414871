// A dedicated session idle past its server's childIdleMs gives its child back and keeps the
// session: the next message starts a child, replays the session into it (initialize with the
// client's params, initialized, log level) and is answered. Clients that never send DELETE (the
// Inspector CLI, a killed mcp-remote, the SDK's close()) so cost memory only while they are used.
// Real SDK clients (v1) over real sockets; the full-server fixture as the stdio child.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'
import { eventually, textOf } from '../helpers/wait.js'

function alive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

async function dedicatedChildren (gw: RunningGateway): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('mcpgw_backend_children_by_mode{') && l.includes('server="full"') && l.includes('mode="dedicated"'))
  return Number(line?.split(' ').pop() ?? 0)
}

async function connect (t: Test, gw: RunningGateway): Promise<Client> {
  const client = new Client({ name: 'idle', version: '1' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

const pidOf = async (client: Client): Promise<number> => Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))

t.test('an idle dedicated session gives its child back and gets one again, replayed, on its next call', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { childIdleMs: 1000 }) } })
  const client = await connect(t, gw)
  await client.setLoggingLevel('warning')
  const first = await pidOf(client)
  t.ok(alive(first), 'the session has a child')
  await eventually('the idle child is stopped', () => alive(first) ? undefined : true, 30_000, 100)
  t.equal(await dedicatedChildren(gw), 0, 'no dedicated child is left running')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'after a nap' } })), 'after a nap', 'the next call is answered, by a new child')
  const second = await pidOf(client)
  t.not(second, first, 'a new child')
  t.ok(alive(second), 'running')
  const tools = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(tools.includes('echo'), 'the session goes on as before: it lists, calls, without a new initialize of its own')
})

t.test('a call longer than childIdleMs, or a resource subscription, keeps the child', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { childIdleMs: 1000 }) } })
  const client = await connect(t, gw)
  const before = await pidOf(client)
  t.equal(textOf(await client.callTool({ name: 'slow', arguments: { ms: 3000 } })), 'slept 3000 ms', 'a call in flight past childIdleMs is answered')
  t.equal(await pidOf(client), before, 'by the same child, not stopped under it')
  await client.subscribeResource({ uri: 'test://counter' })
  await new Promise(resolve => setTimeout(resolve, 3000))
  t.ok(alive(before), 'a session subscribed to a resource keeps its child (it would miss resources/updated)')
  await client.unsubscribeResource({ uri: 'test://counter' })
  await eventually('the child is given back once unsubscribed', () => alive(before) ? undefined : true, 30_000, 100)
})

t.test('childIdleMs 0 keeps children for the life of their sessions', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { childIdleMs: 0 }) } })
  const client = await connect(t, gw)
  const pid = await pidOf(client)
  await new Promise(resolve => setTimeout(resolve, 2500))
  t.ok(alive(pid), 'still running')
  t.equal(await pidOf(client), pid, 'the same child answers')
})

t.test('Redis, two replicas behind a round robin: the owner gives the child back; a message through either replica gets one again', async t => {
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 },
    servers: { full: stdioFixture('full-server', [], { childIdleMs: 1000 }) }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const client = new Client({ name: 'idle-replicas', version: '1' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/full`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  const first = await pidOf(client)
  await eventually('the idle child is stopped', () => alive(first) ? undefined : true, 30_000, 100)
  const answers: string[] = []
  // Several calls: the round robin sends them through both replicas; each is answered.
  for (let i = 0; i < 4; i++) answers.push(textOf(await client.callTool({ name: 'echo', arguments: { text: `r${i}` } })))
  t.same(answers, ['r0', 'r1', 'r2', 'r3'], 'every call is answered, whichever replica it reached')
  const pids = new Set<number>()
  for (let i = 0; i < 2; i++) pids.add(await pidOf(client))
  t.equal(pids.size, 1, 'by one new child (the owner\'s)')
  t.notOk(pids.has(first), 'not the stopped one')
})
