// Issue 28: owner loss costs no request that never reached a backend. Three gateway processes on
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
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { textOf } from '../helpers/wait.js'
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

t.test('calls sent right after their owner is SIGKILLed are answered by the new owner, once; only started ones get -32007', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const calls = await callLog(t)
  const config = { redis: { url: redis.url, keyPrefix: prefix, connectTimeoutMs: 2000 }, servers: { full: stdioFixture('full-server', ['--call-log', calls.file]) } }
  const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const inspect = await testRedis(t, redis.url)

  const sessions: Array<{ client: Client, owner: string }> = []
  for (let i = 0; i < 6; i++) {
    const client = new Client({ name: `owner-loss-${i}`, version: '1' }, { capabilities: {} })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/full`)))
    t.teardown(async () => { await client.close().catch(() => {}) })
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `before-${i}` } })), `before-${i}`)
    const sid = (client.transport as StreamableHTTPClientTransport).sessionId ?? ''
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
  const redelivered = replicas.filter(r => r !== victim).flatMap(r => r.logs).filter(l => l.msg === 'messages a lost replica never read are delivered again')
  t.ok(redelivered.length >= 1, `calls routed to the dead owner were taken from its inbox (${redelivered.length} log lines)`)
  // And the sessions go on.
  for (const [i, s] of sessions.entries()) t.equal(textOf(await s.client.callTool({ name: 'echo', arguments: { text: `later-${i}` } })), `later-${i}`)
})
