// A 2026-07-28 client with the Tasks extension calling a 2025-11-25 backend's task tool on a pooled
// server (server-everything's simulate-research-query, taskSupport "required"): bridged
// (docs/behaviour.md "2026-07-28 Tasks"). The backend's task is made on a pooled connection, the
// client gets a task of the gateway's, the backend's mid-task elicitation becomes the task's
// inputRequests (answered with tasks/update), its result comes inline; a client without the
// extension gets -32021; tasks/cancel cancels the backend's task.
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { startGateway } from '../helpers/gateway.js'
import { eventually } from '../helpers/wait.js'
import { envelope, last, modernFetch, modernPost, readEvents, resultOf } from '../helpers/modern.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const ext = envelope({ elicitation: {}, extensions: { 'io.modelcontextprotocol/tasks': {} } })

t.test("a 2025-11-25 backend's task tool, bridged", async t => {
  const gw = await startGateway(t, { servers: { every: { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'], sessions: 'pooled', poolSize: 1, poolWaitMs: 30_000 } } })
  const url = `${gw.url}/mcp/every`
  const discover = resultOf(await modernPost(url, 'server/discover', { _meta: ext }))
  const capabilities = discover.capabilities as Record<string, unknown>
  t.same(capabilities.extensions, { 'io.modelcontextprotocol/tasks': {} }, 'the extension is offered')
  t.notOk('tasks' in capabilities, "the 2025 era's tasks capability is not")
  // server-everything asks roots/list 350 ms after its initialize: landing on a call of a client
  // that declared no roots, it would fail that call (-32021). Asked while the connection is idle,
  // it is refused at the gateway and the calls below run undisturbed.
  await new Promise(resolve => setTimeout(resolve, 1000))

  const refused = last(await modernPost(url, 'tools/call', { name: 'simulate-research-query', arguments: { topic: 'x' }, _meta: envelope() }))
  t.match(refused.error, { code: -32021, data: { requiredCapabilities: { extensions: { 'io.modelcontextprotocol/tasks': {} } } } }, 'a required task tool without the extension: -32021')
  t.match(resultOf(await modernPost(url, 'tools/call', { name: 'echo', arguments: { message: 'm' }, _meta: ext })), { resultType: 'complete', content: [{ text: 'Echo: m' }] }, 'a tool without task support is a plain call')

  const created = resultOf(await modernPost(url, 'tools/call', { name: 'simulate-research-query', arguments: { topic: 'gateways', ambiguous: true }, _meta: ext }))
  t.match(created, { resultType: 'task', status: 'working', taskId: /^gwt-/ }, 'a task handle of the gateway')
  const asking = await eventually('the backend asks for a clarification', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    return r.status === 'input_required' ? r : undefined
  }, 45_000)
  t.match(asking.statusMessage, /multiple interpretations for "gateways"/, "the backend's statusMessage of its input_required task is the task's")
  const [key, input] = Object.entries(asking.inputRequests as Record<string, { method: string }>)[0]!
  t.equal(input.method, 'elicitation/create', "the backend's elicitation is the task's input request")
  t.same(resultOf(await modernPost(url, 'tasks/update', { taskId: created.taskId, inputResponses: { [key]: { action: 'accept', content: { interpretation: 'technical' } } }, _meta: ext })), { resultType: 'complete' })
  const done = await eventually('the task completed', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    return r.status === 'completed' ? r : undefined
  }, 45_000)
  const text = (done.result as { content: Array<{ text: string }> }).content[0]!.text
  t.match(text, /Research Report: gateways \(technical\)/, "the backend's result inline, with the clarification the client gave")
  t.notOk(JSON.stringify(done.result).includes('related-task'), "the 2025 related-task _meta is not carried over")

  const other = resultOf(await modernPost(url, 'tools/call', { name: 'simulate-research-query', arguments: { topic: 'cancel me' }, _meta: ext }))
  t.same(resultOf(await modernPost(url, 'tasks/cancel', { taskId: other.taskId, _meta: ext })), { resultType: 'complete' })
  t.equal(resultOf(await modernPost(url, 'tasks/get', { taskId: other.taskId, _meta: ext })).status, 'cancelled', 'cancelled')
  // The pool's one connection is free again once the backend's task was cancelled there.
  t.match(resultOf(await modernPost(url, 'tools/call', { name: 'echo', arguments: { message: 'after' }, _meta: ext })), { content: [{ text: 'Echo: after' }] }, 'the connection serves the next call')
})

t.test("a bridged task shows the backend's statusMessage as it goes, in tasks/get and notifications/tasks", async t => {
  const gw = await startGateway(t, { servers: { every: { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'], sessions: 'pooled', poolSize: 1, poolWaitMs: 30_000 } } })
  const url = `${gw.url}/mcp/every`
  await modernPost(url, 'server/discover', { _meta: ext })
  await new Promise(resolve => setTimeout(resolve, 1000))
  const created = resultOf(await modernPost(url, 'tools/call', { name: 'simulate-research-query', arguments: { topic: 'stages' }, _meta: ext }))
  t.equal(created.resultType, 'task')

  const abort = new AbortController()
  t.teardown(() => { abort.abort() })
  const res = await modernFetch(url, 'subscriptions/listen', { notifications: { taskIds: [created.taskId] }, _meta: ext }, 7, {}, abort.signal)
  const { events, reading } = readEvents(res)
  await eventually('the acknowledgement', () => events.find(e => e.method === 'notifications/subscriptions/acknowledged'))

  // The backend goes through its stages (a second each), saying so in its statusMessage.
  const seen = new Set<string>()
  const done = await eventually('the task completed', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    if (r.status === 'working' && typeof r.statusMessage === 'string') seen.add(r.statusMessage)
    return r.status === 'completed' ? r : undefined
  }, 45_000, 200)
  t.ok(seen.size >= 2, `tasks/get showed the backend's stages: ${[...seen].join(' | ')}`)
  for (const message of seen) t.match(message, /^(Gathering sources|Analyzing content|Synthesizing findings|Generating report)\.\.\.$/, `a stage of the backend: ${message}`)
  t.notOk('statusMessage' in done, 'the completed task carries no stage any more')
  const heard = await eventually('notifications/tasks: completed', () => events.find(e => e.method === 'notifications/tasks' && (e.params as { status?: string }).status === 'completed'))
  t.ok(heard !== undefined)
  const stages = events.filter(e => e.method === 'notifications/tasks' && (e.params as { status?: string }).status === 'working').map(e => (e.params as { statusMessage?: string }).statusMessage)
  t.ok(stages.includes('Generating report...'), `notifications/tasks told the stages: ${stages.join(' | ')}`)
  abort.abort()
  await reading
})
