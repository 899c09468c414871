import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import type { Bus } from '../../src/state/bus.js'
import { RedisBus } from '../../src/state/bus-redis.js'
import { createRedis } from '../../src/state/redis/client.js'
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
