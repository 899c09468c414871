// Which messages for a client tell of tasks (routing/replica/task-events.ts tasksOf): only the
// shapes MCP "Tasks" defines, never a tool's result that happens to carry such fields.
import t from 'tap'
import { tasksOf } from '../../src/routing/replica/task-events.js'
import type { JsonRpcMessage } from '../../src/core/jsonrpc.js'

const task = { taskId: 't1', status: 'working', createdAt: '2026-01-01T00:00:00Z', lastUpdatedAt: '2026-01-01T00:00:01Z', ttl: 60000, pollInterval: 1000, statusMessage: 'busy' }

t.test('the shapes that tell of tasks', async t => {
  t.match(tasksOf({ jsonrpc: '2.0', id: 1, result: { task } }), { created: true, tasks: [{ taskId: 't1', status: 'working', ttl: 60000, statusMessage: 'busy' }] }, 'a CreateTaskResult')
  t.match(tasksOf({ jsonrpc: '2.0', id: 1, result: { ...task, status: 'completed' } }), { created: false, tasks: [{ status: 'completed' }] }, 'a tasks/get or tasks/cancel result')
  t.match(tasksOf({ jsonrpc: '2.0', id: 1, result: { tasks: [task, { taskId: 't2', status: 'failed' }, { nonsense: true }] } }), { created: false, tasks: [{ taskId: 't1' }, { taskId: 't2' }] }, 'a tasks/list result, entries that are no task left out')
  t.match(tasksOf({ jsonrpc: '2.0', method: 'notifications/tasks/status', params: { ...task, status: 'input_required' } }), { created: false, tasks: [{ status: 'input_required' }] }, 'a status notification')
  t.same(tasksOf({ jsonrpc: '2.0', id: 1, result: { ...task, ttl: null } })?.tasks[0]?.ttl, null, 'an unlimited ttl')
})

t.test('what is not about a task', async t => {
  const none: JsonRpcMessage[] = [
    { jsonrpc: '2.0', id: 1, result: { content: [{ type: 'text', text: 'x' }], task } },
    { jsonrpc: '2.0', id: 1, result: { content: [], taskId: 't', status: 'working' } },
    { jsonrpc: '2.0', id: 1, result: { tools: [] } },
    { jsonrpc: '2.0', id: 1, result: { task: { taskId: 3, status: 'working' } } },
    { jsonrpc: '2.0', id: 1, error: { code: -32602, message: 'Task not found' } },
    { jsonrpc: '2.0', method: 'notifications/progress', params: { taskId: 't', status: 'working' } },
    { jsonrpc: '2.0', id: 's.r.1', method: 'tasks/get', params: { taskId: 't' } }
  ]
  for (const message of none) t.equal(tasksOf(message), undefined, JSON.stringify(message).slice(0, 80))
})

t.test('long strings are cut, so a hostile backend cannot grow the view', async t => {
  const got = tasksOf({ jsonrpc: '2.0', id: 1, result: { task: { taskId: 'x'.repeat(1000), status: 's'.repeat(100), statusMessage: 'm'.repeat(5000) } } })
  t.equal(got?.tasks[0]?.taskId.length, 256)
  t.equal(got?.tasks[0]?.status.length, 32)
  t.equal(got?.tasks[0]?.statusMessage?.length, 512)
})
