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

t.test('records are shared frozen, not copied deeply per lookup: a change can never reach the store', async t => {
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const record = sampleRecord()
  await store.create(record, 60_000)
  ;(record.initializeParams as { clientInfo: { name: string } }).clientInfo.name = 'changed by the creator'
  const got = (await store.get(record.id))!
  t.equal((got.initializeParams as { clientInfo: { name: string } }).clientInfo.name, 'c', 'the store kept its own copy at create')
  got.protocolVersion = 'changed on the copy'
  t.equal((await store.get(record.id))?.protocolVersion, '2025-06-18', 'a top-level change stays on the caller\'s copy')
  t.throws(() => { (got.initializeParams as { clientInfo: { name: string } }).clientInfo.name = 'x' }, TypeError, 'a nested change throws')
  await store.update(record.id, { established: { initialized: true, logLevel: null, subscriptions: ['a'], backendVersion: null } })
  const updated = (await store.get(record.id))!
  t.throws(() => { updated.established?.subscriptions.push('b') }, TypeError, 'an updated value is frozen too')
  t.same((await store.get(record.id))?.established?.subscriptions, ['a'])
})
