// Tasks (MCP 2025-11-25, "Tasks") of pooled sessions across replicas: two gateway processes on one
// real Redis, server-everything pooled over stdio, SDK v1 clients whose requests go to whichever
// replica the test names (or alternate, with no stickiness). A task lives in the child of the
// replica that ran its tools/call; its record in the task store lets the other replica answer for
// it: tasks/get, tasks/result, tasks/list and tasks/cancel through the replica that does not hold
// it, only ever for the session that owns it, and a replica killed mid-task leaves its tasks
// failed, not working, with a waiting tasks/result answered.
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, TaskStatusNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { newKey, PUBLIC_URL } from '../helpers/auth.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { startReplica, steeredFetch, type ReplicaProcess } from '../helpers/replicas.js'
import { eventually, textOf } from '../helpers/wait.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const everything = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] }

/** A client whose next requests go to one replica (`to`), or alternate between them (`alternate`). */
interface Steered { client: Client, to: (replica: ReplicaProcess | 'alternate') => void, sid: () => string, statusIds: Set<string> }

async function connect (t: Test, replicas: ReplicaProcess[], path: string, name: string, elicit?: string, headers: Record<string, string> = {}, only?: ReplicaProcess): Promise<Steered> {
  let fixed: ReplicaProcess | undefined = only
  let next = 0
  const fetchVia = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input))
    const target = new URL((fixed ?? replicas[next++ % replicas.length]!).url)
    url.host = target.host
    return await fetch(url, init)
  }
  const client = new Client({ name, version: '1' }, { capabilities: elicit !== undefined ? { elicitation: {} } : {} })
  if (elicit !== undefined) client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { interpretation: elicit } }))
  const statusIds = new Set<string>()
  client.setNotificationHandler(TaskStatusNotificationSchema, n => { statusIds.add(n.params.taskId) })
  const transport = new StreamableHTTPClientTransport(new URL(`${replicas[0]!.url}${path}`), { fetch: fetchVia, requestInit: { headers } })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, to: replica => { fixed = replica === 'alternate' ? undefined : replica }, sid: () => transport.sessionId ?? '', statusIds }
}

async function research (session: Steered, topic: string, ambiguous = false): Promise<string> {
  const created = await session.client.request({
    method: 'tools/call',
    params: { name: 'simulate-research-query', arguments: { topic, ambiguous }, task: { ttl: 120_000 } }
  }, CreateTaskResultSchema)
  return created.task.taskId
}

function replicaIdOf (replica: ReplicaProcess): string {
  return String(replica.logs.find(l => typeof l.replica === 'string')?.replica)
}

/** The server-everything children of a replica process. */
function childrenOf (replica: ReplicaProcess): number[] {
  const out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(replica.child.pid)], { encoding: 'utf8' })
  return out.split('\n').filter(line => line.includes('server-everything')).map(line => Number(line.trim().split(/\s+/)[0]))
}

async function twoReplicas (t: Test, servers: Record<string, unknown>, more: Record<string, unknown> = {}): Promise<{ a: ReplicaProcess, b: ReplicaProcess, prefix: string, redisUrl: string }> {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const config = { redis: { url: redis.url, keyPrefix: prefix, leaseMs: 1500, connectTimeoutMs: 2000 }, servers, ...more }
  const [a, b] = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config))) as [ReplicaProcess, ReplicaProcess]
  return { a, b, prefix, redisUrl: redis.url }
}

const pooled = { everything: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 3, poolWaitMs: 30_000 } }

t.test('a task created on one replica is reached through the other, by its session only', async t => {
  const { a, b, prefix, redisUrl } = await twoReplicas(t, pooled)
  const inspect = await testRedis(t, redisUrl)
  const alice = await connect(t, [a, b], '/mcp/everything', 'alice')
  const bob = await connect(t, [a, b], '/mcp/everything', 'bob')

  alice.to(a)
  const id = await research(alice, 'alpha')
  t.equal(await inspect.hget(`${prefix}:task:${id}`, 'replica'), JSON.stringify(replicaIdOf(a)), 'the record names the replica holding the task')
  t.equal(await inspect.hget(`${prefix}:task:${id}`, 'sessionId'), JSON.stringify(alice.sid()), 'and the session that owns it')

  alice.to(b)
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: /working|completed/ }, 'tasks/get through B')
  t.same((await alice.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [id], 'tasks/list through B')

  // Another session guessing the id, on both replicas: unknown, never status, result or cancellation.
  for (const replica of [a, b]) {
    bob.to(replica)
    await t.rejects(bob.client.experimental.tasks.getTask(id), { code: -32602, message: /Task not found/ }, `bob cannot get it on ${replica.name}`)
    await t.rejects(bob.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { code: -32602 }, `nor its result on ${replica.name}`)
    await t.rejects(bob.client.experimental.tasks.cancelTask(id), { code: -32602 }, `nor cancel it on ${replica.name}`)
    t.same((await bob.client.experimental.tasks.listTasks()).tasks, [], `bob lists nothing on ${replica.name}`)
  }

  t.match(textOf(await alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)), /Research Report: alpha/, 'tasks/result through B waits for the end on A')
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: 'completed' }, 'completed, through B')

  // Cancelled through B, seen as cancelled through A.
  alice.to(a)
  const second = await research(alice, 'beta')
  alice.to(b)
  t.match(await alice.client.experimental.tasks.cancelTask(second), { taskId: second, status: 'cancelled' }, 'tasks/cancel through B')
  alice.to(a)
  t.match(await alice.client.experimental.tasks.getTask(second), { taskId: second, status: 'cancelled' }, 'cancelled on A')
  alice.to(b)
  t.same((await alice.client.experimental.tasks.listTasks()).tasks.map(task => [task.taskId, task.status]), [[id, 'completed'], [second, 'cancelled']], 'tasks/list through B: both, with their last statuses')

  // Status notifications of a task held on A reach a GET stream held on B.
  const watcher = await connect(t, [a, b], '/mcp/everything', 'watcher', undefined, {}, b)
  await watcher.client.ping()
  watcher.to(a)
  const watched = await research(watcher, 'watched')
  watcher.to(b)
  await eventually('a status notification through B\'s GET stream', () => watcher.statusIds.has(watched) ? true : undefined, 15_000, 100)
  t.same([...watcher.statusIds], [watched], 'under the session\'s own id, and only its task\'s')

  // An elicitation of a task held on A, asked through a tasks/result that went to B, answered through either.
  const asker = await connect(t, [a, b], '/mcp/everything', 'asker', 'technical')
  asker.to(a)
  const ambiguous = await research(asker, 'python', true)
  asker.to('alternate')
  const answered = await asker.client.experimental.tasks.getTaskResult(ambiguous, CallToolResultSchema)
  t.match(textOf(answered), /Clarification\*\*: technical/, 'the elicitation reached the session and its answer the task')
})

t.test('another tenant (or another key of the same tenant) guessing a task id gets the unknown-task error on both replicas', async t => {
  const owner = newKey('owner')
  const colleague = newKey('colleague')
  const stranger = newKey('stranger')
  const { a, b } = await twoReplicas(t, pooled, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [owner.entry, colleague.entry], servers: { everything: {} } },
      other: { apiKeys: [stranger.entry], servers: { everything: {} } }
    }
  })
  const alice = await connect(t, [a, b], '/mcp/everything', 'alice', undefined, { 'x-api-key': owner.key })
  alice.to(a)
  const id = await research(alice, 'secret')
  for (const [who, key] of [['a stranger of another tenant', stranger], ['a colleague of the same tenant', colleague]] as const) {
    const guesser = await connect(t, [a, b], '/mcp/everything', 'guesser', undefined, { 'x-api-key': key.key })
    for (const replica of [a, b]) {
      guesser.to(replica)
      await t.rejects(guesser.client.experimental.tasks.getTask(id), { code: -32602, message: /Task not found/ }, `${who}: no status on ${replica.name}`)
      await t.rejects(guesser.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { code: -32602 }, `${who}: no result on ${replica.name}`)
      await t.rejects(guesser.client.experimental.tasks.cancelTask(id), { code: -32602 }, `${who}: no cancellation on ${replica.name}`)
      t.same((await guesser.client.experimental.tasks.listTasks()).tasks, [], `${who}: lists nothing on ${replica.name}`)
    }
  }
  alice.to(b)
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: /working|completed/ }, 'the owner still reaches it, not cancelled by the guesses')
})

t.test('concurrent sessions on one pooled child each list only their own tasks, on either replica', async t => {
  const { a, b } = await twoReplicas(t, { everything: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 1, poolWaitMs: 30_000 } })
  const sessions = await Promise.all([0, 1, 2, 3].map(async n => await connect(t, [a, b], '/mcp/everything', `s${n}`)))
  const ids = await Promise.all(sessions.map(async (s, n) => [await research(s, `t${n}a`), await research(s, `t${n}b`)]))
  for (const [n, s] of sessions.entries()) {
    for (const replica of [a, b]) {
      s.to(replica)
      t.same((await s.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId).sort(), [...ids[n]!].sort(), `session ${n} lists its own two on ${replica.name}`)
    }
  }
})

t.test('the replica holding a task is killed mid-task: the task ends failed, a waiting tasks/result is answered', async t => {
  const { a, b } = await twoReplicas(t, pooled)
  const alice = await connect(t, [a, b], '/mcp/everything', 'alice')
  alice.to(a)
  const id = await research(alice, 'doomed')
  alice.to(b)
  const waiting = alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)
  waiting.catch(() => {})
  await new Promise(resolve => setTimeout(resolve, 300))
  await a.kill()
  const started = Date.now()
  await t.rejects(waiting, { code: -32007 }, 'the tasks/result waiting through B is answered -32007')
  t.ok(Date.now() - started < 20_000, `within ${Date.now() - started} ms`)
  const task = await eventually('the task failed', async () => {
    const got = await alice.client.experimental.tasks.getTask(id)
    return got.status === 'failed' ? got : undefined
  }, 20_000, 500)
  t.match(task, { taskId: id, status: 'failed', statusMessage: /replica .* is gone/ }, 'failed, saying why')
  t.match((await alice.client.experimental.tasks.listTasks()).tasks, [{ taskId: id, status: 'failed' }], 'tasks/list agrees')
  await t.rejects(alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { code: -32007 }, 'tasks/result afterwards: -32007')
  await t.rejects(alice.client.experimental.tasks.cancelTask(id), { code: -32602, message: /terminal status: failed/ }, 'nothing left to cancel')
})

t.test('a tasks/result passed on over the legacy transport, its task\'s replica killed: answered -32007', async t => {
  const { a, b } = await twoReplicas(t, pooled)
  // The stream on B; each POST to the replica the test names.
  let target = a
  const posts = steeredFetch(() => target)
  const client = new Client({ name: 'legacy', version: '1' }, { capabilities: {} })
  await client.connect(new SSEClientTransport(new URL(`${b.url}/sse/everything`), { fetch: posts, eventSourceInit: { fetch } }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  const created = await client.request({ method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic: 'legacy', ambiguous: false }, task: { ttl: 120_000 } } }, CreateTaskResultSchema)
  target = b
  t.match(await client.experimental.tasks.getTask(created.task.taskId), { status: 'working' }, 'made on A, seen through B')
  const waiting = client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema, { timeout: 60_000 })
  waiting.catch(() => {})
  await new Promise(resolve => setTimeout(resolve, 300))
  await a.kill()
  const started = Date.now()
  await t.rejects(waiting, { code: -32007, message: /holding the task is gone/ }, 'the tasks/result passed on through B is answered -32007')
  t.ok(Date.now() - started < 20_000, `within ${Date.now() - started} ms`)
})

t.test('a tasks/result inside a 2025-03-26 batch, its task\'s replica killed: answered -32007', async t => {
  const { a, b } = await twoReplicas(t, pooled)
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-03-26' }
  const init = await fetch(`${a.url}/mcp/everything`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-03-26', capabilities: {}, clientInfo: { name: 'batch', version: '1' } } }) })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await init.text()
  const post = async (replica: ReplicaProcess, body: unknown): Promise<Array<Record<string, unknown>>> => {
    const res = await fetch(`${replica.url}/mcp/everything`, { method: 'POST', headers: { ...headers, 'mcp-session-id': sid }, body: JSON.stringify(body) })
    const text = await res.text()
    if ((res.headers.get('content-type') ?? '').includes('text/event-stream')) return text.split('\n').filter(line => line.startsWith('data: ') && line.length > 6).map(line => JSON.parse(line.slice(6)) as Record<string, unknown>)
    return text === '' ? [] : [JSON.parse(text) as Record<string, unknown>].flat()
  }
  await post(a, { jsonrpc: '2.0', method: 'notifications/initialized' })
  const [made] = await post(a, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic: 'batch' }, task: { ttl: 120_000 } } })
  const taskId = String((made?.result as { task?: { taskId?: string } } | undefined)?.task?.taskId)
  t.match(made, { result: { task: { status: 'working' } } }, 'a task made on A')
  // Two requests: the batch is not routed as a whole to the task's replica, the tasks/result in it is passed on.
  const answers = post(b, [{ jsonrpc: '2.0', id: 2, method: 'tasks/result', params: { taskId } }, { jsonrpc: '2.0', id: 3, method: 'ping' }])
  await new Promise(resolve => setTimeout(resolve, 300))
  await a.kill()
  const started = Date.now()
  const got = await answers
  t.match(got.find(m => m.id === 2), { error: { code: -32007, message: /holding the task is gone/ } }, 'the tasks/result of the batch is answered -32007')
  t.match(got.find(m => m.id === 3), { result: {} }, 'and the ping')
  t.equal(got.filter(m => m.id === 2).length, 1, 'once')
  t.ok(Date.now() - started < 20_000, `within ${Date.now() - started} ms`)
})

t.test('a child stopped while its task runs: the task fails on every replica', async t => {
  const { a, b } = await twoReplicas(t, pooled)
  const alice = await connect(t, [a, b], '/mcp/everything', 'alice')
  alice.to(a)
  const id = await research(alice, 'doomed')
  const pids = childrenOf(a)
  t.ok(pids.length >= 1, `A runs the pooled child (${pids.join(', ')})`)
  for (const pid of pids) process.kill(pid, 'SIGKILL')
  alice.to(b)
  // In the moment the child dies, a tasks/get may still meet its connection and get -32007 once;
  // from when the gateway knows, the task answers failed, on every replica.
  const transient: string[] = []
  const task = await eventually('the task failed, seen through B', async () => {
    const got = await alice.client.experimental.tasks.getTask(id).catch((err: { code?: number, message?: string }) => {
      if (err.code !== -32007) throw err
      transient.push(String(err.message))
      return undefined
    })
    return got?.status === 'failed' ? got : undefined
  }, 15_000, 250)
  t.ok(transient.length <= 2, `-32007 at most while the loss was being learnt (${transient.length}: ${transient.join(' | ').slice(0, 300)})`)
  t.match(task, { taskId: id, status: 'failed', statusMessage: /lost the backend connection/ }, 'failed, saying why')
  await t.rejects(alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { code: -32007, message: /lost the backend connection/ }, 'tasks/result through B: -32007')
})

t.test('a dedicated session\'s tasks through two alternating replicas (relayed to its owner)', async t => {
  const { a, b } = await twoReplicas(t, { everything })
  const alice = await connect(t, [a, b], '/mcp/everything', 'alice')
  const bob = await connect(t, [a, b], '/mcp/everything', 'bob')
  const id = await research(alice, 'dedicated')
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: /working|completed/ })
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: /working|completed/ }, 'on the other replica too')
  t.same((await alice.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [id])
  await t.rejects(bob.client.experimental.tasks.getTask(id), { code: -32602 }, 'another session does not reach it (its own backend)')
  t.match(textOf(await alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)), /Research Report: dedicated/)
  const second = await research(alice, 'cancel me')
  t.match(await alice.client.experimental.tasks.cancelTask(second), { taskId: second, status: 'cancelled' })
  t.match(await alice.client.experimental.tasks.getTask(second), { status: 'cancelled' })
})
