// The session store contract: every test here runs against the memory twin
// and the Redis twin. A bug fixed in one twin gets its test here, so the other twin gets it too.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import type { SessionRecord, SessionStore } from '../../src/state/session-store.js'

/** Makes a fresh store for one subtest; the maker closes it in t.teardown. */
export type MakeSessionStore = (t: Test) => Promise<SessionStore>

// TTL tests wait well past a short TTL; they assert state, never durations.
const SHORT_TTL = 100
const PAST_SHORT_TTL = 300
const LONG_TTL = 60_000

export function sampleRecord (overrides: Partial<SessionRecord> = {}): SessionRecord {
  return {
    id: randomUUID(),
    server: 'files',
    principal: 'tenant-a:alice',
    transport: 'streamable',
    protocolVersion: '2025-06-18',
    initializeParams: { protocolVersion: '2025-06-18', capabilities: { sampling: {}, roots: { listChanged: true } }, clientInfo: { name: 'c', version: '1.0.0 ✓' } },
    backendSessionId: null,
    createdAt: 1_700_000_000_123,
    ...overrides
  }
}

export function sessionStoreContract (t: Test, make: MakeSessionStore): void {
  t.test('create then get returns the same record', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    t.same(await store.get(record.id), record)
    const legacy = sampleRecord({ transport: 'legacy', initializeParams: null, backendSessionId: 'b-123' })
    await store.create(legacy, LONG_TTL)
    t.same(await store.get(legacy.id), legacy)
  })

  t.test('get of an unknown session is null', async t => {
    const store = await make(t)
    t.equal(await store.get(randomUUID()), null)
  })

  t.test('exists tells a live record from an unknown, expired or deleted one', async t => {
    const store = await make(t)
    const record = sampleRecord()
    const short = sampleRecord()
    await store.create(record, LONG_TTL)
    await store.create(short, SHORT_TTL)
    t.equal(await store.exists(record.id), true)
    t.equal(await store.exists(randomUUID()), false, 'unknown')
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.exists(short.id), false, 'expired')
    await store.delete(record.id)
    t.equal(await store.exists(record.id), false, 'deleted')
  })

  t.test('create rejects an id that is already live', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    await t.rejects(store.create({ ...record, server: 'other' }, LONG_TTL), { code: 'GW_ERR_CONFLICT' })
    t.equal((await store.get(record.id))?.server, 'files', 'the first record is untouched')
  })

  t.test('a record expires after its TTL', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, SHORT_TTL)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.get(record.id), null)
    t.equal(await store.touch(record.id, LONG_TTL), false, 'touch does not bring it back')
    t.equal(await store.get(record.id), null)
  })

  t.test('touch extends the TTL of a live record', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, SHORT_TTL)
    t.equal(await store.touch(record.id, LONG_TTL), true)
    await sleep(PAST_SHORT_TTL)
    t.same(await store.get(record.id), record)
  })

  t.test('update changes fields of a live record and keeps the rest', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    t.equal(await store.update(record.id, { backendSessionId: 'backend-1', protocolVersion: '2025-11-25' }), true)
    t.same(await store.get(record.id), { ...record, backendSessionId: 'backend-1', protocolVersion: '2025-11-25' })
    t.equal(await store.update(record.id, { initializeParams: null, backendSessionId: null }), true)
    t.same(await store.get(record.id), { ...record, protocolVersion: '2025-11-25', initializeParams: null })
  })

  t.test('update never resurrects an expired or unknown record', async t => {
    const store = await make(t)
    t.equal(await store.update(randomUUID(), { server: 'x' }), false)
    const record = sampleRecord()
    await store.create(record, SHORT_TTL)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.update(record.id, { backendSessionId: 'late' }), false)
    t.equal(await store.get(record.id), null)
  })

  t.test('update keeps the TTL: an updated record still expires', async t => {
    const store = await make(t)
    const record = sampleRecord()
    await store.create(record, SHORT_TTL)
    t.equal(await store.update(record.id, { backendSessionId: 'b' }), true)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.get(record.id), null)
  })

  t.test('delete removes the record, its leases and cursors', async t => {
    const store = await make(t)
    const record = sampleRecord()
    const sid = record.id
    await store.create(record, LONG_TTL)
    await store.claimOwner(sid, 'r1', LONG_TTL)
    await store.claimHolder(sid, 'get', 'r1', LONG_TTL)
    await store.claimHolder(sid, 'req-1', 'r2', LONG_TTL)
    await store.setCursor(sid, 'get', '7', LONG_TTL)
    const other = sampleRecord()
    await store.create(other, LONG_TTL)
    await store.claimOwner(other.id, 'r1', LONG_TTL)

    t.equal(await store.delete(sid), true)
    t.equal(await store.get(sid), null)
    t.equal(await store.getOwner(sid), null)
    t.equal(await store.getHolder(sid, 'get'), null)
    t.equal(await store.getHolder(sid, 'req-1'), null)
    t.equal(await store.getCursor(sid, 'get'), null)
    t.equal(await store.delete(sid), false, 'a second delete finds nothing')
    t.same(await store.get(other.id), other, 'another session is untouched')
    t.equal(await store.getOwner(other.id), 'r1')
  })

  t.test('owner lease is exclusive while it lasts', async t => {
    const store = await make(t)
    const sid = randomUUID()
    t.equal(await store.getOwner(sid), null)
    t.equal(await store.claimOwner(sid, 'replica-a', LONG_TTL), 'replica-a')
    t.equal(await store.claimOwner(sid, 'replica-b', LONG_TTL), 'replica-a')
    t.equal(await store.claimOwner(sid, 'replica-a', LONG_TTL), 'replica-a', 'claiming again is fine')
    t.equal(await store.getOwner(sid), 'replica-a')
  })

  t.test('owner lease renews and releases only for its holder', async t => {
    const store = await make(t)
    const sid = randomUUID()
    await store.claimOwner(sid, 'replica-a', LONG_TTL)
    t.equal(await store.renewOwner(sid, 'replica-b', LONG_TTL), false)
    t.equal(await store.renewOwner(sid, 'replica-a', LONG_TTL), true)
    await store.releaseOwner(sid, 'replica-b')
    t.equal(await store.getOwner(sid), 'replica-a', 'a release by another replica is ignored')
    await store.releaseOwner(sid, 'replica-a')
    t.equal(await store.getOwner(sid), null)
    t.equal(await store.renewOwner(sid, 'replica-a', LONG_TTL), false, 'a released lease cannot be renewed')
    t.equal(await store.claimOwner(sid, 'replica-b', LONG_TTL), 'replica-b')
  })

  t.test('owner lease lapses after its TTL unless renewed', async t => {
    const store = await make(t)
    const lapsing = randomUUID()
    const renewed = randomUUID()
    await store.claimOwner(lapsing, 'replica-a', SHORT_TTL)
    await store.claimOwner(renewed, 'replica-a', SHORT_TTL)
    t.equal(await store.renewOwner(renewed, 'replica-a', LONG_TTL), true)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.getOwner(lapsing), null)
    t.equal(await store.renewOwner(lapsing, 'replica-a', LONG_TTL), false, 'a lapsed lease is not renewed')
    t.equal(await store.claimOwner(lapsing, 'replica-b', LONG_TTL), 'replica-b')
    t.equal(await store.getOwner(renewed), 'replica-a')
  })

  t.test('claimHolder takes the stream and returns the previous holder', async t => {
    const store = await make(t)
    const sid = randomUUID()
    t.equal(await store.getHolder(sid, 'get'), null)
    t.equal(await store.claimHolder(sid, 'get', 'replica-a', LONG_TTL), null, 'no previous holder')
    t.equal(await store.claimHolder(sid, 'get', 'replica-a', LONG_TTL), null, 'itself is not a previous holder')
    t.equal(await store.claimHolder(sid, 'get', 'replica-b', LONG_TTL), 'replica-a')
    t.equal(await store.getHolder(sid, 'get'), 'replica-b')
    t.equal(await store.getHolder(sid, 'req-1'), null, 'holders are per stream')
    t.equal(await store.claimHolder(sid, 'req-1', 'replica-c', LONG_TTL), null)
    t.equal(await store.getHolder(sid, 'get'), 'replica-b')
    t.equal(await store.getHolder(randomUUID(), 'get'), null, 'and per session')
  })

  t.test('holder lease renews and releases only for its holder', async t => {
    const store = await make(t)
    const sid = randomUUID()
    await store.claimHolder(sid, 'get', 'replica-a', LONG_TTL)
    await store.claimHolder(sid, 'get', 'replica-b', LONG_TTL)
    t.equal(await store.renewHolder(sid, 'get', 'replica-a', LONG_TTL), false, 'the replaced holder cannot renew')
    t.equal(await store.renewHolder(sid, 'get', 'replica-b', LONG_TTL), true)
    await store.releaseHolder(sid, 'get', 'replica-a')
    t.equal(await store.getHolder(sid, 'get'), 'replica-b', 'a release by the replaced holder is ignored')
    await store.releaseHolder(sid, 'get', 'replica-b')
    t.equal(await store.getHolder(sid, 'get'), null)
    t.equal(await store.renewHolder(sid, 'get', 'replica-b', LONG_TTL), false)
  })

  t.test('holder lease lapses after its TTL unless renewed', async t => {
    const store = await make(t)
    const sid = randomUUID()
    await store.claimHolder(sid, 'a', 'replica-a', SHORT_TTL)
    await store.claimHolder(sid, 'b', 'replica-a', SHORT_TTL)
    t.equal(await store.renewHolder(sid, 'b', 'replica-a', LONG_TTL), true)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.getHolder(sid, 'a'), null)
    t.equal(await store.claimHolder(sid, 'a', 'replica-b', LONG_TTL), null, 'a lapsed holder is not a previous holder')
    t.equal(await store.getHolder(sid, 'b'), 'replica-a')
  })

  t.test('keepStreams renews held leases and session TTLs in one batch, re-claims a lapsed lease nobody took', async t => {
    const store = await make(t)
    const mine = sampleRecord()
    const lapsed = sampleRecord()
    const moved = sampleRecord()
    const unmarked = sampleRecord()
    for (const record of [mine, lapsed, moved, unmarked]) await store.create(record, SHORT_TTL * 5)
    await store.claimHolder(mine.id, 'get', 'replica-a', SHORT_TTL)
    await store.claimHolder(lapsed.id, 'get', 'replica-a', SHORT_TTL)
    await store.claimHolder(moved.id, 'get', 'replica-a', SHORT_TTL)
    await sleep(SHORT_TTL / 2)
    t.same(await store.keepStreams([{ sid: mine.id, streamId: 'get', leased: true }], 'replica-a', SHORT_TTL, LONG_TTL), ['held'])
    await sleep(PAST_SHORT_TTL - SHORT_TTL / 2)
    // `lapsed` and `moved` lapsed (a busy event loop); another replica resumed `moved` meanwhile.
    t.equal(await store.getHolder(lapsed.id, 'get'), null, 'the lease lapsed')
    await store.claimHolder(moved.id, 'get', 'replica-b', LONG_TTL)
    const gone = randomUUID()
    const kept = await store.keepStreams([
      { sid: lapsed.id, streamId: 'get', leased: true },
      { sid: moved.id, streamId: 'get', leased: true },
      { sid: gone, streamId: 'get', leased: true },
      { sid: unmarked.id, streamId: 'r1_x', leased: false },
      { sid: lapsed.id, streamId: 'r1_y', leased: true }
    ], 'replica-a', LONG_TTL, LONG_TTL)
    t.same(kept, ['reclaimed', 'taken', 'gone', 'held', 'reclaimed'])
    t.equal(await store.getHolder(lapsed.id, 'get'), 'replica-a', 're-claimed')
    t.equal(await store.getHolder(moved.id, 'get'), 'replica-b', 'a lease another replica holds is left to it')
    t.equal(await store.getHolder(gone, 'get'), null, 'no lease is made for a session that is gone')
    t.equal(await store.getHolder(unmarked.id, 'r1_x'), null, 'an unleased stream gets no lease')
    await sleep(PAST_SHORT_TTL)
    // Session TTLs were refreshed to LONG_TTL by the batch (created with a short one).
    for (const record of [lapsed, moved, unmarked]) t.equal(await store.exists(record.id), true, 'the session TTL was refreshed')
    t.equal(await store.exists(mine.id), true, 'refreshed by the first batch too')
    t.same(await store.keepStreams([], 'replica-a', LONG_TTL, LONG_TTL), [], 'an empty batch')
    await store.delete(lapsed.id)
    t.same(await store.keepStreams([{ sid: lapsed.id, streamId: 'get', leased: true }], 'replica-a', LONG_TTL, LONG_TTL), ['gone'], 'a deleted session is gone')
    t.equal(await store.getHolder(lapsed.id, 'get'), null)
  })

  t.test('keepOwners renews, claims a free lease, and tells a taken lease and a gone session apart', async t => {
    const store = await make(t)
    const [held, free, taken] = [sampleRecord(), sampleRecord(), sampleRecord()]
    for (const record of [held, free, taken]) await store.create(record, LONG_TTL)
    await store.claimOwner(held.id, 'replica-a', SHORT_TTL)
    await store.claimOwner(taken.id, 'replica-b', LONG_TTL)
    t.same(await store.keepOwners([held.id, free.id, taken.id, randomUUID()], 'replica-a', LONG_TTL), ['held', 'claimed', 'taken', 'gone'])
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.getOwner(held.id), 'replica-a', 'renewed past its first TTL')
    t.equal(await store.getOwner(free.id), 'replica-a')
    t.equal(await store.getOwner(taken.id), 'replica-b')
    t.same(await store.keepOwners([], 'replica-a', LONG_TTL), [])
  })

  t.test('cursor set and get, per stream, with a TTL', async t => {
    const store = await make(t)
    const sid = randomUUID()
    t.equal(await store.getCursor(sid, 'get'), null)
    await store.setCursor(sid, 'get', '3', LONG_TTL)
    t.equal(await store.getCursor(sid, 'get'), '3')
    await store.setCursor(sid, 'get', '1700000000000-5', LONG_TTL)
    t.equal(await store.getCursor(sid, 'get'), '1700000000000-5', 'the last write wins')
    t.equal(await store.getCursor(sid, 'req-1'), null)
    await store.setCursor(sid, 'req-1', '9', SHORT_TTL)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.getCursor(sid, 'req-1'), null, 'expired')
    t.equal(await store.getCursor(sid, 'get'), '1700000000000-5')
  })

  t.test('heartbeat makes a replica alive until its TTL', async t => {
    const store = await make(t)
    const id = `replica-${randomUUID()}`
    t.equal(await store.isAlive(id), false)
    await store.heartbeat(id, SHORT_TTL)
    t.equal(await store.isAlive(id), true)
    await sleep(PAST_SHORT_TTL)
    t.equal(await store.isAlive(id), false)
    await store.heartbeat(id, LONG_TTL)
    t.equal(await store.isAlive(id), true)
  })

  t.test('listen topics name the replicas registered for them until their TTL', async t => {
    const store = await make(t)
    const topic = `full:tenant-${randomUUID()}`
    t.same(await store.listeners(topic), [])
    await store.addListener(topic, 'replica-a', SHORT_TTL)
    await store.addListener(topic, 'replica-b', LONG_TTL)
    t.same((await store.listeners(topic)).sort(), ['replica-a', 'replica-b'])
    t.same(await store.listeners(`${topic}-other`), [], 'topics are apart')
    await sleep(PAST_SHORT_TTL)
    t.same(await store.listeners(topic), ['replica-b'], 'a registration not renewed lapses')
    await store.addListener(topic, 'replica-a', LONG_TTL)
    t.same((await store.listeners(topic)).sort(), ['replica-a', 'replica-b'], 'renewing brings it back')
  })

  t.test('the session index lists live sessions, most recently active first', async t => {
    const store = await make(t)
    const [a, b, c, gone] = [sampleRecord(), sampleRecord(), sampleRecord(), sampleRecord()]
    await store.create(a, LONG_TTL)
    await store.create(b, LONG_TTL)
    await store.create(c, LONG_TTL)
    await store.create(gone, SHORT_TTL)
    await sleep(5)
    t.equal(await store.touch(a.id, LONG_TTL), true)
    t.equal(await store.delete(b.id), true)
    await sleep(PAST_SHORT_TTL)
    const index = await store.sessionIndex(100)
    t.same(index.map(e => e.id), [a.id, c.id], 'touched first; deleted and expired ones left out')
    t.ok(index.every(e => e.expiresAt > Date.now() + LONG_TTL / 2), 'each entry says when its record expires')
    t.same((await store.sessionIndex(1)).map(e => e.id), [a.id], 'the limit bounds the read')
  })

  t.test('replica summaries are read back until their TTL', async t => {
    const store = await make(t)
    await store.publishSummary('replica-a', '{"id":"replica-a"}', LONG_TTL)
    await store.publishSummary('replica-b', '{"id":"replica-b"}', SHORT_TTL)
    t.same((await store.summaries()).sort(), ['{"id":"replica-a"}', '{"id":"replica-b"}'])
    await store.publishSummary('replica-a', '{"id":"replica-a","n":2}', LONG_TTL)
    await sleep(PAST_SHORT_TTL)
    t.same(await store.summaries(), ['{"id":"replica-a","n":2}'], 'the newest text; a lapsed one is gone')
  })

  t.test('a connected store is ready', async t => {
    const store = await make(t)
    t.equal(store.isReady(), true)
  })
}
