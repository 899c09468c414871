// Tasks the gateway hosts for 2026-07-28 clients (docs/behaviour.md "2026-07-28 Tasks"): a
// tools/call of a client that declared io.modelcontextprotocol/tasks and that has not answered after
// `tasks.hostAfterMs` becomes a task handle; tasks/get answers its status and, once done, its
// result; tasks/cancel cancels the backend call; another tenant naming the id gets "unknown task".
import t, { type Test } from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { eventually } from '../helpers/wait.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { RedisTaskStore } from '../../src/state/task-store-redis.js'
import { parseConfig } from '../../src/config/load.js'
import { envelope, last, modernFetch, modernPost, readEvents, resultOf } from '../helpers/modern.js'
import { scrape } from '../helpers/prometheus.js'
import { createLogger } from '../../src/telemetry/logger.js'

/** A Redis of the test's own for two apps, and a view of the task store they share on it. */
async function onRedis (t: Test, servers: Record<string, unknown>): Promise<{ store: RedisTaskStore, raw: Record<string, unknown> }> {
  const redis = await startRedis(t)
  const keyPrefix = randomPrefix()
  const store = new RedisTaskStore(await testRedis(t, redis.url), keyPrefix)
  return { store, raw: { redis: { url: redis.url, keyPrefix, leaseMs: 1500, connectTimeoutMs: 2000 }, servers } }
}

const TASKS = { extensions: { 'io.modelcontextprotocol/tasks': {} } }
const withTasks = envelope(TASKS)

t.test('hosted tasks on a pooled stdio server (memory mode)', async t => {
  const gw = await startGateway(t, {
    servers: {
      tools: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 1, tasks: { hostAfterMs: 200, ttlMs: 60_000, pollIntervalMs: 250 } }),
      plain: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 })
    }
  })
  const url = `${gw.url}/mcp/tools`

  const discover = resultOf(await modernPost(url, 'server/discover', { _meta: withTasks }))
  t.same((discover.capabilities as Record<string, unknown>).extensions, { 'io.modelcontextprotocol/tasks': {} }, 'a hosting server offers the extension')
  const plain = resultOf(await modernPost(`${gw.url}/mcp/plain`, 'server/discover', { _meta: withTasks }))
  t.notOk((plain.capabilities as Record<string, unknown>).extensions, 'a server without hosting does not')

  const fast = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 10 }, _meta: withTasks }))
  t.equal(fast.resultType, 'complete', 'a call that answers in time is answered as it is')

  const noExt = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 600 }, _meta: envelope() }))
  t.equal(noExt.resultType, 'complete', 'a client without the extension never gets a task')

  const started = Date.now()
  const created = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 1200 }, _meta: withTasks }))
  t.equal(created.resultType, 'task', 'a slow call becomes a task')
  t.ok(Date.now() - started < 1000, 'the handle comes after hostAfterMs, not at the end of the call')
  t.match(created, { status: 'working', ttlMs: 60_000, pollIntervalMs: 250, taskId: /^gwt-[A-Za-z0-9_-]{32}$/ })
  const taskId = created.taskId as string

  const working = resultOf(await modernPost(url, 'tasks/get', { taskId, _meta: withTasks }))
  t.match(working, { resultType: 'complete', taskId, status: 'working' }, 'tasks/get right after the handle finds the task')
  t.notOk('result' in working, 'a working task has no result')

  const done = await eventually('the task completed', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId, _meta: withTasks }))
    return r.status === 'completed' ? r : undefined
  })
  t.match(done.result, { content: [{ type: 'text', text: 'slept 1200 ms' }] }, 'the completed task carries the call\'s result inline')

  const refused = last(await modernPost(url, 'tasks/get', { taskId, _meta: envelope() }))
  t.equal((refused.error as { code: number }).code, -32021, 'tasks/get without the extension: missing capability')
  t.match((refused.error as { data: unknown }).data, { requiredCapabilities: TASKS })

  const unknown = last(await modernPost(url, 'tasks/get', { taskId: 'gwt-nope', _meta: withTasks }))
  t.equal((unknown.error as { code: number }).code, -32602, 'an unknown id: -32602')
  const elsewhere = last(await modernPost(`${gw.url}/mcp/plain`, 'tasks/get', { taskId, _meta: withTasks }))
  t.equal((elsewhere.error as { code: number }).code, -32602, 'the id on another server is unknown there')

  const failing = last(await modernPost(url, 'tools/call', { name: 'throw', arguments: {}, _meta: withTasks }))
  t.ok(failing.error, 'a call that fails at once is its error, not a task')

  // Cancel: the backend call is cancelled (the child records the cancellation).
  const long = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 30_000 }, _meta: withTasks }))
  t.equal(long.resultType, 'task')
  const ack = resultOf(await modernPost(url, 'tasks/cancel', { taskId: long.taskId, _meta: withTasks }))
  t.same(ack, { resultType: 'complete' }, 'tasks/cancel: an empty ack')
  const cancelled = resultOf(await modernPost(url, 'tasks/get', { taskId: long.taskId, _meta: withTasks }))
  t.equal(cancelled.status, 'cancelled', 'the task is cancelled')
  const again = resultOf(await modernPost(url, 'tasks/cancel', { taskId: long.taskId, _meta: withTasks }))
  t.same(again, { resultType: 'complete' }, 'cancelling a cancelled task: the same ack')
  // poolMax 1: this call runs on the child that ran the cancelled one, once it is free again.
  const seen = resultOf(await modernPost(url, 'tools/call', { name: 'cancelled-requests', arguments: {}, _meta: withTasks }))
  t.equal(JSON.parse((seen.content as Array<{ text: string }>)[0]!.text).length, 1, 'the backend saw its call cancelled')

  const removed = last(await modernPost(url, 'tasks/result', { taskId, _meta: withTasks }))
  t.equal((removed.error as { code: number }).code, -32601, 'tasks/result is not a method of this era')
})

t.test('hosted tasks are counted and audited as a session\'s tasks are', async t => {
  const lines: string[] = []
  const gw = await startGateway(t, {
    servers: { tools: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 2, tasks: { hostAfterMs: 100 } }) }
  }, { log: createLogger('info', 'hosted-tasks', { write: (line: string) => { lines.push(line) } }) })
  const url = `${gw.url}/mcp/tools`
  const done = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 600 }, _meta: withTasks }))
  const cancelled = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 30_000 }, _meta: withTasks }))
  t.equal(done.resultType, 'task')
  t.equal(cancelled.resultType, 'task')
  await modernPost(url, 'tasks/cancel', { taskId: cancelled.taskId, _meta: withTasks })
  await modernPost(url, 'tasks/cancel', { taskId: cancelled.taskId, _meta: withTasks })
  const m = await eventually('the hosted task completed', async () => {
    const s = await scrape(gw.url)
    return s.sum('mcpgw_task_status_transitions_total', { server: 'tools', status: 'completed' }) >= 1 ? s : undefined
  })
  t.equal(m.sum('mcpgw_tasks_created_total', { server: 'tools' }), 2, 'two tasks created')
  t.equal(m.sum('mcpgw_task_status_transitions_total', { server: 'tools', status: 'working' }), 2, 'both were working')
  t.equal(m.sum('mcpgw_task_status_transitions_total', { server: 'tools', status: 'cancelled' }), 1, 'one cancelled, once: the second cancel changes nothing')
  t.equal(m.sum('mcpgw_task_status_transitions_total', { server: 'tools', status: 'completed' }), 1, 'one completed')
  t.notOk(m.text.includes(String(done.taskId)), 'no task id in any label')
  const audits = lines.map(l => JSON.parse(l) as Record<string, unknown>)
  t.same(audits.filter(a => a.audit === 'task.created').map(a => a.taskId).sort(), [done.taskId, cancelled.taskId].sort(), 'task.created for each')
  t.match(audits.filter(a => a.audit === 'task.cancel'), [{ taskId: cancelled.taskId, server: 'tools' }], 'task.cancel for the one cancelled')
  t.notOk(lines.join('').includes('slept 600 ms'), 'no result body in the log')
})

t.test('hosted tasks belong to their tenant and subject', async t => {
  const a = newKey('a')
  const b = newKey('b')
  const a2 = newKey('a2')
  const server = stdioFixture('full-server', [], { sessions: 'pooled', tasks: { hostAfterMs: 100 } })
  const gw = await startGateway(t, {
    servers: { tools: server },
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      a: { apiKeys: [a.entry, a2.entry], servers: { tools: {} } },
      b: { apiKeys: [b.entry], servers: { tools: {} } }
    }
  })
  const url = `${gw.url}/mcp/tools`
  const created = resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 2000 }, _meta: withTasks }, 1, bearer(a.key)))
  t.equal(created.resultType, 'task')
  const mine = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: withTasks }, 2, bearer(a.key)))
  t.equal(mine.status, 'working', 'its owner reads it')
  for (const [who, key] of [['another tenant', b.key], ['another subject of the tenant', a2.key]] as const) {
    const got = last(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: withTasks }, 3, bearer(key)))
    t.equal((got.error as { code: number }).code, -32602, `${who}: unknown task`)
    const cancel = last(await modernPost(url, 'tasks/cancel', { taskId: created.taskId, _meta: withTasks }, 4, bearer(key)))
    t.equal((cancel.error as { code: number }).code, -32602, `${who} cannot cancel it`)
  }
  const still = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: withTasks }, 5, bearer(a.key)))
  t.not(still.status, 'cancelled', 'nobody else cancelled it')
})

t.test('two replicas on one Redis: a task made on A is read and cancelled on B; a lost replica\'s task ends failed', async t => {
  const { store, raw } = await onRedis(t, {
    tools: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 1, tasks: { hostAfterMs: 150 } }),
    asks: stdioFixture('slow-tools-server', [], { sessions: 'pooled', poolSize: 1, tasks: { hostAfterMs: 100 } })
  })
  const a = await startGateway(t, raw, { replicaId: 'A' })
  const b = await startGateway(t, raw, { replicaId: 'B' })
  const at = (gw: typeof a): string => `${gw.url}/mcp/tools`

  const created = resultOf(await modernPost(at(a), 'tools/call', { name: 'slow', arguments: { ms: 800 }, _meta: withTasks }))
  t.equal(created.resultType, 'task', 'created on A')
  const onB = resultOf(await modernPost(at(b), 'tasks/get', { taskId: created.taskId, _meta: withTasks }))
  t.equal(onB.status, 'working', 'B reads it at once')
  const done = await eventually('completed, read on B', async () => {
    const r = resultOf(await modernPost(at(b), 'tasks/get', { taskId: created.taskId, _meta: withTasks }))
    return r.status === 'completed' ? r : undefined
  })
  t.match(done.result, { content: [{ text: 'slept 800 ms' }] }, "B answers with A's result")

  const long = resultOf(await modernPost(at(a), 'tools/call', { name: 'slow', arguments: { ms: 30_000 }, _meta: withTasks }))
  t.equal(long.resultType, 'task')
  t.same(resultOf(await modernPost(at(b), 'tasks/cancel', { taskId: long.taskId, _meta: withTasks })), { resultType: 'complete' }, 'cancelled on B')
  t.equal(resultOf(await modernPost(at(a), 'tasks/get', { taskId: long.taskId, _meta: withTasks })).status, 'cancelled', 'A sees it cancelled')
  // A's only child ran the call: it is free again once the cancel reached A over the bus.
  const seen = resultOf(await modernPost(at(a), 'tools/call', { name: 'cancelled-requests', arguments: {}, _meta: withTasks }))
  t.equal(JSON.parse((seen.content as Array<{ text: string }>)[0]!.text).length, 1, "the backend on A saw its call cancelled by B's tasks/cancel")

  // Input asked on A, answered through B.
  const ext = envelope({ elicitation: {}, extensions: { 'io.modelcontextprotocol/tasks': {} } })
  const asks = (gw: typeof a): string => `${gw.url}/mcp/asks`
  const asking = resultOf(await modernPost(asks(a), 'tools/call', { name: 'slow_confirm', arguments: { ms: 300 }, _meta: ext }))
  t.equal(asking.resultType, 'task')
  const waiting = await eventually('input required, seen on B', async () => {
    const r = resultOf(await modernPost(asks(b), 'tasks/get', { taskId: asking.taskId, _meta: ext }))
    return r.status === 'input_required' && Object.keys(r.inputRequests as object).length === 2 ? r : undefined
  })
  const answers = Object.fromEntries(Object.keys(waiting.inputRequests as object).map((k, i) => [k, { action: 'accept', content: { value: `b${i}` } }]))
  t.same(resultOf(await modernPost(asks(b), 'tasks/update', { taskId: asking.taskId, inputResponses: answers, _meta: ext })), { resultType: 'complete' }, 'tasks/update on B')
  const answered = await eventually('completed, read on A', async () => {
    const r = resultOf(await modernPost(asks(a), 'tasks/get', { taskId: asking.taskId, _meta: ext }))
    return r.status === 'completed' ? r : undefined
  })
  t.match(answered.result, { content: [{ text: 'answers [{"value":"b0"},{"value":"b1"}]' }] }, "B's tasks/update reached the call parked on A")

  // A task whose replica has no heartbeat (it died without its shutdown path) ends failed.
  const now = Date.now()
  const at0 = new Date(now).toISOString()
  await store.create({
    id: 'gwt-orphan', tenant: null, subjectDigest: 'anonymous', sessionId: null, server: 'tools', replica: 'gone-replica', connectionId: null, backendTaskId: null,
    task: { taskId: 'gwt-orphan', status: 'working', createdAt: at0, lastUpdatedAt: at0, ttlMs: 60_000, pollIntervalMs: 1000 }, createdAt: now, expiresAt: now + 60_000
  })
  const lost = resultOf(await modernPost(at(b), 'tasks/get', { taskId: 'gwt-orphan', _meta: withTasks }))
  t.equal(lost.status, 'failed', 'a task of a lost replica is failed')
  t.equal((lost.error as { code: number }).code, -32007, 'with the backend-lost error')
})

t.test("a hosted task whose backend asks for input: input_required with the asks, answered with tasks/update (in parts)", async t => {
  const gw = await startGateway(t, {
    servers: { tools: stdioFixture('slow-tools-server', [], { sessions: 'pooled', poolSize: 1, tasks: { hostAfterMs: 100 } }) }
  })
  const url = `${gw.url}/mcp/tools`
  const ext = envelope({ elicitation: {}, extensions: { 'io.modelcontextprotocol/tasks': {} } })
  const legacyHint = resultOf(await modernPost(url, 'tools/call', { name: 'greet', arguments: { name: 'x' }, task: { ttl: 1000 }, _meta: ext }))
  t.match(legacyHint, { resultType: 'complete', content: [{ text: 'Hello, x!' }] }, "the 2025 era's task param is ignored, not sent on")
  const created = resultOf(await modernPost(url, 'tools/call', { name: 'slow_confirm', arguments: { ms: 400 }, _meta: ext }))
  t.equal(created.resultType, 'task')
  const asking = await eventually('the task waits for input', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    return r.status === 'input_required' && Object.keys(r.inputRequests as object).length === 2 ? r : undefined
  })
  const keys = Object.keys(asking.inputRequests as Record<string, unknown>)
  t.match(Object.values(asking.inputRequests as Record<string, unknown>), [{ method: 'elicitation/create' }, { method: 'elicitation/create' }], 'both asks are the task\'s inputRequests')
  const accept = (value: string): Record<string, unknown> => ({ action: 'accept', content: { value } })
  t.same(resultOf(await modernPost(url, 'tasks/update', { taskId: created.taskId, inputResponses: { [keys[0]!]: accept('one'), nope: accept('x') }, _meta: ext })), { resultType: 'complete' }, 'a partial update is acked')
  const rest = await eventually('one ask is left', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    return r.status === 'input_required' && Object.keys(r.inputRequests as object).length === 1 ? r : undefined
  })
  t.same(Object.keys(rest.inputRequests as object), [keys[1]], 'only the unanswered ask is left')
  await modernPost(url, 'tasks/update', { taskId: created.taskId, inputResponses: { [keys[1]!]: accept('two') }, _meta: ext })
  const done = await eventually('the task completed', async () => {
    const r = resultOf(await modernPost(url, 'tasks/get', { taskId: created.taskId, _meta: ext }))
    return r.status === 'completed' ? r : undefined
  })
  t.match(done.result, { content: [{ text: 'answers [{"value":"one"},{"value":"two"}]' }] }, 'the backend got both answers')
  t.notOk('inputRequests' in done, 'a completed task has no inputRequests')
})

t.test('notifications/tasks: a listen stream that names a hosted task hears its changes (across replicas)', async t => {
  const { raw } = await onRedis(t, { tools: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, tasks: { hostAfterMs: 100 } }) })
  const a = await startGateway(t, raw, { replicaId: 'A' })
  const b = await startGateway(t, raw, { replicaId: 'B' })
  const created = resultOf(await modernPost(`${a.url}/mcp/tools`, 'tools/call', { name: 'slow', arguments: { ms: 30_000 }, _meta: withTasks }))
  t.equal(created.resultType, 'task')

  const refused = last(await modernPost(`${b.url}/mcp/tools`, 'subscriptions/listen', { notifications: { taskIds: [created.taskId] }, _meta: envelope() }))
  t.equal((refused.error as { code: number }).code, -32021, 'naming tasks without the extension: missing capability')

  const abort = new AbortController()
  t.teardown(() => { abort.abort() })
  const res = await modernFetch(`${b.url}/mcp/tools`, 'subscriptions/listen', { notifications: { taskIds: [created.taskId, 'gwt-not-mine'] }, _meta: withTasks }, 7, {}, abort.signal)
  const { events, reading } = readEvents(res)
  const ack = await eventually('the acknowledgement', () => events.find(e => e.method === 'notifications/subscriptions/acknowledged'))
  t.same((ack.params as { notifications: unknown }).notifications, { taskIds: [created.taskId] }, 'only the caller\'s own hosted task is honoured')
  // Cancelled through A (where the call runs): the change is made there, and heard here.
  await modernPost(`${a.url}/mcp/tools`, 'tasks/cancel', { taskId: created.taskId, _meta: withTasks })
  const heard = await eventually('notifications/tasks: cancelled', () => events.find(e => e.method === 'notifications/tasks' && (e.params as { status?: string }).status === 'cancelled'))
  t.match(heard.params, { taskId: created.taskId, status: 'cancelled', ttlMs: 3_600_000 }, "the change made on A reached B's listen stream, the whole task")
  abort.abort()
  await reading
})

t.test('a reload turns hosting on and off for new calls', async t => {
  const server = (extra: Record<string, unknown>): Record<string, unknown> => ({ servers: { tools: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, ...extra }) } })
  const gw = await startGateway(t, server({}))
  const url = `${gw.url}/mcp/tools`
  const call = async (): Promise<Record<string, unknown>> => resultOf(await modernPost(url, 'tools/call', { name: 'slow', arguments: { ms: 400 }, _meta: withTasks }))
  t.equal((await call()).resultType, 'complete', 'off: the slow call is answered as it is')
  await gw.gateway.live.apply(parseConfig({ listen: { host: '127.0.0.1', port: 0 }, log: { level: 'silent' }, ...server({ tasks: { hostAfterMs: 100 } }) }))
  t.same((resultOf(await modernPost(url, 'server/discover', { _meta: withTasks })).capabilities as Record<string, unknown>).extensions, { 'io.modelcontextprotocol/tasks': {} }, 'on after the reload: offered')
  t.equal((await call()).resultType, 'task', 'on after the reload: hosted')
  await gw.gateway.live.apply(parseConfig({ listen: { host: '127.0.0.1', port: 0 }, log: { level: 'silent' }, ...server({}) }))
  t.equal((await call()).resultType, 'complete', 'off again')
})
