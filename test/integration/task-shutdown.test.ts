// A replica stopped gracefully (SIGTERM) while it holds tasks: a pooled session's task (MCP
// 2025-11-25) and a 2026-07-28 task bridged to the backend's own (each on a server of its own) are failed in the task store by
// the stopping replica itself, saying why, so the other replica answers `failed` at once, not
// `working` until the stopped one's heartbeat lapses. Two gateway processes on one real Redis,
// server-everything pooled over stdio.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js'
import t from 'tap'
import { envelope, modernPost, resultOf } from '../helpers/modern.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, steeredFetch, type ReplicaProcess } from '../helpers/replicas.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const ext = envelope({ elicitation: {}, extensions: { 'io.modelcontextprotocol/tasks': {} } })

const pooled = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'], sessions: 'pooled', poolSize: 1, poolMax: 3, poolWaitMs: 30_000 }

t.test('a replica stopped gracefully fails the tasks it holds before it goes', async t => {
  const redis = await startRedis(t)
  // A heartbeat far longer than the test waits: only the stopping replica's own write can fail them.
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 20_000, connectTimeoutMs: 2000 },
    servers: { everything: pooled, bridged: pooled }
  }
  const [a, b] = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config))) as [ReplicaProcess, ReplicaProcess]

  // A pooled session's task, made on A; the session's later requests go to B.
  let target = a
  const fetchVia = steeredFetch(() => target)
  const client = new Client({ name: 'stopper', version: '1' }, { capabilities: {} })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${a.url}/mcp/everything`), { fetch: fetchVia }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  const created = await client.request({ method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic: 'stopped', ambiguous: false }, task: { ttl: 120_000 } } }, CreateTaskResultSchema)
  const pooledId = created.task.taskId

  // A 2026-07-28 task bridged to the backend's own, made on A (once server-everything's roots/list,
  // 350 ms after its initialize, was asked of an idle connection: on the call it would fail it).
  await modernPost(`${a.url}/mcp/bridged`, 'server/discover', { _meta: ext })
  await new Promise(resolve => setTimeout(resolve, 1000))
  const bridged = resultOf(await modernPost(`${a.url}/mcp/bridged`, 'tools/call', { name: 'simulate-research-query', arguments: { topic: 'stopped too' }, _meta: ext }))
  t.match(bridged, { resultType: 'task', status: 'working' }, 'a bridged task runs on A')

  target = b
  t.match(await client.experimental.tasks.getTask(pooledId), { status: 'working' }, 'the pooled task works, seen through B')

  await a.stop()
  t.ok(a.child.exitCode !== null || a.child.signalCode !== null, 'A stopped')
  // At once (A's heartbeat is still there for many seconds): what A wrote on its way out.
  t.match(await client.experimental.tasks.getTask(pooledId), { taskId: pooledId, status: 'failed', statusMessage: /replica .* holding this task shut down/ }, 'the pooled task is failed through B, saying why')
  const seen = resultOf(await modernPost(`${b.url}/mcp/bridged`, 'tasks/get', { taskId: bridged.taskId, _meta: ext }))
  t.match(seen, { taskId: bridged.taskId, status: 'failed', statusMessage: /replica .* running the task shut down/ }, 'the bridged task is failed through B, saying why')
  t.ok(a.logs.some(l => l.msg === 'tasks not failed at shutdown') === false, 'A logged no failure of that step')
})
