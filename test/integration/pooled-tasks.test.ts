// Tasks (MCP 2025-11-25, "Tasks") on pooled sessions: a task lives in the child whose connection ran
// its task-augmented tools/call, and the session holds no connection. The gateway must send every
// request about a task to that child, show each session only its own tasks under ids it minted,
// and fail the tasks of a child that is lost instead of leaving them `working`. Real gateway in
// memory mode, server-everything over stdio as the pooled server (simulate-research-query: four
// one-second stages), official SDK v1 clients.
import { execFileSync } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, RELATED_TASK_META_KEY, TaskStatusNotificationSchema, type CreateTaskResult
} from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const everything = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] }

interface Session { client: Client, statusIds: Set<string> }

async function gatewayWith (t: Test, poolSize: number): Promise<RunningGateway> {
  return await startGateway(t, { servers: { everything: { ...everything, sessions: 'pooled', poolSize, poolMax: poolSize, poolWaitMs: 30_000 } } })
}

async function connect (t: Test, gw: RunningGateway, name: string, elicitation = false): Promise<Session> {
  const client = new Client({ name, version: '1.0.0' }, { capabilities: elicitation ? { elicitation: {} } : {} })
  const session: Session = { client, statusIds: new Set() }
  client.setNotificationHandler(TaskStatusNotificationSchema, n => { session.statusIds.add(n.params.taskId) })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/everything`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return session
}

async function research (session: Session, topic: string, ambiguous = false): Promise<CreateTaskResult> {
  return await session.client.request({
    method: 'tools/call',
    params: { name: 'simulate-research-query', arguments: { topic, ambiguous }, task: { ttl: 60_000 } }
  }, CreateTaskResultSchema)
}

/** Initialised connections of the pool of server `everything` (mcpgw_pool_connections). */
async function readyConnections (gw: RunningGateway): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('mcpgw_pool_connections{server="everything"}'))
  return Number(line?.split(' ').pop() ?? NaN)
}

/** The server-everything children this process runs now (the gateway runs in it). */
function everythingChildren (): number[] {
  const out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(process.pid)], { encoding: 'utf8' })
  return out.split('\n').filter(line => line.includes('server-everything')).map(line => Number(line.trim().split(/\s+/)[0]))
}

for (const poolSize of [1, 2]) {
  t.test(`poolSize ${poolSize}: each session sees and reaches only its own tasks, on the child that runs them`, async t => {
    const gw = await gatewayWith(t, poolSize)
    const a = await connect(t, gw, 'a')
    const b = await connect(t, gw, 'b')
    // With two children, each task lands on its own: a's on the first idle child, then a long
    // call holds that child while b's task is created, so b's goes to the other.
    await eventually(`${poolSize} warm children`, async () => await readyConnections(gw) === poolSize ? true : undefined, 60_000, 250)
    const createdA = await research(a, 'alpha')
    const holding = poolSize > 1 ? b.client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 1 } }) : undefined
    const createdB = await research(b, 'beta')
    await holding
    const idA = createdA.task.taskId
    const idB = createdB.task.taskId
    t.match(createdA.task, { status: 'working', ttl: Number, createdAt: String }, 'a CreateTaskResult')
    t.match(idA, /^[A-Za-z0-9_-]{24}$/, 'the id the client sees is the gateway\'s (random, base64url)')
    t.not(idA, idB)

    t.same((await a.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [idA], 'a lists only its task')
    t.same((await b.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [idB], 'b lists only its task')
    t.match(await a.client.experimental.tasks.getTask(idA), { taskId: idA, status: /working|completed/ }, 'tasks/get reaches the child holding a\'s task')
    t.match(await b.client.experimental.tasks.getTask(idB), { taskId: idB, status: /working|completed/ }, 'and b\'s')

    // Another session's id is as unknown as one that never was.
    await t.rejects(b.client.experimental.tasks.getTask(idA), { code: -32602, message: /Task not found/ }, 'b cannot get a\'s task')
    await t.rejects(b.client.experimental.tasks.getTaskResult(idA, CallToolResultSchema), { code: -32602 }, 'nor its result')
    await t.rejects(b.client.experimental.tasks.cancelTask(idA), { code: -32602 }, 'nor cancel it')
    await t.rejects(a.client.experimental.tasks.getTask('no-such-task'), { code: -32602, message: /Task not found/ }, 'an unknown id')

    // tasks/result waits for the end, on the right child.
    const [resultA, resultB] = await Promise.all([
      a.client.experimental.tasks.getTaskResult(idA, CallToolResultSchema),
      b.client.experimental.tasks.getTaskResult(idB, CallToolResultSchema)
    ])
    t.match(textOf(resultA), /Research Report: alpha/, 'a\'s result')
    t.match(textOf(resultB), /Research Report: beta/, 'b\'s result')
    t.match(await a.client.experimental.tasks.getTask(idA), { taskId: idA, status: 'completed' }, 'completed')

    // Cancel.
    const third = (await research(a, 'gamma')).task.taskId
    t.match(await a.client.experimental.tasks.cancelTask(third), { taskId: third, status: 'cancelled' }, 'cancelled on its child')
    t.match(await a.client.experimental.tasks.getTask(third), { taskId: third, status: 'cancelled' })
    t.same((await a.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId).sort(), [idA, third].sort(), 'a lists its two tasks')
    t.same((await b.client.experimental.tasks.listTasks()).tasks.map(task => task.taskId), [idB], 'b still only its own')

    // Status notifications came under each session's own ids, never the other's or a backend's.
    t.ok([...a.statusIds].every(id => id === idA || id === third), `a heard only of its tasks (${[...a.statusIds].join(', ')})`)
    t.ok([...b.statusIds].every(id => id === idB), `b heard only of its task (${[...b.statusIds].join(', ')})`)
    t.ok(a.statusIds.has(idA), 'a heard of its task')
  })
}

t.test('a child lost mid-task: its task is failed, saying why, and tasks/result answers an error', async t => {
  const gw = await gatewayWith(t, 1)
  const a = await connect(t, gw, 'a')
  const id = (await research(a, 'doomed')).task.taskId
  const waiting = a.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)
  const pids = everythingChildren()
  t.ok(pids.length >= 1, `the pooled child runs (${pids.join(', ')})`)
  for (const pid of pids) process.kill(pid, 'SIGKILL')
  await t.rejects(waiting, { message: /lost the backend connection/ }, 'the waiting tasks/result answers an error')
  const task = await eventually('the task failed', async () => {
    const got = await a.client.experimental.tasks.getTask(id)
    return got.status === 'failed' ? got : undefined
  }, 10_000, 250)
  t.match(task, { taskId: id, status: 'failed', statusMessage: /lost the backend connection/ }, 'tasks/get: failed, with why')
  t.match((await a.client.experimental.tasks.listTasks()).tasks, [{ taskId: id, status: 'failed' }], 'tasks/list too')
  await t.rejects(a.client.experimental.tasks.getTaskResult(id, CallToolResultSchema), { message: /lost the backend connection/ }, 'tasks/result afterwards: an error')
  // The pool serves again (the supervisor restarted the child, or the pool opens another).
  const again = (await research(a, 'after')).task.taskId
  t.match(textOf(await a.client.experimental.tasks.getTaskResult(again, CallToolResultSchema)), /Research Report: after/, 'a new task runs to its end')
})

t.test('a task waiting for input keeps its child from the idle stop, and its elicitation reaches its session through tasks/result', async t => {
  const gw = await startGateway(t, {
    sessions: { idleTimeoutMs: 3000 },
    servers: { everything: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 2, poolWaitMs: 30_000 } }
  })
  await eventually('the warm child', async () => await readyConnections(gw) === 1 ? true : undefined, 60_000, 250)
  const a = await connect(t, gw, 'a', true)
  const b = await connect(t, gw, 'b')
  const related: unknown[] = []
  a.client.setRequestHandler(ElicitRequestSchema, async req => {
    related.push(req.params._meta?.[RELATED_TASK_META_KEY])
    return { action: 'accept', content: { interpretation: 'technical' } }
  })
  // b holds the warm child, so a's task opens a second one (beyond poolSize: stopped when idle).
  const holding = b.client.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 1 } })
  await new Promise(resolve => setTimeout(resolve, 200))
  const id = (await research(a, 'python', true)).task.taskId
  await holding
  t.equal(await readyConnections(gw), 2, 'a second child holds the task')
  // The warm child is the one used last: the second is the one the idle stop would take.
  await b.client.callTool({ name: 'echo', arguments: { message: 'x' } })
  // Past the idle timeout, the sessions kept alive by pings (answered by the gateway, no child).
  for (let i = 0; i < 6; i++) {
    await new Promise(resolve => setTimeout(resolve, 1000))
    await Promise.all([a.client.ping(), b.client.ping()])
  }
  t.equal(await readyConnections(gw), 2, 'the child holding a live task was not stopped as idle')
  t.match(await a.client.experimental.tasks.getTask(id), { taskId: id, status: 'input_required' }, 'the task waits for input')
  const result = await a.client.experimental.tasks.getTaskResult(id, CallToolResultSchema)
  t.match(textOf(result), /Clarification\*\*: technical/, 'the answer to the elicitation reached the task')
  t.same(related, [{ taskId: id }], 'the elicitation named the task by the session\'s id')
  // Terminal: the child is let go, and the idle stop takes it.
  await eventually('the second child stopped', async () => await readyConnections(gw) === 1 ? true : undefined, 15_000, 500)
  t.pass('the extra child went once its task ended')
})
