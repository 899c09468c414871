// MCP Tasks (specification 2025-11-25, "Tasks") through an aggregate server: its members'
// task ids are tagged with their member, tasks/* requests reach the member that made the task, and
// a session sees only its own tasks. Driven by the SDK client (v1) against a gateway in memory
// mode; the members are server-everything (its simulate-research-query tool is task-only) and the
// full-server fixture (no tasks), both over stdio.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CallToolResultSchema, CreateTaskResultSchema, ElicitRequestSchema, GetTaskPayloadResultSchema, McpError, TaskStatusNotificationSchema, type Task
} from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

const everything = {
  transport: 'stdio',
  command: process.execPath,
  args: [fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url)), 'stdio']
}
const full = stdioFixture('full-server')
const RESEARCH = 'ev__simulate-research-query'

async function connect (t: Test, gw: RunningGateway, server = 'agg'): Promise<Client> {
  const client = new Client({ name: 'agg-tasks-test', version: '1' }, { capabilities: { elicitation: { form: {} } } })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

async function errorOf (p: Promise<unknown>): Promise<McpError | undefined> {
  try {
    await p
    return undefined
  } catch (err) {
    return err instanceof McpError ? err : undefined
  }
}

/** Starts a research task with a raw task-augmented tools/call: the CreateTaskResult's task. */
async function startResearch (client: Client, topic: string): Promise<Task> {
  const created = await client.request({ method: 'tools/call', params: { name: RESEARCH, arguments: { topic }, task: { ttl: 60_000 } } }, CreateTaskResultSchema)
  return created.task
}

t.test('tasks through an aggregate: tagged ids, routed to their member, one session\'s own', async t => {
  const gw = await startGateway(t, {
    servers: {
      everything,
      full,
      agg: { transport: 'aggregate', members: [{ server: 'everything', prefix: 'ev' }, { server: 'full', prefix: '' }] }
    }
  })
  const client = await connect(t, gw)
  const statuses: Array<{ taskId: string, status: string }> = []
  client.setNotificationHandler(TaskStatusNotificationSchema, n => { statuses.push({ taskId: n.params.taskId, status: n.params.status }) })

  t.test('the aggregate advertises its members\' tasks capability, and the tool its task support', async t => {
    t.same(client.getServerCapabilities()?.tasks, { list: {}, cancel: {}, requests: { tools: { call: {} } } }, 'the union of what the members offer')
    const { tools } = await client.listTools()
    t.match(tools.find(tool => tool.name === RESEARCH), { execution: { taskSupport: 'required' } }, 'execution.taskSupport survives the merged list')
  })

  let firstId = ''
  t.test('a task-augmented call: created, polled, listed and its result, all under the tagged id', async t => {
    const seen: string[] = []
    let result: Record<string, unknown> | undefined
    for await (const message of client.experimental.tasks.callToolStream({ name: RESEARCH, arguments: { topic: 'gateways' } }, CallToolResultSchema, { task: { ttl: 60_000 } })) {
      seen.push(message.type)
      if (message.type === 'taskCreated') {
        firstId = message.task.taskId
        t.match(firstId, /^everything:./, 'the id the client sees carries its member\'s tag')
        const got = await client.experimental.tasks.getTask(firstId)
        t.equal(got.taskId, firstId, 'tasks/get answers under the tagged id')
        t.match(got.status, /^(working|completed)$/)
        const listed = await client.experimental.tasks.listTasks()
        t.ok(listed.tasks.some(task => task.taskId === firstId), 'tasks/list shows the tagged id')
        t.notOk(listed.tasks.some(task => !task.taskId.startsWith('everything:')), 'every listed id is tagged')
        t.equal(listed.nextCursor, undefined, 'one page')
      }
      if (message.type === 'taskStatus') t.equal(message.task.taskId, firstId, 'every poll under the tagged id')
      if (message.type === 'result') result = message.result
      if (message.type === 'error') t.fail(`the stream failed: ${message.error.message}`)
    }
    t.equal(seen[0], 'taskCreated')
    t.equal(seen.at(-1), 'result')
    t.match(textOf(result), /Research Report: gateways/, 'the task\'s result arrives')

    const again = await client.request({ method: 'tasks/result', params: { taskId: firstId } }, GetTaskPayloadResultSchema)
    t.match(again._meta, { 'io.modelcontextprotocol/related-task': { taskId: firstId } }, 'tasks/result\'s related task is the tagged id')
    const done = await client.experimental.tasks.getTask(firstId)
    t.equal(done.status, 'completed')

    await eventually('a completed status notification', () => statuses.some(s => s.taskId === firstId && s.status === 'completed') ? true : undefined)
    t.ok(statuses.length > 0 && statuses.every(s => s.taskId.startsWith('everything:')), 'status notifications carry tagged ids')
  })

  t.test('a task that asks the client (input_required): the request names the tagged task, the answer reaches the member', async t => {
    const related: unknown[] = []
    client.setRequestHandler(ElicitRequestSchema, async request => {
      related.push(request.params._meta?.['io.modelcontextprotocol/related-task'])
      return { action: 'accept', content: { interpretation: 'historical' } }
    })
    let taskId = ''
    let result: Record<string, unknown> | undefined
    for await (const message of client.experimental.tasks.callToolStream({ name: RESEARCH, arguments: { topic: 'aggregates', ambiguous: true } }, CallToolResultSchema, { task: { ttl: 60_000 } })) {
      if (message.type === 'taskCreated') taskId = message.task.taskId
      if (message.type === 'result') result = message.result
      if (message.type === 'error') t.fail(`the stream failed: ${message.error.message}`)
    }
    t.match(taskId, /^everything:./)
    t.same(related, [{ taskId }], 'the member\'s elicitation relates to the tagged task')
    // On input_required the stream asks tasks/result, which carries the member's question and then
    // waits for the task to end: its result is the final one.
    t.match(textOf(result), /Clarification\*\*: historical/, 'the client\'s answer reached the member')
  })

  t.test('cancel reaches the member that made the task', async t => {
    const task = await startResearch(client, 'cancel me')
    t.match(task.taskId, /^everything:./)
    const cancelled = await client.experimental.tasks.cancelTask(task.taskId)
    t.equal(cancelled.taskId, task.taskId, 'the cancelled task under its tagged id')
    t.equal(cancelled.status, 'cancelled')
    t.equal((await client.experimental.tasks.getTask(task.taskId)).status, 'cancelled', 'and it stays cancelled')
    const twice = await errorOf(client.experimental.tasks.cancelTask(task.taskId))
    t.equal(twice?.code, -32602, 'a terminal task cannot be cancelled again (the member\'s own answer)')
  })

  t.test('an id with no tag, an unknown tag, or unknown to its member is an unknown task', async t => {
    for (const taskId of ['nope', 'mystery:abc', 'full:abc', ':abc', 'everything:', 'everything:not-a-task']) {
      const get = await errorOf(client.experimental.tasks.getTask(taskId))
      t.equal(get?.code, -32602, `tasks/get ${taskId}`)
      t.match(get?.message, /Task not found/)
      t.equal((await errorOf(client.request({ method: 'tasks/result', params: { taskId } }, GetTaskPayloadResultSchema)))?.code, -32602, `tasks/result ${taskId}`)
      t.equal((await errorOf(client.experimental.tasks.cancelTask(taskId)))?.code, -32602, `tasks/cancel ${taskId}`)
    }
    const untagged = firstId.slice('everything:'.length)
    t.equal((await errorOf(client.experimental.tasks.getTask(untagged)))?.code, -32602, 'the member\'s own id, untagged, is unknown to the aggregate')
    t.equal((await errorOf(client.experimental.tasks.listTasks('some-cursor')))?.code, -32602, 'a cursor the aggregate never gave')
  })

  t.test('a second session on the aggregate neither sees nor reaches the first one\'s tasks', async t => {
    const other = await connect(t, gw)
    const mine = await startResearch(other, 'second session')
    const theirs = (await other.experimental.tasks.listTasks()).tasks.map(task => task.taskId)
    t.same(theirs, [mine.taskId], 'its list holds its own task only')
    t.equal((await errorOf(other.experimental.tasks.getTask(firstId)))?.code, -32602, 'the first session\'s task is unknown to it')
    t.equal((await errorOf(other.experimental.tasks.cancelTask(firstId)))?.code, -32602, 'and cannot be cancelled from it')
    t.notOk((await client.experimental.tasks.listTasks()).tasks.some(task => task.taskId === mine.taskId), 'nor the first its')
    await other.experimental.tasks.cancelTask(mine.taskId)
  })
})

t.test('a pooled member takes no part in tasks: no capability, no task support, plain calls', async t => {
  const gw = await startGateway(t, {
    servers: {
      shared: { ...everything, sessions: 'pooled' },
      agg: { transport: 'aggregate', members: [{ server: 'shared', prefix: 'ev' }] }
    }
  })
  const client = await connect(t, gw)
  t.equal(client.getServerCapabilities()?.tasks, undefined, 'no tasks capability')
  const { tools } = await client.listTools()
  const research = tools.find(tool => tool.name === RESEARCH)
  t.ok(research !== undefined, 'the task-only tool is listed')
  t.equal(research?.execution?.taskSupport, undefined, 'without its task support')
  const echo = await client.request({ method: 'tools/call', params: { name: 'ev__echo', arguments: { message: 'plain' }, task: { ttl: 60_000 } } }, CallToolResultSchema)
  t.equal(textOf(echo), 'Echo: plain', 'a task-augmented call runs as a plain one')
  t.equal((await errorOf(client.experimental.tasks.listTasks()))?.code, -32601, 'tasks/list: no member lists tasks')
})
