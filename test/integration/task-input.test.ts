// Input while a task runs, and tasks the client runs (MCP 2025-11-25, "Tasks": input_required,
// "Task-augmented requests" sent to a client), on each session kind. server-everything over stdio,
// the SDK v1 client with its experimental tasks API and its own task store.
// - A task that needs input (simulate-research-query, ambiguous) reaches `input_required`; its
//   elicitation comes to the client that owns the task through tasks/result, and the answer
//   reaches the task: here on a dedicated session (pooled-tasks.test.ts and aggregate-tasks.test.ts
//   hold the same for a pooled session and an aggregate member).
// - Client-side tasks: a dedicated session relays the client's `tasks.requests` in its initialize,
//   so the server may ask the client to run sampling or elicitation as a task, poll the client's tasks/get and
//   read its tasks/result, all through the gateway. A pool connection and an aggregate's member
//   connection are initialised by the gateway, which declares no `tasks.requests` there: their
//   servers ask such clients plainly (server-everything then does not offer its async tools).
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js'
import { CallToolResultSchema, CreateMessageRequestSchema, ElicitRequestSchema, RELATED_TASK_META_KEY } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { scrape } from '../helpers/prometheus.js'
import { eventually, textOf } from '../helpers/wait.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const everything = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] }

/** A client that runs sampling and elicitation as tasks when asked to (each completes after `runMs`). */
async function taskClient (t: Test, gw: RunningGateway, server: string, runMs: number): Promise<{ client: Client, asked: Array<Record<string, unknown> | undefined> }> {
  const store = new InMemoryTaskStore()
  const client = new Client({ name: 'client-tasks', version: '1' }, {
    capabilities: { sampling: {}, elicitation: { form: {} }, tasks: { list: {}, cancel: {}, requests: { sampling: { createMessage: {} }, elicitation: { create: {} } } } },
    taskStore: store
  })
  const asked: Array<Record<string, unknown> | undefined> = []
  client.setRequestHandler(CreateMessageRequestSchema, async (request, extra) => {
    asked.push(request.params.task as Record<string, unknown> | undefined)
    const result = { role: 'assistant' as const, content: { type: 'text' as const, text: 'sampled by the client' }, model: 'test-model', stopReason: 'endTurn' }
    if (request.params.task === undefined || extra.taskStore === undefined) return result
    const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl })
    const taskStore = extra.taskStore
    setTimeout(() => { void taskStore.storeTaskResult(task.taskId, 'completed', result) }, runMs)
    return { task }
  })
  client.setRequestHandler(ElicitRequestSchema, async (request, extra) => {
    asked.push(request.params.task as Record<string, unknown> | undefined)
    const result = { action: 'accept' as const, content: { name: 'Ada', favoriteColor: 'Green' } }
    if (request.params.task === undefined || extra.taskStore === undefined) return result
    const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl })
    const taskStore = extra.taskStore
    setTimeout(() => { void taskStore.storeTaskResult(task.taskId, 'completed', result) }, runMs)
    return { task }
  })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`)))
  t.teardown(async () => { await client.close().catch(() => {}); store.cleanup() })
  return { client, asked }
}

t.test('input_required on a dedicated session: the question reaches the owner, its answer the task', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const client = new Client({ name: 'input', version: '1' }, { capabilities: { elicitation: { form: {} } } })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/everything`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  const related: unknown[] = []
  client.setRequestHandler(ElicitRequestSchema, async request => {
    related.push(request.params._meta?.[RELATED_TASK_META_KEY])
    return { action: 'accept', content: { interpretation: 'historical' } }
  })
  let taskId = ''
  let result: Record<string, unknown> | undefined
  for await (const message of client.experimental.tasks.callToolStream({ name: 'simulate-research-query', arguments: { topic: 'gateways', ambiguous: true } }, CallToolResultSchema, { task: { ttl: 60_000 } })) {
    if (message.type === 'taskCreated') taskId = message.task.taskId
    if (message.type === 'result') result = message.result
    if (message.type === 'error') t.fail(`the stream failed: ${message.error.message}`)
  }
  t.ok(taskId !== '', 'a task was created')
  t.same(related, [{ taskId }], 'the elicitation names the task')
  t.match(textOf(result), /Clarification\*\*: historical/, 'the client\'s answer reached the task')
  const m = await eventually('the transitions', async () => {
    const s = await scrape(gw.url)
    return s.sum('mcpgw_task_status_transitions_total', { server: 'everything', status: 'completed' }) === 1 ? s : undefined
  })
  t.equal(m.sum('mcpgw_task_status_transitions_total', { server: 'everything', status: 'input_required' }), 1, 'the client saw input_required, counted once')
})

t.test('client-side tasks on a dedicated session: the server\'s task-augmented sampling runs as the client\'s task', async t => {
  const gw = await startGateway(t, { servers: { everything } })
  const { client, asked } = await taskClient(t, gw, 'everything', 1500)
  const { tools } = await client.listTools()
  t.ok(tools.some(tool => tool.name === 'trigger-sampling-request-async'), 'the server saw the client\'s tasks.requests')
  const result = await client.callTool({ name: 'trigger-sampling-request-async', arguments: { prompt: 'hello' } }, CallToolResultSchema, { timeout: 30_000 })
  t.match(asked, [{ ttl: Number }], 'the sampling request came task-augmented')
  const text = textOf(result)
  t.match(text, /^\[COMPLETED\]/, 'the server polled the client\'s task to its end')
  t.match(text, /Poll 1: working/, 'tasks/get reached the client while its task ran')
  t.match(text, /sampled by the client/, 'and tasks/result brought the client\'s result back')

  asked.length = 0
  const elicited = await client.callTool({ name: 'trigger-elicitation-request-async', arguments: {} }, CallToolResultSchema, { timeout: 30_000 })
  t.match(asked, [{ ttl: Number }], 'the elicitation came task-augmented too')
  t.match(elicited.content, [{ text: /^\[COMPLETED\]/ }, { text: /Ada/ }], 'and its answer, read through the client\'s tasks/result, reached the server')
})

for (const kind of ['pooled', 'aggregate'] as const) {
  t.test(`client-side tasks on a ${kind} session: not declared on the gateway's own connection`, async t => {
    const gw = await startGateway(t, {
      servers: kind === 'pooled'
        ? { everything: { ...everything, sessions: 'pooled', poolSize: 1 } }
        : { member: everything, everything: { transport: 'aggregate', members: [{ server: 'member', prefix: '' }] } }
    })
    const { client, asked } = await taskClient(t, gw, 'everything', 100)
    const { tools } = await client.listTools()
    t.notOk(tools.some(tool => tool.name === 'trigger-sampling-request-async'), 'the server saw no tasks.requests')
    t.ok(tools.some(tool => tool.name === 'trigger-sampling-request'), 'but sampling')
    const result = await client.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'hello' } }, CallToolResultSchema, { timeout: 30_000 })
    t.same(asked, [undefined], 'the sampling request came plain')
    t.match(textOf(result), /sampled by the client/, 'and was answered')
  })
}
