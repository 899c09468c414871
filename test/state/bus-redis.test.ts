import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import type { Bus, DeliverEnvelope } from '../../src/state/bus.js'
import { RedisBus } from '../../src/state/bus-redis.js'
import { createRedis } from '../../src/state/redis/client.js'
import { sessionKeys } from '../../src/state/redis/keys.js'
import { eventually } from '../helpers/wait.js'
import { busContract, Inbox } from './contract-bus.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'

const server = await startRedis(t)
const newReader = (): ReturnType<typeof createRedis> => createRedis(server.url, { blocking: true, maxRetryDelayMs: 200 })

busContract(t, async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  return async (): Promise<Bus> => {
    const bus = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000 })
    t.teardown(() => bus.close())
    return bus
  }
})

t.test('an inbox is a bounded stream with a TTL refreshed on send', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const bus = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 30_000, inboxMaxLen: 5 })
  t.teardown(() => bus.close())
  const key = `${prefix}:inbox:r1`
  await bus.send('r1', { kind: 'wake', sid: 's', streamId: 'get' })
  t.ok(await redis.pttl(key) > 20_000, 'the inbox has a TTL')
  await redis.pexpire(key, 1_000)
  for (let i = 0; i < 300; i++) await bus.send('r1', { kind: 'wake', sid: 's', streamId: String(i) })
  t.ok(await redis.pttl(key) > 20_000, 'send refreshed it')
  const len = await redis.xlen(key)
  t.ok(len >= 5 && len <= 105, `bounded near inboxMaxLen (${len})`)
  const [[, fields]] = await redis.xrevrange(key, '+', '-', 'COUNT', 1) as [[string, string[]]]
  t.same(JSON.parse(fields[1]!), { kind: 'wake', sid: 's', streamId: '299' }, 'envelopes are JSON')
})

t.test('envelopes left in an inbox before start are not delivered', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const [a, b] = [new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000 }), new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000 })]
  t.teardown(async () => { await a.close(); await b.close() })
  const rb = `b-${randomUUID()}`
  await a.send(rb, { kind: 'wake', sid: 's', streamId: 'stale' })
  const inbox = new Inbox()
  await b.start(rb, inbox.handler)
  await a.send(rb, { kind: 'wake', sid: 's', streamId: 'fresh' })
  t.same(await inbox.until(1), [{ kind: 'wake', sid: 's', streamId: 'fresh' }])
})

t.test('a malformed entry is skipped and a throwing handler does not stop the loop', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const errors: unknown[] = []
  const bus = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000, onHandlerError: err => errors.push(err) })
  t.teardown(() => bus.close())
  const inbox = new Inbox()
  await bus.start('r', envelope => {
    inbox.handler(envelope)
    if (envelope.kind === 'release') throw new Error('handler bug')
  })
  await redis.xadd(`${prefix}:inbox:r`, '*', 'e', 'not json')
  await redis.xadd(`${prefix}:inbox:r`, '*', 'e', '{"no":"kind"}')
  await bus.send('r', { kind: 'release', sid: 's', streamId: 'get' })
  await bus.send('r', { kind: 'wake', sid: 's', streamId: 'get' })
  t.same(await inbox.until(2), [{ kind: 'release', sid: 's', streamId: 'get' }, { kind: 'wake', sid: 's', streamId: 'get' }])
  t.match(errors, [{ message: 'handler bug' }])
})

t.test('close ends a blocked read at once and disconnects the reader', async t => {
  const redis = await testRedis(t, server.url)
  let reader: ReturnType<typeof createRedis> | null = null
  const bus = new RedisBus(redis, () => (reader = newReader()), randomPrefix(), { inboxTtlMs: 60_000, blockMs: 60_000 })
  await bus.start('r', () => {})
  // The read blocks for 60 s; close() must not wait that out. 10 s is a hang bound, not a timing.
  const outcome = await Promise.race([bus.close().then(() => 'closed'), sleep(10_000, 'hung', { ref: false })])
  t.equal(outcome, 'closed')
  t.equal(reader!.status, 'end')
})

t.test('takeUnread: a dead replica\'s envelopes past what it handed on, once, their markers re-named', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const sender = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000, ordered: true })
  const dead = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000, ordered: true })
  t.teardown(async () => { await sender.close(); await dead.close() })
  const inbox = new Inbox()
  await dead.start('rdead', inbox.handler)
  const pending = sessionKeys(prefix, 'S').pending
  const request = (id: number): DeliverEnvelope => ({ kind: 'deliver', sid: 'S', streamId: 'r1_a', message: { jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo' } } })
  await redis.hset(pending, 'r1_a n1', '1|rdead', 'r1_a n2', '1|rdead', 'r1_a n3', 'done')
  await sender.send('rdead', request(1))
  await inbox.until(1)
  const key = `${prefix}:inbox:rdead`
  const handedAt = async (): Promise<string | undefined> => {
    const groups = await redis.call('XINFO', 'GROUPS', key) as string[][]
    const h = groups.find(g => g[1] === 'h')
    return h?.[h.indexOf('last-delivered-id') + 1]
  }
  const [[first]] = await redis.xrange(key, '-', '+') as [[string, string[]]]
  t.equal(await eventually('the handed position to move', async () => await handedAt() === first ? first : undefined), first, 'the reader recorded request 1 as handed on')
  await dead.close() // it dies: nothing more is read
  await sender.send('rdead', request(2))
  const cancel: DeliverEnvelope = { kind: 'deliver', sid: 'S', streamId: null, message: { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 9 } } }
  await sender.send('rdead', cancel)
  await sender.send('rdead', request(3))
  await sender.send('rdead', { kind: 'deliver', sid: 'OTHER', streamId: 'r1_b', message: { jsonrpc: '2.0', id: 4, method: 'tools/call' } })
  await sender.send('rdead', { kind: 'wake', sid: 'S', streamId: 'r1_a' })
  const taken = await sender.takeUnread('rdead', 'S', 'rnew')
  t.same(taken.map(e => e.message), [request(2).message, cancel.message], 'the unhanded request and notification, in order; not the one handed on, nor one answered already')
  t.equal(await redis.hget(pending, 'r1_a n1'), '1|rdead', 'the handed request keeps its marker (it gets -32007)')
  t.match(await redis.hget(pending, 'r1_a n2'), /^\d+\|rnew$/, 'the taken request is served by the new replica now')
  t.same(await sender.takeUnread('rdead', 'S', 'rnew'), [], 'taken once only')
  t.equal(await redis.xlen(key), 3, 'the handed request, the other session\'s envelope and the wake stay')
  const unordered = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000 })
  t.same(await unordered.takeUnread('rdead', 'OTHER', 'rnew'), [], 'a bus that cannot change inbox and markers in one step takes nothing')
})

t.test('an inbox that expired under its reader is made again, groups and all, and read on at once', async t => {
  const redis = await testRedis(t, server.url)
  const prefix = randomPrefix()
  const bus = new RedisBus(redis, newReader, prefix, { inboxTtlMs: 60_000, ordered: true })
  t.teardown(() => bus.close())
  const inbox = new Inbox()
  await bus.start('r', inbox.handler)
  await new Promise(resolve => setTimeout(resolve, 100)) // the reader blocks on the inbox
  await redis.del(`${prefix}:inbox:r`) // as its TTL would
  const sentAt = Date.now()
  await bus.send('r', { kind: 'wake', sid: 's', streamId: 'after' })
  t.same(await inbox.until(1), [{ kind: 'wake', sid: 's', streamId: 'after' }], 'the envelope sent after is delivered')
  t.ok(Date.now() - sentAt < 2_000, `within the read's backoff, not a block later (${Date.now() - sentAt} ms)`)
  const groups = await eventually('both groups again', async () => {
    const list = (await redis.call('XINFO', 'GROUPS', `${prefix}:inbox:r`) as string[][]).map(g => g[1]).sort()
    return list.length === 2 ? list : undefined
  })
  t.same(groups, ['h', 'r'], 'the read group and the handed-on group')
})
