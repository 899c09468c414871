import t from 'tap'
import type { Bus } from '../../src/state/bus.js'
import { MemoryBus, MemoryBusHub } from '../../src/state/bus-memory.js'
import { busContract, Inbox } from './contract-bus.js'

busContract(t, async t => {
  const hub = new MemoryBusHub()
  return async (): Promise<Bus> => {
    const bus = new MemoryBus(hub)
    t.teardown(() => bus.close())
    return bus
  }
})

t.test('one replica id reads one inbox per hub', async t => {
  const hub = new MemoryBusHub()
  const [a, b] = [new MemoryBus(hub), new MemoryBus(hub)]
  t.teardown(async () => { await a.close(); await b.close() })
  await a.start('r', () => {})
  await t.rejects(b.start('r', () => {}))
  await t.rejects(a.start('other', () => {}), 'a bus starts once')
})

t.test('separate hubs do not talk', async t => {
  const [a, b] = [new MemoryBus(new MemoryBusHub()), new MemoryBus(new MemoryBusHub())]
  t.teardown(async () => { await a.close(); await b.close() })
  const [ia, ib] = [new Inbox(), new Inbox()]
  await a.start('r', ia.handler)
  await b.start('r', ib.handler)
  await a.send('r', { kind: 'wake', sid: 's', streamId: 'one' })
  await b.send('r', { kind: 'wake', sid: 's', streamId: 'two' })
  t.same(await ia.until(1), [{ kind: 'wake', sid: 's', streamId: 'one' }])
  t.same(await ib.until(1), [{ kind: 'wake', sid: 's', streamId: 'two' }])
})

t.test('a throwing handler goes to onHandlerError and delivery goes on', async t => {
  const hub = new MemoryBusHub()
  const errors: unknown[] = []
  const bus = new MemoryBus(hub, { onHandlerError: err => errors.push(err) })
  t.teardown(() => bus.close())
  const inbox = new Inbox()
  await bus.start('r', envelope => {
    inbox.handler(envelope)
    if (inbox.received.length === 1) throw new Error('handler bug')
  })
  await bus.send('r', { kind: 'wake', sid: 's', streamId: '1' })
  await bus.send('r', { kind: 'wake', sid: 's', streamId: '2' })
  await inbox.until(2)
  t.match(errors, [{ message: 'handler bug' }])
})
