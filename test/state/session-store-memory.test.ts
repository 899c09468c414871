import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { sampleRecord, sessionStoreContract } from './contract-session-store.js'

sessionStoreContract(t, async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  return store
})

t.test('the sweep timer runs the parts and stops on close', async t => {
  const store = new MemorySessionStore({ sweepIntervalMs: 5 })
  t.teardown(() => store.close())
  let sweeps = 0
  const deleted: string[] = []
  store.attach({ deleteSession: sid => deleted.push(sid), sweep: () => { sweeps++ } })
  while (sweeps === 0) await sleep(5)
  await store.close()
  const after = sweeps
  await sleep(50)
  t.equal(sweeps, after, 'no sweep after close')
  await store.close()
  const record = sampleRecord()
  await store.create(record, 60_000)
  await store.delete(record.id)
  t.same(deleted, [record.id], 'parts hear about deletes')
})

t.test('sweep drops expired entries', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const record = sampleRecord()
  await store.create(record, 1)
  await store.claimOwner(record.id, 'r1', 1)
  await store.claimHolder(record.id, 'get', 'r1', 60_000)
  store.sweep(Date.now() + 10)
  t.equal(await store.get(record.id), null)
  t.equal(await store.getOwner(record.id), null)
  t.equal(await store.getHolder(record.id, 'get'), 'r1', 'a live holder survives the sweep')
})
