// Task ids through an aggregate (routing/aggregate/tasks.ts): tagged per member, untagged for the
// member, and the united capability. Pure logic, so a unit test; the integration test
// (test/integration/aggregate-tasks.test.ts) drives it through a gateway.
import t from 'tap'
import {
  RELATED_TASK, tagTask, tagTaskId, tagTaskParams, tagTaskResult, unitedTasks, unknownTaskMessage, untagTaskId
} from '../../src/routing/aggregate/tasks.js'

t.test('a tag names its member; the first colon ends it', async t => {
  t.equal(tagTaskId('everything', 'abc'), 'everything:abc')
  t.same(untagTaskId('everything:abc'), { server: 'everything', taskId: 'abc' })
  t.same(untagTaskId('a:b:c'), { server: 'a', taskId: 'b:c' }, 'a member\'s own id may hold colons')
  for (const bad of ['abc', ':abc', 'everything:', '']) t.equal(untagTaskId(bad), null, `no tag in '${bad}'`)
})

t.test('the united capability: what at least one member offers', async t => {
  t.equal(unitedTasks([{ tools: {} }, {}]), undefined, 'no member has tasks: none')
  t.same(unitedTasks([{ tasks: { list: {} } }, { tasks: { cancel: {}, requests: { tools: { call: {} } } } }]),
    { list: {}, cancel: {}, requests: { tools: { call: {} } } })
  t.same(unitedTasks([{ tasks: {} }]), {}, 'tasks with nothing in it stays so')
  t.same(unitedTasks([{ tasks: { requests: { sampling: { createMessage: {} } } } }]), {}, 'requests the gateway does not route are left out')
})

t.test('results, notifications and requests carry tagged ids', async t => {
  const task = { taskId: 'x1', status: 'working', ttl: null, createdAt: 'c', lastUpdatedAt: 'u' }
  t.same(tagTaskResult('m', 'tools/call', { task }), { task: { ...task, taskId: 'm:x1' } }, 'a CreateTaskResult')
  t.same(tagTaskResult('m', 'tasks/get', { ...task, _meta: {} }), { ...task, taskId: 'm:x1', _meta: {} }, 'tasks/get')
  t.same(tagTaskResult('m', 'tasks/cancel', task), { ...task, taskId: 'm:x1' }, 'tasks/cancel')
  t.same(tagTaskResult('m', 'tasks/result', { content: [], _meta: { [RELATED_TASK]: { taskId: 'x1' }, other: 1 } }),
    { content: [], _meta: { [RELATED_TASK]: { taskId: 'm:x1' }, other: 1 } }, 'tasks/result: its related task')
  const plain = { content: [{ type: 'text', text: 'hi' }] }
  t.equal(tagTaskResult('m', 'tools/call', plain), plain, 'a result with no task is the same object')
  t.same(tagTask('m', task), { ...task, taskId: 'm:x1' }, 'a listed task')
  t.same(tagTaskParams('m', 'notifications/tasks/status', task), { ...task, taskId: 'm:x1' }, 'a status notification')
  t.same(tagTaskParams('m', 'elicitation/create', { message: 'q', _meta: { [RELATED_TASK]: { taskId: 'x1' } } }),
    { message: 'q', _meta: { [RELATED_TASK]: { taskId: 'm:x1' } } }, 'a request related to a task')
  const log = { level: 'info', data: 'd' }
  t.equal(tagTaskParams('m', 'notifications/message', log), log, 'a message with no task is the same object')
})

t.test('the unknown-task error speaks as the SDK\'s servers do', async t => {
  t.equal(unknownTaskMessage('tasks/get', 'x'), 'Failed to retrieve task: Task not found')
  t.equal(unknownTaskMessage('tasks/result', 'x'), 'Task not found: x')
  t.equal(unknownTaskMessage('tasks/cancel', 'x'), 'Task not found: x')
})
