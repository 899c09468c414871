// The task store contract: every test here runs against the memory twin and the Redis twin.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { isTerminalStatus, ownsTask, type TaskRecord, type TaskStore } from '../../src/state/task-store.js'

/** Makes a fresh store for one subtest; the maker closes it in t.teardown. */
export type MakeTaskStore = (t: Test) => Promise<TaskStore>

const HOUR = 60 * 60_000

export function sampleTask (overrides: Partial<TaskRecord> = {}): TaskRecord {
  const id = randomBytes(18).toString('base64url')
  const now = Date.now()
  return {
    id,
    tenant: 'acme',
    subjectDigest: 'd1',
    sessionId: `s-${randomBytes(6).toString('hex')}`,
    server: 'everything',
    replica: `r-${randomBytes(4).toString('hex')}`,
    connectionId: 'c1',
    backendTaskId: 'b-1',
    task: { taskId: id, status: 'working', createdAt: new Date(now).toISOString(), ttl: HOUR, pollInterval: 1000, content: [] },
    createdAt: now,
    expiresAt: now + HOUR,
    ...overrides
  }
}

export function taskStoreContract (t: Test, make: MakeTaskStore): void {
  t.test('create then get returns the same record; a second create of the id is refused', async t => {
    const store = await make(t)
    const record = sampleTask()
    await store.create(record)
    t.same(await store.get(record.id), record)
    const hosted = sampleTask({ sessionId: null, tenant: null, subjectDigest: null, connectionId: null, backendTaskId: null, outcome: { result: { content: [], isError: false } } })
    await store.create(hosted)
    t.same(await store.get(hosted.id), hosted, 'nulls, empty arrays and an outcome come back as they went in')
    await t.rejects(store.create({ ...record, server: 'other' }), { code: 'GW_ERR_CONFLICT' })
    t.equal((await store.get(record.id))?.server, 'everything', 'the refused create changed nothing')
    t.equal(await store.get('nope'), null)
  })

  t.test('update changes a live record and keeps a terminal status', async t => {
    const store = await make(t)
    const record = sampleTask()
    await store.create(record)
    const working = await store.update(record.id, { task: { ...record.task, statusMessage: 'half way' } })
    t.equal(working?.task.statusMessage, 'half way')
    const failed = await store.update(record.id, { task: { ...record.task, status: 'failed', statusMessage: 'replica gone' }, outcome: { error: { code: -32007, message: 'gone' } }, connectionId: null })
    t.equal(failed?.task.status, 'failed')
    t.equal(failed?.connectionId, null)
    const late = await store.update(record.id, { task: { ...record.task, status: 'completed' }, outcome: { result: { content: [] } } })
    t.equal(late?.task.status, 'failed', 'a terminal status is kept')
    t.equal(late?.task.statusMessage, 'replica gone')
    t.same(late?.outcome, { error: { code: -32007, message: 'gone' } }, 'the first outcome is kept')
    t.same(await store.get(record.id), late, 'get reads what update answered')
    t.equal(await store.update('nope', { task: { status: 'working' } }), null, 'an unknown id is not created by update')
    t.equal(await store.get('nope'), null)
  })

  t.test('indexes by session and by replica, oldest first, with a limit', async t => {
    const store = await make(t)
    const base = Date.now()
    const a = sampleTask({ createdAt: base + 2 })
    const b = sampleTask({ createdAt: base + 1, sessionId: a.sessionId, replica: a.replica })
    const c = sampleTask({ createdAt: base, replica: a.replica })
    for (const record of [a, b, c]) await store.create(record)
    t.same((await store.ofSession(a.sessionId!, 10)).map(r => r.id), [b.id, a.id])
    t.same((await store.ofSession(a.sessionId!, 1)).map(r => r.id), [b.id])
    t.same((await store.ofReplica(a.replica, 10)).map(r => r.id), [c.id, b.id, a.id])
    t.same(await store.ofSession('nobody', 10), [])
    t.ok((await store.replicas()).includes(a.replica), 'the replica is listed')
    await store.update(c.id, { replica: 'r-new', connectionId: null })
    t.same((await store.ofReplica(a.replica, 10)).map(r => r.id), [b.id, a.id], 'a record taken over leaves its old replica')
    t.same((await store.ofReplica('r-new', 10)).map(r => r.id), [c.id])
    t.ok((await store.replicas()).includes('r-new'))
    t.equal(await store.delete(b.id), true)
    t.equal(await store.delete(b.id), false, 'a second delete finds nothing')
    t.same((await store.ofSession(a.sessionId!, 10)).map(r => r.id), [a.id])
    t.same((await store.ofReplica(a.replica, 10)).map(r => r.id), [a.id])
    t.equal(await store.get(b.id), null)
  })

  t.test('records expire at expiresAt, and leave the indexes', async t => {
    const store = await make(t)
    const short = sampleTask({ expiresAt: Date.now() + 150 })
    const long = sampleTask({ sessionId: short.sessionId, replica: short.replica })
    await store.create(short)
    await store.create(long)
    t.equal((await store.ofSession(short.sessionId!, 10)).length, 2)
    await sleep(400)
    t.equal(await store.get(short.id), null)
    t.equal(await store.update(short.id, { task: { status: 'failed' } }), null, 'an expired record is not changed')
    t.equal(await store.get(short.id), null, 'nor brought back')
    t.same((await store.ofSession(short.sessionId!, 10)).map(r => r.id), [long.id])
    t.same((await store.ofReplica(short.replica, 10)).map(r => r.id), [long.id])
    const lonely = sampleTask({ expiresAt: Date.now() + 150 })
    await store.create(lonely)
    await sleep(400)
    t.notOk((await store.replicas()).includes(lonely.replica), 'a replica whose records all expired is not listed')
  })

  t.test('ownership and terminal statuses', async t => {
    const record = sampleTask()
    t.ok(ownsTask(record, { tenant: 'acme', subjectDigest: 'd1', sessionId: record.sessionId }))
    t.notOk(ownsTask(record, { tenant: 'other', subjectDigest: 'd1', sessionId: record.sessionId }), 'another tenant')
    t.notOk(ownsTask(record, { tenant: 'acme', subjectDigest: 'd2', sessionId: record.sessionId }), 'another subject')
    t.notOk(ownsTask(record, { tenant: 'acme', subjectDigest: 'd1', sessionId: 'other' }), 'another session')
    t.ok(isTerminalStatus('cancelled'))
    t.notOk(isTerminalStatus('input_required'))
  })
}
