// The event log contract, run against the memory twin and the Redis twin.
// A log comes with the session store it belongs to: append() reports the stream's holder from it,
// and deleting the session drops the logs.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { compareEntryIds, type EventLog, type LogEntry } from '../../src/state/event-log.js'
import type { JsonRpcMessage } from '../../src/core/jsonrpc.js'
import type { SessionStore } from '../../src/state/session-store.js'
import { sampleRecord } from './contract-session-store.js'

export interface EventLogUnderTest {
  log: EventLog
  store: SessionStore
  /** The bound the log was made with. */
  maxLen: number
}

/** Makes a fresh log (with maxLen 5) and its store for one subtest; closed in t.teardown. */
export type MakeEventLog = (t: Test) => Promise<EventLogUnderTest>

export const CONTRACT_MAX_LEN = 5
const SHORT_TTL = 100
const PAST_SHORT_TTL = 300
const LONG_TTL = 60_000

const note = (n: number): JsonRpcMessage => ({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 't', progress: n } })

async function readAll (log: EventLog, sid: string, streamId: string, cursor: string | null = null): Promise<LogEntry[]> {
  const all: LogEntry[] = []
  for (;;) {
    const batch = await log.readAfter(sid, streamId, cursor, 2)
    all.push(...batch)
    if (batch.length < 2) return all
    cursor = batch[batch.length - 1]!.entryId
  }
}

export function eventLogContract (t: Test, make: MakeEventLog): void {
  t.test('append then readAfter(null) returns every entry, oldest first', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    const messages: JsonRpcMessage[] = [
      { jsonrpc: '2.0', id: 1, result: { content: [{ type: 'text', text: 'héllo ✓ "quoted"\n' }] } },
      { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: [1, null, { a: true }] } },
      { jsonrpc: '2.0', id: 's.r1.1', method: 'sampling/createMessage', params: { messages: [] } },
      { jsonrpc: '2.0', id: 'x', error: { code: -32603, message: 'boom', data: { source: 'gateway' } } }
    ]
    const ids: string[] = []
    for (const m of messages) ids.push((await log.append(sid, 'req-1', m, LONG_TTL)).entryId)
    t.equal(new Set(ids).size, ids.length, 'entry ids are unique')
    const entries = await log.readAfter(sid, 'req-1', null, 100)
    t.same(entries.map(e => e.entryId), ids, 'in append order')
    t.same(entries.map(e => e.message), messages, 'messages round-trip')
  })

  t.test('readAfter is exclusive of the cursor and honours the limit', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    const ids: string[] = []
    for (let i = 0; i < 4; i++) ids.push((await log.append(sid, 'get', note(i), LONG_TTL)).entryId)
    t.same((await log.readAfter(sid, 'get', ids[0]!, 100)).map(e => e.entryId), ids.slice(1))
    t.same((await log.readAfter(sid, 'get', ids[1]!, 1)).map(e => e.entryId), [ids[2]])
    t.same(await log.readAfter(sid, 'get', ids[3]!, 100), [], 'nothing after the last entry')
    t.same((await log.readAfter(sid, 'get', null, 2)).map(e => e.entryId), ids.slice(0, 2))
    t.same((await readAll(log, sid, 'get')).map(e => e.message), [0, 1, 2, 3].map(note), 'paging reads everything once')
    const later = await log.append(sid, 'get', note(4), LONG_TTL)
    t.same((await log.readAfter(sid, 'get', ids[3]!, 100)).map(e => e.entryId), [later.entryId], 'a reader at the end sees the next entry')
  })

  t.test('entry ids have the shape event ids are parsed with', async t => {
    const { log } = await make(t)
    const { entryId } = await log.append(randomUUID(), 'get', note(0), LONG_TTL)
    t.match(entryId, /^\d{1,20}(-\d{1,20})?$/)
  })

  t.test('a priming (null) entry round-trips', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    const priming = await log.append(sid, 'req-1', null, LONG_TTL)
    const answer = await log.append(sid, 'req-1', { jsonrpc: '2.0', id: 1, result: {} }, LONG_TTL)
    t.same(await log.readAfter(sid, 'req-1', null, 10), [
      { entryId: priming.entryId, message: null, json: '', seq: 1 },
      { entryId: answer.entryId, message: { jsonrpc: '2.0', id: 1, result: {} }, json: '{"jsonrpc":"2.0","id":1,"result":{}}', seq: 2 }
    ])
  })

  t.test('entries carry their ordinal in the stream, so a reader can count what was trimmed', async t => {
    const { log, maxLen } = await make(t)
    const sid = randomUUID()
    // The Redis twin trims whole nodes of 100 entries (MAXLEN ~): append enough to trim for sure.
    const total = maxLen + 250
    const ids: string[] = []
    for (let i = 1; i <= total; i++) ids.push((await log.append(sid, 'get', note(i), LONG_TTL)).entryId)
    await log.append(sid, 'other', note(0), LONG_TTL)
    const kept = await readAll(log, sid, 'get')
    t.ok(kept.length < total, 'the log was trimmed')
    const wrong = kept.filter(entry => entry.seq !== (entry.message as unknown as { params: { progress: number } }).params.progress)
    t.same(wrong, [], 'every entry\'s ordinal is its place in the stream')
    t.equal((await log.readAfter(sid, 'other', null, 1))[0]?.seq, 1, 'ordinals are per stream')
    const last = kept[kept.length - 1]!
    t.equal(await log.seqOf(sid, 'get', last.entryId), total, 'seqOf a retained entry')
    const trimmed = await log.seqOf(sid, 'get', ids[0]!)
    t.ok(trimmed === null || trimmed === 1, 'a trimmed entry: unknown, or its true ordinal')
    t.equal(await log.seqOf(sid, 'nope', last.entryId), null, 'no such stream')
  })

  t.test('append hands back the entry exactly as a reader gets it (the local hand-off)', async t => {
    const { log, store } = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    const sid = record.id
    const appended = []
    for (let i = 1; i <= 3; i++) appended.push((await log.append(sid, 'get', note(i), LONG_TTL)).entry)
    const read = await readAll(log, sid, 'get')
    t.same(appended, read, 'entry id, message, JSON text and ordinal all match the log')
    t.same(appended.map(e => e?.seq), [1, 2, 3], 'consecutive ordinals: a holder knows nothing came between')
    await log.markPending(sid, 'r1_x', [1], LONG_TTL, false, 'r')
    t.ok((await log.append(sid, 'r1_x', { jsonrpc: '2.0', id: 1, result: {} }, LONG_TTL, 1)).entry !== undefined, 'an answer written comes back too')
    const refused = await log.append(sid, 'r1_x', { jsonrpc: '2.0', id: 1, result: {} }, LONG_TTL, 1)
    t.same([refused.entryId, refused.entry], ['', undefined], 'an answer not written (answered already) hands back nothing')
  })

  t.test('streams are separate per stream id and per session', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    await log.append(sid, 'a', note(1), LONG_TTL)
    await log.append(sid, 'b', note(2), LONG_TTL)
    await log.append(randomUUID(), 'a', note(3), LONG_TTL)
    t.same((await log.readAfter(sid, 'a', null, 10)).map(e => e.message), [note(1)])
    t.same((await log.readAfter(sid, 'b', null, 10)).map(e => e.message), [note(2)])
  })

  t.test('append reports the holder of that stream at append time', async t => {
    const { log, store } = await make(t)
    const sid = randomUUID()
    t.equal((await log.append(sid, 'get', note(0), LONG_TTL)).holder, null, 'no holder: the entry waits')
    await store.claimHolder(sid, 'get', 'replica-a', LONG_TTL)
    t.equal((await log.append(sid, 'get', note(1), LONG_TTL)).holder, 'replica-a')
    t.equal((await log.append(sid, 'req-1', note(2), LONG_TTL)).holder, null, 'another stream has its own holder')
    await store.claimHolder(sid, 'get', 'replica-b', LONG_TTL)
    t.equal((await log.append(sid, 'get', note(3), LONG_TTL)).holder, 'replica-b')
    await store.releaseHolder(sid, 'get', 'replica-b')
    t.equal((await log.append(sid, 'get', note(4), LONG_TTL)).holder, null)
  })

  t.test('the log is bounded: the oldest entries go, the newest stay in order', async t => {
    const { log, maxLen } = await make(t)
    const sid = randomUUID()
    // Enough entries that an approximate trim (Redis MAXLEN ~, 100-entry nodes) must act too.
    const total = 250
    const ids: string[] = []
    for (let i = 0; i < total; i++) ids.push((await log.append(sid, 'get', note(i), LONG_TTL)).entryId)
    const kept = await log.readAfter(sid, 'get', null, total)
    t.ok(kept.length >= maxLen, `keeps at least maxLen (${kept.length})`)
    t.ok(kept.length < total, `dropped some (${kept.length} of ${total})`)
    t.same(kept.map(e => e.entryId), ids.slice(total - kept.length), 'what is kept is the newest, contiguous and in order')
    t.same(kept.map(e => e.message), ids.slice(total - kept.length).map((_, i) => note(total - kept.length + i)))
    t.same((await log.readAfter(sid, 'get', ids[0]!, total)).map(e => e.entryId), kept.map(e => e.entryId),
      'a cursor older than the oldest kept entry reads from the oldest kept')
  })

  t.test('a stream expires with the TTL of its last append', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    await log.append(sid, 'gone', note(0), SHORT_TTL)
    await log.append(sid, 'kept', note(0), SHORT_TTL)
    await log.append(sid, 'kept', note(1), LONG_TTL)
    await sleep(PAST_SHORT_TTL)
    t.equal(await log.hasStream(sid, 'gone'), false)
    t.same(await log.readAfter(sid, 'gone', null, 10), [])
    t.equal(await log.hasStream(sid, 'kept'), true, 'append refreshes the TTL')
    t.same((await log.readAfter(sid, 'kept', null, 10)).map(e => e.message), [note(0), note(1)])
  })

  // Regression (found through the gateway): a stream silent for its TTL is created again by the
  // next append; a writer's cursor from before must still be below the new ids, or those entries
  // are never sent.
  t.test('ids never go backwards, even when an expired stream is created again', async t => {
    const { log } = await make(t)
    const before = (await log.append('s', 'get', null, 50)).entryId
    await new Promise(resolve => setTimeout(resolve, 120))
    t.notOk(await log.hasStream('s', 'get'), 'the stream expired')
    const after = (await log.append('s', 'get', null, 60_000)).entryId
    t.ok(compareEntryIds(after, before) > 0, `${after} comes after ${before}`)
    t.same((await log.readAfter('s', 'get', before, 10)).map(e => e.entryId), [after], 'a reader holding the old cursor gets the new entry')
  })

  t.test('expire shortens how long a stream is kept', async t => {
    const { log } = await make(t)
    await log.append('s', 'r1_done', null, 60_000)
    await log.expire('s', 'r1_done', 50)
    await new Promise(resolve => setTimeout(resolve, 120))
    t.notOk(await log.hasStream('s', 'r1_done'), 'gone after the shorter TTL')
    await log.expire('s', 'nothing-here', 50)
    t.pass('expiring a missing stream is a no-op')
    await log.append('s', 'r1_json', { jsonrpc: '2.0', id: 1, result: {} }, 60_000)
    await log.append('s', 'r1_kept', null, 60_000)
    await log.expire('s', 'r1_json', 0)
    t.notOk(await log.hasStream('s', 'r1_json'), 'a TTL of 0 drops the stream at once')
    t.same(await log.readAfter('s', 'r1_json', null, 10), [])
    t.ok(await log.hasStream('s', 'r1_kept'), 'and only that stream')
  })

  t.test('hasStream is true once a stream has an entry', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    t.equal(await log.hasStream(sid, 'get'), false)
    await log.append(sid, 'get', null, LONG_TTL)
    t.equal(await log.hasStream(sid, 'get'), true)
    t.equal(await log.hasStream(sid, 'req-1'), false)
  })

  t.test('deleteSession drops every stream of that session only', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    const other = randomUUID()
    await log.append(sid, 'get', note(0), LONG_TTL)
    await log.append(sid, 'req-1', note(1), LONG_TTL)
    await log.append(other, 'get', note(2), LONG_TTL)
    await log.deleteSession(sid)
    t.equal(await log.hasStream(sid, 'get'), false)
    t.equal(await log.hasStream(sid, 'req-1'), false)
    t.same(await log.readAfter(sid, 'get', null, 10), [])
    t.equal(await log.hasStream(other, 'get'), true)
    await log.deleteSession(randomUUID())
    t.pass('deleting an unknown session is fine')
  })

  t.test('deleting the session in the store drops its logs too', async t => {
    const { log, store } = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    await log.append(record.id, 'get', note(0), LONG_TTL)
    await log.append(record.id, 'req-1', note(1), LONG_TTL)
    t.equal(await store.delete(record.id), true)
    t.equal(await log.hasStream(record.id, 'get'), false)
    t.equal(await log.hasStream(record.id, 'req-1'), false)
  })

  t.test('pending markers: every request gets exactly one answer, whoever gives it', async t => {
    const { log, store } = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    const sid = record.id
    const primingId = await log.markPending(sid, 'r2_a', [1, 'two'], LONG_TTL, true, 'rA')
    t.type(primingId, 'string', 'the priming entry is appended with the markers')
    t.equal(await log.markPending(sid, 'r1_b', [3], LONG_TTL, false, 'rB'), null, 'no priming: no entry')
    const answer = (id: number | string): JsonRpcMessage => ({ jsonrpc: '2.0', id, result: {} })
    t.not((await log.append(sid, 'r2_a', answer(1), LONG_TTL, 1)).entryId, '', 'the first answer is written')
    t.equal((await log.append(sid, 'r2_a', answer(1), LONG_TTL, 1)).entryId, '', 'a second answer to the same request is not')
    t.same((await log.pendingReplicas(sid)).sort(), ['rA', 'rB'], 'the replicas that recorded markers')
    t.same(await log.claimOrphans(sid, 'rC'), [], 'a replica that recorded none: nothing taken')
    await log.markPending(sid, 'r1_d', [5, 6], LONG_TTL, false, 'rD')
    t.same(await log.claimOrphans(sid, 'rD', undefined, 60_000), [], 'markers younger than minAgeMs stay (their requests may still be on their way)')
    t.same(await log.claimOrphans(sid, undefined, 'rX', 60_000), [], 'with every replica\'s markers too')
    t.same((await log.claimOrphans(sid, 'rD')).map(p => p.id).sort(), [5, 6], 'one replica\'s markers')
    t.equal(await log.claim(sid, 'r1_d', 5, LONG_TTL), false, 'taken already')
    await log.markPending(sid, 'r1_e', [7], LONG_TTL, false, 'rD')
    t.equal(await log.claim(sid, 'r1_e', 7, LONG_TTL), true, 'one marker taken')
    t.equal((await log.append(sid, 'r1_e', answer(7), LONG_TTL, 7)).entryId, '', 'so its late answer is not written')
    await log.markPending(sid, 'r1_f', [8], LONG_TTL, false, 'rE')
    const orphans = await log.claimOrphans(sid, undefined, 'rE')
    t.same(orphans.sort((a, b) => a.streamId.localeCompare(b.streamId)), [{ streamId: 'r1_b', id: 3 }, { streamId: 'r2_a', id: 'two' }], 'the unanswered requests, ids with their types')
    t.same(await log.claimOrphans(sid), [{ streamId: 'r1_f', id: 8 }], 'claimed once only; the excepted replica\'s marker stayed until now')
    t.equal((await log.append(sid, 'r2_a', answer('two'), LONG_TTL, 'two')).entryId, '', 'a late answer after the claim is not written')
    const entries = await log.readAfter(sid, 'r2_a', null, 10)
    t.equal(entries.filter(e => e.message !== null).length, 1, 'one answer in the log')
    // A marker lost (a Redis primary failed over before replicating it): the answer is still
    // written, once.
    t.not((await log.append(sid, 'r1_lost', answer(8), LONG_TTL, 8)).entryId, '', 'an answer whose marker was lost is written')
    t.equal((await log.append(sid, 'r1_lost', answer(8), LONG_TTL, 8)).entryId, '', 'but only once')
    await log.markPending(sid, 'r1_c', [4], LONG_TTL, false, 'rA')
    t.equal(await store.delete(sid), true)
    t.equal((await log.append(sid, 'r1_c', answer(4), LONG_TTL, 4)).entryId, '', 'no answer is written for a deleted session')
    t.equal(await log.hasStream(sid, 'r1_c'), false, 'and no log key is recreated')
  })

  t.test('markPending with a holder lease: the POST\'s new stream is held by the replica that took it', async t => {
    const { log, store } = await make(t)
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    await log.markPending(record.id, 'r1_h', [1], LONG_TTL, true, 'rOwner', { replicaId: 'rA', leaseMs: LONG_TTL })
    t.equal(await store.getHolder(record.id, 'r1_h'), 'rA', 'the holder is recorded in the same step')
    t.same(await log.pendingReplicas(record.id), ['rOwner'], 'the marker names the replica serving the request, not the holder')
    t.equal((await log.append(record.id, 'r1_h', { jsonrpc: '2.0', id: 1, result: {} }, LONG_TTL, 1)).holder, 'rA', 'so its answer wakes that replica')
    await log.markPending(record.id, 'r1_n', [2], LONG_TTL, true, 'rA')
    t.equal(await store.getHolder(record.id, 'r1_n'), null, 'without a lease: no holder')
  })

  t.test('discard drops a completed stream now: log, own holder lease, the markers of requests answered directly; tombstones stay', async t => {
    const { log, store } = await make(t)
    const answer = (id: number): JsonRpcMessage => ({ jsonrpc: '2.0', id, result: {} })
    const record = sampleRecord()
    await store.create(record, LONG_TTL)
    const sid = record.id
    await log.markPending(sid, 'r2_x', [1, 2], LONG_TTL, true, 'rA', { replicaId: 'rA', leaseMs: LONG_TTL })
    t.equal(await log.claim(sid, 'r2_x', 2, LONG_TTL), true, 'request 2 settled elsewhere (a tombstone)')
    await log.markPending(sid, 'r1_y', [3], LONG_TTL, false, 'rA')
    await log.discard(sid, 'r2_x', 'rA', [1, 2])
    t.equal(await log.hasStream(sid, 'r2_x'), false, 'the log is gone')
    t.equal(await store.getHolder(sid, 'r2_x'), null, 'and the caller\'s holder lease')
    t.same(await log.claimOrphans(sid, 'rA'), [{ streamId: 'r1_y', id: 3 }], 'request 1\'s marker went; another stream\'s stayed')
    t.equal((await log.append(sid, 'r2_x', answer(2), LONG_TTL, 2)).entryId, '', 'the tombstone still refuses a late answer')
    await log.markPending(sid, 'r1_z', [4], LONG_TTL, true, 'rA', { replicaId: 'rB', leaseMs: LONG_TTL })
    await log.discard(sid, 'r1_z', 'rA', [])
    t.equal(await store.getHolder(sid, 'r1_z'), 'rB', 'another replica\'s lease is not the caller\'s to release')
    t.same(await log.claimOrphans(sid, 'rA'), [{ streamId: 'r1_z', id: 4 }], 'and only the named markers are taken')
    await log.discard(sid, 'gone', 'rA', [9])
    t.equal(await log.hasStream(sid, 'gone'), false, 'a stream that is not there: nothing happens')
  })

  t.test('prune forgets lapsed streams only, and a stream used again after it lapsed counts its entries afresh', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    await log.append(sid, 'r1_a', note(0), SHORT_TTL)
    await log.append(sid, 'r1_a', note(1), SHORT_TTL)
    await log.append(sid, 'r1_b', note(0), SHORT_TTL)
    await log.append(sid, 'kept', note(0), LONG_TTL)
    await log.append(sid, 'kept', note(1), LONG_TTL)
    await sleep(PAST_SHORT_TTL)
    const one = await log.prune(sid, 1)
    t.ok(one <= 1, `a sample of one looks at one stream at most (${one} forgotten)`)
    const forgotten = one + await log.prune(sid, 10)
    t.ok(forgotten >= 0 && forgotten <= 2, `at most the two lapsed streams were forgotten (${forgotten}; the memory twin's sweep may have come first)`)
    t.same((await log.readAfter(sid, 'kept', null, 10)).map(e => e.seq), [1, 2], 'a live stream keeps its entries and ordinals')
    t.equal((await log.append(sid, 'kept', note(2), LONG_TTL)).entry?.seq, 3, 'and goes on counting')
    t.equal((await log.append(sid, 'r1_a', note(2), LONG_TTL)).entry?.seq, 1, 'a lapsed one used again starts from 1')
    t.equal(await log.prune(sid, 10), 0, 'nothing lapsed is left')
    t.equal(await log.prune(randomUUID(), 10), 0, 'an unknown session: nothing to forget')
  })

  t.test('append stores the JSON its caller already made, as given', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    const message: JsonRpcMessage = { jsonrpc: '2.0', id: 1, result: { b: 2, a: 1 } }
    const text = '{ "jsonrpc": "2.0", "id": 1, "result": { "b": 2, "a": 1 } }' // not JSON.stringify's spelling: not made again
    const { entry } = await log.append(sid, 'r1_j', message, LONG_TTL, undefined, text)
    t.equal(entry?.json, text, 'the appended entry carries it')
    const [read] = await log.readAfter(sid, 'r1_j', null, 10)
    t.equal(read?.json, text, 'and a reader gets it back')
    t.same(read?.message, message)
  })

  t.test('a cursor that is not an entry id is refused', async t => {
    const { log } = await make(t)
    const sid = randomUUID()
    await log.append(sid, 'get', note(0), LONG_TTL)
    await t.rejects(log.readAfter(sid, 'get', 'get.1', 10), { code: 'GW_ERR_BAD_REQUEST' })
    await t.rejects(log.readAfter(sid, 'get', '', 10), { code: 'GW_ERR_BAD_REQUEST' })
  })
}
