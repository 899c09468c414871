// Owner loss costs no request that never reached a backend. Three gateway processes on
// one Redis behind a non-sticky round-robin balancer, six SDK sessions over a stdio backend; the
// replica owning some of them is SIGKILLed. A call sent right after the kill is routed to the
// dead owner's inbox (its heartbeat still lives): it never reached a backend, so the new owner
// delivers it again and the client gets its answer. Only a call the dead backend had started
// gets -32007. The backend logs every echo it receives, so "reached a backend" is checked, not assumed.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess, type RoundRobinProxy } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'
import type { Redis } from '../../src/state/redis/client.js'
import { sessionKeys } from '../../src/state/redis/keys.js'

function replicaIdOf (replica: ReplicaProcess): string {
  return String(replica.logs.find(l => typeof l.replica === 'string')?.replica)
}

async function callLog (t: Test): Promise<{ file: string, lines: () => Promise<string[]> }> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-calls-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const file = join(dir, 'calls.log')
  return { file, lines: async () => (await readFile(file, 'utf8').catch(() => '')).split('\n').filter(l => l !== '') }
}

interface Setup {
  prefix: string
  calls: Awaited<ReturnType<typeof callLog>>
  config: Record<string, unknown>
  replicas: ReplicaProcess[]
  proxy: RoundRobinProxy
  inspect: Redis
  /** SDK sessions opened through the balancer. */
  clients: Array<{ client: Client, sid: string }>
}

/** Three replicas on one Redis behind the balancer, a stdio backend logging its echo calls, `n` SDK sessions. */
async function setup (t: Test, n: number): Promise<Setup> {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const calls = await callLog(t)
  const config = { redis: { url: redis.url, keyPrefix: prefix, connectTimeoutMs: 2000 }, servers: { full: stdioFixture('full-server', ['--call-log', calls.file]) } }
  const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const inspect = await testRedis(t, redis.url)
  const clients: Setup['clients'] = []
  for (let i = 0; i < n; i++) {
    const client = new Client({ name: `owner-loss-${i}`, version: '1' }, { capabilities: {} })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/full`)))
    t.teardown(async () => { await client.close().catch(() => {}) })
    clients.push({ client, sid: (client.transport as StreamableHTTPClientTransport).sessionId ?? '' })
  }
  return { prefix, calls, config, replicas, proxy, inspect, clients }
}

t.test('calls sent right after their owner is SIGKILLed are answered by the new owner, once; only started ones get -32007', async t => {
  const { prefix, calls, replicas, proxy, inspect, clients } = await setup(t, 6)
  const sessions: Array<{ client: Client, owner: string }> = []
  for (const [i, { client, sid }] of clients.entries()) {
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `before-${i}` } })), `before-${i}`)
    sessions.push({ client, owner: String(await inspect.get(sessionKeys(prefix, sid).owner)) })
  }
  // The replica owning the most sessions dies; the balancer stops sending to it at once.
  const owned = (r: ReplicaProcess): number => sessions.filter(s => s.owner === replicaIdOf(r)).length
  const victim = [...replicas].sort((a, b) => owned(b) - owned(a))[0]!
  const orphaned = sessions.filter(s => s.owner === replicaIdOf(victim))
  t.ok(orphaned.length >= 1, `the killed replica owned ${orphaned.length} of 6 sessions`)

  // One call the victim's backend has started when it dies: that one may only get -32007.
  const started = orphaned[0]!.client.callTool({ name: 'slow', arguments: { ms: 30_000 } }).then(() => null, (err: unknown) => err)
  await new Promise(resolve => setTimeout(resolve, 500))
  await victim.kill()
  proxy.setTargets(replicas.filter(r => r !== victim).map(r => r.url))
  const killedAt = Date.now()
  const after = await Promise.all(sessions.map(async (s, i) => {
    try {
      return { i, text: textOf(await s.client.callTool({ name: 'echo', arguments: { text: `after-${i}` } }, undefined, { timeout: 30_000 })), ms: Date.now() - killedAt }
    } catch (err) {
      return { i, err, ms: Date.now() - killedAt }
    }
  }))
  for (const a of after) {
    t.equal(a.text, `after-${a.i}`, `session ${a.i}${orphaned.includes(sessions[a.i]!) ? ' (owner killed)' : ''}: answered by a backend in ${a.ms} ms`, { err: String(a.err) })
  }
  const lost = await started
  t.ok(lost instanceof McpError && lost.code === -32007, 'the call the dead backend had started got -32007')
  const log = await calls.lines()
  for (let i = 0; i < 6; i++) t.equal(log.filter(l => l === `after-${i}`).length, 1, `after-${i} reached a backend exactly once`)
  const redelivered = replicas.filter(r => r !== victim).flatMap(r => r.logs).filter(l => l.msg === 'messages a lost replica never handed on are delivered again')
  t.ok(redelivered.length >= 1, `calls routed to the dead owner were taken from its inbox (${redelivered.length} log lines)`)
  // And the sessions go on.
  for (const [i, s] of sessions.entries()) t.equal(textOf(await s.client.callTool({ name: 'echo', arguments: { text: `later-${i}` } })), `later-${i}`)
})

t.test('owners killed at random points of a request\'s path: one answer each; -32007 only for calls a backend had', async t => {
  const { prefix, calls, config, replicas, proxy, inspect, clients } = await setup(t, 3)
  const outcomes: Array<{ text: string, outcome: 'result' | 'lost' | 'other', detail: string }> = []
  const delays: number[] = []
  for (let round = 0; round < 3; round++) {
    const { client, sid } = clients[round]!
    // A call first: a session whose owner an earlier round killed is taken over by it.
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `warm-${round}` } })), `warm-${round}`, `round ${round}: the session answers`)
    const ownerId = String(await inspect.get(sessionKeys(prefix, sid).owner))
    const victim = replicas.find(r => replicaIdOf(r) === ownerId)
    if (victim === undefined) { t.fail(`round ${round}: no live replica owns the session`); continue }
    // The POSTs go to the other replicas, so each call's path crosses the victim's inbox, its
    // backend and its append; the kill lands somewhere along it.
    proxy.setTargets(replicas.filter(r => r !== victim).map(r => r.url))
    const texts = [0, 1, 2, 3, 4, 5].map(k => `r${round}-${k}`)
    const pending = texts.map(async (text, k) => {
      await new Promise(resolve => setTimeout(resolve, k * 4))
      try {
        const got = textOf(await client.callTool({ name: 'echo', arguments: { text } }, undefined, { timeout: 30_000 }))
        outcomes.push({ text, outcome: got === text ? 'result' : 'other', detail: got })
      } catch (err) {
        outcomes.push({ text, outcome: err instanceof McpError && err.code === -32007 ? 'lost' : 'other', detail: String(err).slice(0, 160) })
      }
    })
    const delay = Math.floor(Math.random() * 40)
    delays.push(delay)
    await new Promise(resolve => setTimeout(resolve, delay))
    await victim.kill()
    await Promise.all(pending)
    // The victim comes back under a new id; the balancer sends to all again.
    const index = replicas.indexOf(victim)
    replicas[index] = await startReplica(t, `${victim.name}${round}`, config)
    proxy.setTargets(replicas.map(r => r.url))
  }
  t.comment(`kill delays ${delays.join(', ')} ms; ${outcomes.filter(o => o.outcome === 'result').length} results, ${outcomes.filter(o => o.outcome === 'lost').length} -32007`)
  t.equal(outcomes.length, 18, 'every call got an answer (none timed out at the client)')
  t.same(outcomes.filter(o => o.outcome === 'other'), [], 'each a result or -32007')
  const log = await calls.lines()
  t.same(outcomes.filter(o => o.outcome === 'lost' && !log.includes(o.text)), [], 'no call answered -32007 that never reached a backend')
  t.same(outcomes.filter(o => log.filter(l => l === o.text).length > 1).map(o => o.text), [], 'no call reached a backend twice')
})
