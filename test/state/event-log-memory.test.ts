import t from 'tap'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { CONTRACT_MAX_LEN, eventLogContract } from './contract-event-log.js'

eventLogContract(t, async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  return { log: new MemoryEventLog(store, CONTRACT_MAX_LEN), store, maxLen: CONTRACT_MAX_LEN }
})

t.test('memory ids are a contiguous per-stream sequence and the bound is exact', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const log = new MemoryEventLog(store, 3)
  const ids: number[] = []
  for (let i = 0; i < 5; i++) ids.push(Number((await log.append('s', 'get', null, 60_000)).entryId))
  const first = ids[0] ?? 0
  t.same(ids, [first, first + 1, first + 2, first + 3, first + 4], 'contiguous')
  t.same((await log.readAfter('s', 'get', null, 10)).map(e => Number(e.entryId)), [first + 2, first + 3, first + 4])
  t.same((await log.readAfter('s', 'get', String(first + 3), 10)).map(e => Number(e.entryId)), [first + 4])
  t.same((await log.readAfter('s', 'get', `${first + 2}-7`, 10)).map(e => Number(e.entryId)), [first + 3, first + 4], 'a Redis-shaped cursor reads as its millisecond part')
})

t.test('a stored message is a copy', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const log = new MemoryEventLog(store, 3)
  const message = { jsonrpc: '2.0' as const, method: 'm', params: { n: 1 } }
  await log.append('s', 'get', message, 60_000)
  message.params.n = 2
  t.same((await log.readAfter('s', 'get', null, 1))[0]?.message, { jsonrpc: '2.0', method: 'm', params: { n: 1 } })
})

t.test('maxLen must be a positive integer', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  t.throws(() => new MemoryEventLog(store, 0), RangeError)
})

t.test('the store sweep drops expired logs', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const log = new MemoryEventLog(store, 3)
  await log.append('s', 'old', null, 1)
  await log.append('s', 'live', null, 60_000)
  store.sweep(Date.now() + 10)
  t.equal(await log.hasStream('s', 'old'), false)
  t.equal(await log.hasStream('s', 'live'), true)
  store.sweep(Date.now() + 120_000)
  t.equal(await log.hasStream('s', 'live'), false)
})

t.test('prune looks at the oldest streams only, as many as sampled: a busy session\'s thousands of live ones are not walked each time', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const log = new MemoryEventLog(store, 3)
  await log.append('s', 'r1_old', null, 60_000)
  await log.append('s', 'r1_lapsed', null, 20)
  await new Promise(resolve => setTimeout(resolve, 60))
  t.equal(await log.prune('s', 1), 0, 'the oldest is alive, and it was the only one looked at')
  t.equal(await log.prune('s', 2), 1, 'with two looked at, the lapsed one goes')
  t.equal(await log.hasStream('s', 'r1_old'), true)
})

t.test('the store\'s sweep drops every lapsed log of every session, and only those', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const log = new MemoryEventLog(store, 3)
  for (const sid of ['s1', 's2']) {
    await log.append(sid, 'r1_lapsed', null, 20)
    await log.append(sid, 'r1_live', null, 60_000)
  }
  await new Promise(resolve => setTimeout(resolve, 60))
  store.sweep()
  t.equal(await log.prune('s1', 10) + await log.prune('s2', 10), 0, 'nothing lapsed was left for prune')
  t.ok(await log.hasStream('s1', 'r1_live') && await log.hasStream('s2', 'r1_live'), 'the live logs stay')
})
