import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import type { Envelope } from '../../src/state/bus.js'
import { RedisBus } from '../../src/state/bus-redis.js'
import { createRedis } from '../../src/state/redis/client.js'
import { eventually } from '../helpers/wait.js'
import { RedisEventLog } from '../../src/state/event-log-redis.js'
import { RedisSessionStore } from '../../src/state/session-store-redis.js'
import { CONTRACT_MAX_LEN, eventLogContract } from './contract-event-log.js'
import { sampleRecord } from './contract-session-store.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)

/** A log and its store under a fresh key prefix, and a connection to look at the keys. */
async function fresh (t: Test, maxLen = 5): Promise<{ redis: Awaited<ReturnType<typeof testRedis>>, prefix: string, store: RedisSessionStore, log: RedisEventLog }> {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  return { redis, prefix, store: new RedisSessionStore(redis, prefix), log: new RedisEventLog(redis, prefix, maxLen) }
}

eventLogContract(t, async t => {
  const { log, store } = await fresh(t, CONTRACT_MAX_LEN)
  return { log, store, maxLen: CONTRACT_MAX_LEN }
})

t.test('entries are Redis stream entries under the session hash tag, trimmed approximately', async t => {
  const { redis, prefix, log } = await fresh(t)
  const sid = randomUUID()
  const first = await log.append(sid, 'get', null, 60_000)
  t.match(first.entryId, /^\d+-\d+$/)
  const key = `${prefix}:{${sid}}:ev:get`
  t.same(await redis.xrange(key, '-', '+'), [[first.entryId, ['m', '', 'n', '1']]], 'a priming entry is an empty field, with its ordinal')
  for (let i = 0; i < 300; i++) await log.append(sid, 'get', { jsonrpc: '2.0', method: 'n', params: { i } }, 60_000)
  const len = await redis.xlen(key)
  // MAXLEN ~ trims whole radix-tree nodes (stream-node-max-entries, 100 by default).
  t.ok(len >= 5 && len <= 5 + 100, `bounded near maxLen (${len})`)
  t.same(await redis.smembers(`${prefix}:{${sid}}:streams`), ['get'], 'the stream is listed for delete')
  t.equal(await redis.hget(`${prefix}:{${sid}}:seq`, 'get'), '301', 'the ordinals live in the session\'s seq hash')
  t.ok(await redis.pttl(`${prefix}:{${sid}}:seq`) > 0, 'which has a TTL')
  await log.deleteSession(sid)
  t.equal(await redis.exists(`${prefix}:{${sid}}:seq`), 0, 'and goes with the session')
})

t.test('markPending checks in the same step that the session still exists (a POST may skip reading its record)', async t => {
  const { redis, prefix, store, log } = await fresh(t)
  const record = sampleRecord()
  await store.create(record, 60_000)
  t.type(await log.markPending(record.id, 'r1_a', [1], 60_000, true, 'r', { replicaId: 'r', leaseMs: 60_000 }), 'string', 'an existing session: marked and primed')
  await store.delete(record.id)
  await t.rejects(log.markPending(record.id, 'r1_b', [2], 60_000, true, 'r', { replicaId: 'r', leaseMs: 60_000 }), { code: 'GW_ERR_SESSION_NOT_FOUND', statusCode: 404 }, 'a deleted one: 404')
  t.same(await redis.keys(`${prefix}:{${record.id}}:*`), [], 'and nothing is written for it: no marker, holder or priming entry')
})

t.test('prune drops a stream\'s list entry and ordinal only once every key of it lapsed, and only those it sampled', async t => {
  const { redis, prefix, store, log } = await fresh(t)
  const sid = randomUUID()
  const listed = async (): Promise<string[]> => (await redis.smembers(`${prefix}:{${sid}}:streams`)).sort()
  const ordinals = async (): Promise<string[]> => (await redis.hkeys(`${prefix}:{${sid}}:seq`)).sort()
  for (const id of ['held', 'lapsed', 'live', 'moved']) await log.append(sid, id, null, id === 'live' ? 60_000 : 50)
  await store.claimHolder(sid, 'held', 'rA', 60_000) // a writer still holds it: its log may come back
  await store.setCursor(sid, 'moved', '1-1', 60_000) // a GET stream's position outlives its log
  await new Promise(resolve => setTimeout(resolve, 150))
  t.same(await listed(), ['held', 'lapsed', 'live', 'moved'], 'expiry alone leaves every stream listed')
  t.equal(await log.prune(sid, 0), 0, 'a sample of none looks at nothing')
  t.same(await listed(), ['held', 'lapsed', 'live', 'moved'])
  t.equal(await log.prune(sid, 10), 1, 'one stream had no key left')
  t.same(await listed(), ['held', 'live', 'moved'], 'it is no longer listed; a stream with a holder lease or a cursor is')
  t.same(await ordinals(), ['held', 'live', 'moved'], 'and its ordinal went with it')
  for (let i = 0; i < 40; i++) await log.append(sid, `gone${i}`, null, 50)
  await new Promise(resolve => setTimeout(resolve, 150))
  const pruned = await log.prune(sid, 10)
  t.ok(pruned >= 1 && pruned <= 10, `a sample of 10 forgets at most 10 (${pruned})`)
  t.equal((await listed()).length, 43 - pruned, 'the rest wait for a later sample')
  await store.delete(sid)
  t.same(await redis.keys(`${prefix}:{${sid}}:*`), [], 'deleting the session still finds every key: holder, cursor, logs, list, ordinals')
})

t.test('an append with a prepared wake writes the holder\'s wake in the same step, only while that replica holds the stream', async t => {
  const { redis, prefix, store, log } = await fresh(t)
  const newReader = (): ReturnType<typeof createRedis> => createRedis(server.url, { blocking: true, maxRetryDelayMs: 200 })
  const received: Envelope[] = []
  const holderBus = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000, ordered: true })
  t.teardown(() => holderBus.close())
  await holderBus.start('B', envelope => { received.push(envelope) })
  const owner = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000, ordered: true })
  t.equal(new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000 }).prepareWake('B', 's', 'r', '{}'), undefined, 'a bus not known to share one server with the log prepares none (Redis Cluster)')
  const record = sampleRecord()
  await store.create(record, 60_000)
  const sid = record.id
  const streamId = 'r1_wake000000001'
  // The POST's replica (B) marks its request and holds the stream.
  await log.markPending(sid, streamId, [7], 60_000, true, 'A', { replicaId: 'B', leaseMs: 10_000 })
  const answer = { jsonrpc: '2.0' as const, id: 7, result: { text: 'quote " backslash \\ snow ☃ <tag> \u2028' } }
  const json = JSON.stringify(answer)
  const appended = await log.append(sid, streamId, answer, 60_000, 7, json, owner.prepareWake('B', sid, streamId, json, { sentAt: 1 }))
  t.equal(appended.woken, true, 'the append reports the wake written')
  t.equal(appended.holder, 'B')
  await eventually('the wake in B\'s inbox', () => received.length === 1 ? true : undefined)
  t.same(received[0], { kind: 'wake', sid, streamId, sentAt: 1, entry: { json, seq: 2, entryId: appended.entryId } }, 'the envelope carries the entry exactly as sent apart (id, ordinal, JSON text)')
  t.same(JSON.parse((received[0] as { entry: { json: string } }).entry.json), answer, 'and its JSON parses back to the answer')
  t.ok(await redis.pttl(`${prefix}:inbox:B`) > 20_000, 'the inbox got its TTL, as a send gives it')
  // The client resumed the stream on C meanwhile: the wake prepared for B is not written.
  await store.claimHolder(sid, streamId, 'C', 10_000)
  const later = await log.append(sid, streamId, { jsonrpc: '2.0', method: 'notifications/message', params: {} }, 60_000, undefined, undefined, owner.prepareWake('B', sid, streamId, '{"jsonrpc":"2.0","method":"notifications/message","params":{}}'))
  t.notOk(later.woken, 'no wake for a replica that no longer holds the stream')
  t.equal(later.holder, 'C', 'the holder is reported, for the caller to wake it')
  await sleep(200)
  t.equal(received.length, 1, 'B got nothing more')
  const already = await log.append(sid, streamId, answer, 60_000, 7, json, owner.prepareWake('B', sid, streamId, json))
  t.equal(already.entryId, '', 'an answer given already is not written again')
  t.notOk(already.woken, 'nor woken')
})
