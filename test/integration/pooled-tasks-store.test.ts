// Pooled sessions' tasks and the task store in memory mode: two gateway apps of one process sharing
// the memory twins (session store, event log, bus hub, task store) act as two replicas; one app
// alone is the single-replica gateway. Real server-everything children over stdio, SDK v1 clients.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { MemoryBusHub } from '../../src/state/bus-memory.js'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { MemoryTaskStore } from '../../src/state/task-store-memory.js'
import { MAX_LIVE_TASKS_PER_SESSION } from '../../src/routing/kinds/pooled-task-remote.js'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const servers = { servers: { everything: { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'], sessions: 'pooled', poolSize: 1, poolMax: 2, poolWaitMs: 30_000 } } }

interface Steered { client: Client, transport: StreamableHTTPClientTransport, to: (gw: RunningGateway) => void, sid: () => string }

async function connect (t: Test, first: RunningGateway, name: string): Promise<Steered> {
  let target = first
  const fetchVia = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input))
    url.host = new URL(target.url).host
    return await fetch(url, init)
  }
  const client = new Client({ name, version: '1' }, { capabilities: {} })
  const transport = new StreamableHTTPClientTransport(new URL(`${first.url}/mcp/everything`), { fetch: fetchVia })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return { client, transport, to: gw => { target = gw }, sid: () => transport.sessionId ?? '' }
}

async function research (session: Steered, topic: string, ambiguous = false): Promise<string> {
  const created = await session.client.request({
    method: 'tools/call',
    params: { name: 'simulate-research-query', arguments: { topic, ambiguous }, task: { ttl: 120_000 } }
  }, CreateTaskResultSchema)
  return created.task.taskId
}

async function twoApps (t: Test): Promise<{ a: RunningGateway, b: RunningGateway, tasks: MemoryTaskStore }> {
  const store = new MemorySessionStore()
  const tasks = new MemoryTaskStore()
  const memory = { store, eventLog: new MemoryEventLog(store, 1000), tasks }
  const hub = new MemoryBusHub()
  const a = await startGateway(t, servers, { replicaId: 'A', hub, memory })
  const b = await startGateway(t, servers, { replicaId: 'B', hub, memory })
  t.teardown(async () => { await tasks.close(); await store.close() })
  return { a, b, tasks }
}

t.test('memory mode, two apps: a task created on A is answered through B from the shared store', async t => {
  const { a, b, tasks } = await twoApps(t)
  const alice = await connect(t, a, 'alice')
  const bob = await connect(t, b, 'bob')
  const id = await research(alice, 'alpha')
  t.match(await tasks.get(id), { replica: 'A', sessionId: alice.sid(), backendTaskId: String, task: { taskId: id } }, 'the record is written before the client saw the id')
  alice.to(b)
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: /working|completed/ }, 'tasks/get through B')
  t.same((await alice.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [id], 'tasks/list through B')
  await t.rejects(bob.client.experimental.tasks.getTask(id), { code: -32602 }, 'another session: unknown task')
  t.match(textOf(await alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)), /Research Report: alpha/, 'tasks/result through B')
  await eventually('the record follows the status', async () => (await tasks.get(id))?.task.status === 'completed' ? true : undefined, 5000, 100)
  await alice.transport.terminateSession()
  await eventually('the record goes with its session', async () => await tasks.get(id) === null ? true : undefined, 15_000, 250)
  t.pass('forgotten once the session ended')
})

t.test('memory mode: a record of a replica that is gone is failed, saying why, and answered from the store', async t => {
  const { a, tasks } = await twoApps(t)
  const alice = await connect(t, a, 'alice')
  // Owned as alice's own tasks are (her tenant and subject as the gateway recorded them).
  const real = await tasks.get(await research(alice, 'real'))
  const now = Date.now()
  const id = 'ghost-task-0000000000000'
  await tasks.create({
    id, tenant: real!.tenant, subjectDigest: real!.subjectDigest, sessionId: alice.sid(), server: 'everything', replica: 'ghost', connectionId: 'c', backendTaskId: 'b',
    task: { taskId: id, status: 'working', createdAt: new Date(now).toISOString(), ttl: 60_000 }, createdAt: now, expiresAt: now + 60_000
  })
  t.match(await alice.client.experimental.tasks.getTask(id), { taskId: id, status: 'failed', statusMessage: /replica ghost is gone/ }, 'tasks/get: failed')
  await t.rejects(alice.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { code: -32007 }, 'tasks/result: -32007')
  t.match(await tasks.get(id), { task: { status: 'failed' }, outcome: { error: { code: -32007 } } }, 'the store holds it failed')
})

t.test(`a session may hold ${MAX_LIVE_TASKS_PER_SESSION} live tasks; the next one is refused until one ends`, async t => {
  const gw = await startGateway(t, servers)
  const alice = await connect(t, gw, 'alice')
  // Ambiguous topics wait for input that never comes: they stay live.
  const ids: string[] = []
  for (let i = 0; i < MAX_LIVE_TASKS_PER_SESSION; i++) ids.push(await research(alice, `q${i}`, true))
  await t.rejects(research(alice, 'one too many', true), { code: -32000, message: /live tasks/ }, 'refused with a clear error')
  const bob = await connect(t, gw, 'bob')
  t.ok(await research(bob, 'bob\'s own'), 'another session is not bound by alice\'s tasks')
  await alice.client.experimental.tasks.cancelTask(ids[0]!)
  t.ok(await research(alice, 'after a cancel', true), 'a task ended frees a place')
})
