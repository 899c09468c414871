// The sessions' task view contract (state/session-tasks.ts): every test runs against the memory
// twin and the Redis twin.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { MAX_SESSION_TASKS, type SessionTask, type SessionTasks } from '../../src/state/session-tasks.js'

export type MakeSessionTasks = (t: Test) => Promise<SessionTasks>

const LONG_TTL = 60_000

const task = (taskId: string, status: string, extra: Partial<SessionTask> = {}): SessionTask =>
  ({ taskId, status, seenAt: Date.now(), createdAt: new Date().toISOString(), ttl: 60_000, ...extra })

export function sessionTasksContract (t: Test, make: MakeSessionTasks): void {
  t.test('put returns the status before; list shows the last state, oldest first', async t => {
    const view = await make(t)
    const sid = randomUUID()
    t.equal(await view.put(sid, task('a', 'working', { createdAt: '2026-01-01T00:00:01Z' }), LONG_TTL), null, 'new')
    t.equal(await view.put(sid, task('b', 'working', { createdAt: '2026-01-01T00:00:00Z' }), LONG_TTL), null)
    t.equal(await view.put(sid, task('a', 'input_required', { statusMessage: 'asks', createdAt: '2026-01-01T00:00:01Z' }), LONG_TTL), 'working')
    t.match(await view.list(sid), [{ taskId: 'b', status: 'working' }, { taskId: 'a', status: 'input_required', statusMessage: 'asks', ttl: 60_000 }])
    t.same(await view.list(randomUUID()), [], 'another session has none')
  })

  t.test('an ended task keeps its status against a late, older message', async t => {
    const view = await make(t)
    const sid = randomUUID()
    await view.put(sid, task('a', 'working'), LONG_TTL)
    t.equal(await view.put(sid, task('a', 'cancelled'), LONG_TTL), 'working')
    t.equal(await view.put(sid, task('a', 'working'), LONG_TTL), 'cancelled', 'the late one is told what it was')
    t.match(await view.list(sid), [{ taskId: 'a', status: 'cancelled' }], 'and changes nothing')
  })

  t.test('bounded: past the bound an ended task goes first, then the one seen longest ago', async t => {
    const view = await make(t)
    const sid = randomUUID()
    const base = Date.now()
    for (let i = 0; i < MAX_SESSION_TASKS; i++) await view.put(sid, task(`t${i}`, i === 5 ? 'completed' : 'working', { seenAt: base + i }), LONG_TTL)
    await view.put(sid, task('new1', 'working', { seenAt: base + 100 }), LONG_TTL)
    let ids = (await view.list(sid)).map(x => x.taskId)
    t.equal(ids.length, MAX_SESSION_TASKS)
    t.notOk(ids.includes('t5'), 'the ended one went')
    await view.put(sid, task('new2', 'working', { seenAt: base + 101 }), LONG_TTL)
    ids = (await view.list(sid)).map(x => x.taskId)
    t.equal(ids.length, MAX_SESSION_TASKS)
    t.notOk(ids.includes('t0'), 'then the one seen longest ago')
    t.ok(ids.includes('new1') && ids.includes('new2'))
  })

  t.test('the view expires ttl after its last write, and forget drops it', async t => {
    const view = await make(t)
    const sid = randomUUID()
    await view.put(sid, task('a', 'working'), 100)
    await sleep(300)
    t.same(await view.list(sid), [], 'expired')
    const other = randomUUID()
    await view.put(other, task('a', 'working'), LONG_TTL)
    await view.forget(other)
    t.same(await view.list(other), [], 'forgotten')
  })
}
