// The 2026-07-28 Tasks extension in front of 2026-07-28 backends (docs/behaviour.md "2026-07-28
// Tasks"): a backend's own tasks are relayed as they are (the same answers through the gateway as
// from the backend directly); a backend without tasks, on a server that hosts them, gets its slow
// calls made tasks by the gateway, and a task's cancel aborts the upstream call.
import t from 'tap'
import { startTasksServer } from '../fixtures/modern-tasks-server.js'
import { startModernUpstream } from '../fixtures/modern-upstream.js'
import { startGateway } from '../helpers/gateway.js'
import { eventually } from '../helpers/wait.js'
import { envelope, last, modernPost, resultOf } from '../helpers/modern.js'

const withTasks = envelope({ elicitation: {}, extensions: { 'io.modelcontextprotocol/tasks': {} } })
const STAMPS = new Set(['taskId', 'createdAt', 'lastUpdatedAt'])

/** An answer with its per-run values (ids, times) replaced, to compare two runs. */
function shape (value: unknown): unknown {
  if (Array.isArray(value)) return value.map(shape)
  if (typeof value !== 'object' || value === null) return value
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, STAMPS.has(k) ? typeof v : shape(v)]))
}

/** One client's walk through the extension against `url`; every answer, shaped. */
async function walk (url: string): Promise<unknown[]> {
  const seen: unknown[] = []
  const post = async (method: string, params: Record<string, unknown>): Promise<Record<string, unknown>> => {
    const message = last(await modernPost(url, method, { ...params, _meta: withTasks }))
    seen.push(shape('error' in message ? { error: message.error } : message.result))
    return (message.result ?? {}) as Record<string, unknown>
  }
  const poll = async (taskId: unknown, status: string): Promise<void> => {
    await eventually(`task ${status}`, async () => {
      const r = resultOf(await modernPost(url, 'tasks/get', { taskId, _meta: withTasks }))
      return r.status === status ? true : undefined
    })
    await post('tasks/get', { taskId })
  }
  const discover = resultOf(await modernPost(url, 'server/discover', { _meta: withTasks }))
  seen.push((discover.capabilities as Record<string, unknown>).extensions)
  await post('tools/call', { name: 'greet', arguments: { name: 'w' } })
  const slow = await post('tools/call', { name: 'slow_compute', arguments: { seconds: 0.2, label: 'x' } })
  await poll(slow.taskId, 'completed')
  const confirm = await post('tools/call', { name: 'confirm_delete', arguments: { filename: 'f' } })
  await poll(confirm.taskId, 'input_required')
  await post('tasks/update', { taskId: confirm.taskId, inputResponses: { confirm: { action: 'accept', content: { confirm: 'yes' } } } })
  await poll(confirm.taskId, 'completed')
  const failing = await post('tools/call', { name: 'protocol_error_job', arguments: {} })
  await poll(failing.taskId, 'failed')
  const long = await post('tools/call', { name: 'slow_compute', arguments: { seconds: 60, label: 'long' } })
  await post('tasks/cancel', { taskId: long.taskId })
  await post('tasks/get', { taskId: long.taskId })
  await post('tasks/get', { taskId: 'no-such-task' })
  seen.push(last(await modernPost(url, 'tasks/get', { taskId: long.taskId, _meta: envelope() })).error !== undefined)
  return seen
}

t.test("a backend's own tasks: the same through the gateway as directly", async t => {
  const backend = await startTasksServer()
  t.teardown(backend.close)
  // Hosting configured too: a backend that offers tasks keeps its own (the gateway hosts none).
  const gw = await startGateway(t, { servers: { tasks: { transport: 'streamable-http', url: backend.url, protocol: 'modern', tasks: { hostAfterMs: 50 } } } })
  const direct = await walk(backend.url)
  const cancelledDirect = backend.cancelled.length
  const through = await walk(`${gw.url}/mcp/tasks`)
  t.same(through, direct, 'every answer has the same shape through the gateway')
  t.equal(backend.cancelled.length, cancelledDirect + 1, "the gateway's tasks/cancel reached the backend's task")
  t.match(direct[2], { resultType: 'task', status: 'working' }, 'a task was made (the walk covers tasks)')
})

t.test('a 2026-07-28 backend without tasks: the gateway hosts its slow calls', async t => {
  const upstream = await startModernUpstream({ modernOnly: true })
  t.teardown(upstream.close)
  const gw = await startGateway(t, { servers: { modern: { transport: 'streamable-http', url: upstream.url, protocol: 'modern', tasks: { hostAfterMs: 200 } } } })
  const url = `${gw.url}/mcp/modern`
  const discover = resultOf(await modernPost(url, 'server/discover', { _meta: withTasks }))
  t.same((discover.capabilities as Record<string, unknown>).extensions, { 'io.modelcontextprotocol/tasks': {} }, 'the extension is offered for the backend')
  const echo = resultOf(await modernPost(url, 'tools/call', { name: 'echo', arguments: { message: 'hi' }, _meta: withTasks }))
  t.match(echo, { resultType: 'complete', content: [{ text: 'modern echo: hi' }] }, 'a quick call is answered as it is')
  const slow = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { tag: 'hosted' }, _meta: withTasks }))
  t.match(slow, { resultType: 'task', status: 'working', taskId: /^gwt-/ }, 'a slow call becomes a task the gateway hosts')
  t.equal(resultOf(await modernPost(url, 'tasks/get', { taskId: slow.taskId, _meta: withTasks })).status, 'working')
  t.same(resultOf(await modernPost(url, 'tasks/cancel', { taskId: slow.taskId, _meta: withTasks })), { resultType: 'complete' })
  t.ok(await eventually('the upstream call was aborted', () => upstream.aborted.includes('hosted') ? true : undefined), 'cancelling the task aborted the backend call')
  t.equal(resultOf(await modernPost(url, 'tasks/get', { taskId: slow.taskId, _meta: withTasks })).status, 'cancelled')
  const other = last(await modernPost(url, 'tasks/get', { taskId: 'task-of-the-backend', _meta: withTasks }))
  t.ok(other.error !== undefined, 'an id the gateway does not hold goes to the backend, which knows none')
})
