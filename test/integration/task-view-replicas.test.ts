// Tasks observed across replicas: two gateway processes on one Redis behind a round-robin balancer,
// a dedicated server-everything session whose requests land on either replica. The session's task
// view is written beside the session in Redis, so the admin API of either replica shows the same
// tasks; each task is counted created once and each status move once, summed over the replicas,
// however the polls were spread; each audit line is written once.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js'
import t from 'tap'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { sessionTaskViewKey } from '../../src/state/redis/keys.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { scrape } from '../helpers/prometheus.js'
import { eventually, textOf } from '../helpers/wait.js'
import { shortHash } from '../../src/telemetry/logger.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const TOKEN = 'task-view-replicas-admin-token-0123456789'

t.test('a session\'s tasks through two replicas: one view, counted once', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const config = {
    redis: { url: redis.url, keyPrefix: prefix, leaseMs: 1500, connectTimeoutMs: 2000 },
    admin: { token: TOKEN },
    servers: { everything: { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] } }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const client = new Client({ name: 'task-replicas', version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/everything`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  const digest = shortHash(transport.sessionId ?? '')
  const start = async (topic: string): Promise<string> => (await client.request({
    method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic }, task: { ttl: 60_000 } }
  }, CreateTaskResultSchema)).task.taskId

  const done = await start('replicas')
  const cancelled = await start('dropped')
  await client.experimental.tasks.cancelTask(cancelled)
  for (let i = 0; i < 4; i++) await client.experimental.tasks.getTask(done)
  t.match(textOf(await client.experimental.tasks.getTaskResult(done, CallToolResultSchema)), /Research Report: replicas/)
  for (let i = 0; i < 4; i++) t.equal((await client.experimental.tasks.getTask(done)).status, 'completed')
  t.ok(proxy.counts.every(c => c >= 4), `both replicas took requests: ${proxy.counts.join(',')}`)

  const view = async (r: ReplicaProcess): Promise<Array<{ taskId: string, status: string }>> => {
    const res = await fetch(`${r.url}/admin/api/sessions/${digest}/tasks`, { headers: { authorization: `Bearer ${TOKEN}` } })
    return ((await res.json()) as { tasks: Array<{ taskId: string, status: string }> }).tasks
  }
  for (const r of replicas) {
    const tasks = await eventually(`${r.name}'s view`, async () => {
      const got = await view(r)
      return got.find(x => x.taskId === done)?.status === 'completed' ? got : undefined
    })
    t.match(tasks, [{ taskId: done, status: 'completed' }, { taskId: cancelled, status: 'cancelled' }], `replica ${r.name} shows the session's tasks`)
  }

  const sum = async (name: string, labels: Record<string, string>): Promise<number> =>
    (await Promise.all(replicas.map(async r => (await scrape(r.url)).sum(name, labels)))).reduce((a, b) => a + b, 0)
  t.equal(await sum('mcpgw_tasks_created_total', { server: 'everything' }), 2, 'two created, over both replicas')
  t.equal(await sum('mcpgw_task_status_transitions_total', { server: 'everything', status: 'completed' }), 1, 'completed once, however many replicas polled it')
  t.equal(await sum('mcpgw_task_status_transitions_total', { server: 'everything', status: 'cancelled' }), 1, 'cancelled once')
  const lines = (event: string): Array<Record<string, unknown>> => replicas.flatMap(r => r.logs.filter(l => l.audit === event))
  t.match(lines('task.created'), [{ session: digest }, { session: digest }], 'two task.created lines in all')
  t.same(lines('task.created').map(l => l.taskId).sort(), [done, cancelled].sort())
  t.match(lines('task.cancel'), [{ session: digest, taskId: cancelled }], 'one task.cancel line')

  // The session ends (the client's DELETE): its view goes with it.
  const key = sessionTaskViewKey(prefix, transport.sessionId ?? '')
  const store = await testRedis(t, redis.url)
  t.equal(await store.exists(key), 1, 'the view is beside the session')
  await transport.terminateSession()
  await eventually('the view deleted', async () => await store.exists(key) === 0 ? true : undefined)
  t.pass('the view is gone with the session')
})
