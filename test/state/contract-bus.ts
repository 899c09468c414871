// The bus contract, run against the memory twin and the Redis twin.
import { randomUUID } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import type { Bus, Envelope } from '../../src/state/bus.js'

/**
 * Makes a factory of buses that can reach each other (one hub, or one Redis and prefix) for one
 * subtest; every bus it makes is closed in t.teardown.
 */
export type MakeBusFactory = (t: Test) => Promise<() => Promise<Bus>>

/** A handler that records envelopes and lets a test await the next ones. */
export class Inbox {
  readonly received: Envelope[] = []
  #waiters: Array<{ count: number, resolve: () => void }> = []

  readonly handler = (envelope: Envelope): void => {
    this.received.push(envelope)
    this.#waiters = this.#waiters.filter(w => {
      if (this.received.length < w.count) return true
      w.resolve()
      return false
    })
  }

  /** Resolves once `count` envelopes in all have arrived. */
  async until (count: number): Promise<Envelope[]> {
    if (this.received.length < count) await new Promise<void>(resolve => this.#waiters.push({ count, resolve }))
    return this.received
  }
}

const wake = (sid: string, streamId = 'get'): Envelope => ({ kind: 'wake', sid, streamId })

export function busContract (t: Test, make: MakeBusFactory): void {
  t.test('an envelope reaches the replica it was sent to, and only that one', async t => {
    const newBus = await make(t)
    const [a, b] = [await newBus(), await newBus()]
    const [ia, ib] = [new Inbox(), new Inbox()]
    const [ra, rb] = [`a-${randomUUID()}`, `b-${randomUUID()}`]
    await a.start(ra, ia.handler)
    await b.start(rb, ib.handler)
    const sid = randomUUID()
    await a.send(rb, wake(sid))
    t.same(await ib.until(1), [wake(sid)])
    // A marker sent after: if the first envelope had gone to `a` too, it would arrive before it.
    await b.send(ra, wake(sid, 'marker'))
    t.same(await ia.until(1), [wake(sid, 'marker')], 'the other replica got only its own envelope')
  })

  t.test('every kind of envelope round-trips, in send order', async t => {
    const newBus = await make(t)
    const [a, b] = [await newBus(), await newBus()]
    const ib = new Inbox()
    const rb = `b-${randomUUID()}`
    await a.start(`a-${randomUUID()}`, () => {})
    await b.start(rb, ib.handler)
    const sid = randomUUID()
    const envelopes: Envelope[] = [
      { kind: 'deliver', sid, streamId: 'req-1', message: { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'echo', arguments: { text: 'héllo ✓' } } } },
      { kind: 'deliver', sid, streamId: null, message: { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 7 } } },
      { kind: 'wake', sid, streamId: 'req-1' },
      { kind: 'release', sid, streamId: 'get' },
      { kind: 'end-session', sid, reason: 'deleted' }
    ]
    for (const envelope of envelopes) await a.send(rb, envelope)
    t.same(await ib.until(envelopes.length), envelopes)
  })

  t.test('a replica can send to itself', async t => {
    const newBus = await make(t)
    const a = await newBus()
    const ia = new Inbox()
    const ra = `a-${randomUUID()}`
    await a.start(ra, ia.handler)
    await a.send(ra, wake('s'))
    t.same(await ia.until(1), [wake('s')])
  })

  t.test('the handler never runs inside send()', async t => {
    const newBus = await make(t)
    const a = await newBus()
    const ra = `a-${randomUUID()}`
    let sending = false
    const seen: boolean[] = []
    const ia = new Inbox()
    await a.start(ra, envelope => { seen.push(sending); ia.handler(envelope) })
    sending = true
    const sent = a.send(ra, wake('s'))
    sending = false
    await sent
    await ia.until(1)
    t.same(seen, [false])
  })

  t.test('the receiver gets a copy, not the sender\'s object', async t => {
    const newBus = await make(t)
    const a = await newBus()
    const ia = new Inbox()
    const ra = `a-${randomUUID()}`
    await a.start(ra, ia.handler)
    const envelope = { kind: 'deliver' as const, sid: 's', streamId: null, message: { jsonrpc: '2.0' as const, method: 'm', params: { n: 1 } } }
    await a.send(ra, envelope)
    envelope.message.params.n = 2
    const [got] = await ia.until(1)
    t.not(got, envelope)
    t.same(got, { ...envelope, message: { jsonrpc: '2.0', method: 'm', params: { n: 1 } } })
  })

  t.test('sending to an unknown replica is a silent drop', async t => {
    const newBus = await make(t)
    const a = await newBus()
    const ia = new Inbox()
    const ra = `a-${randomUUID()}`
    await a.start(ra, ia.handler)
    await a.send(`nobody-${randomUUID()}`, wake('s'))
    await a.send(ra, wake('s', 'after'))
    t.same(await ia.until(1), [wake('s', 'after')], 'nothing else arrived, and the bus still works')
  })

  t.test('a bus that only sends needs no start', async t => {
    const newBus = await make(t)
    const [a, b] = [await newBus(), await newBus()]
    const ib = new Inbox()
    const rb = `b-${randomUUID()}`
    await b.start(rb, ib.handler)
    await a.send(rb, wake('s'))
    t.same(await ib.until(1), [wake('s')])
  })

  t.test('close stops delivery; a new reader of the same inbox gets what follows', async t => {
    const newBus = await make(t)
    const [a, b, c] = [await newBus(), await newBus(), await newBus()]
    const [ib, ic] = [new Inbox(), new Inbox()]
    const rb = `b-${randomUUID()}`
    await b.start(rb, ib.handler)
    await a.send(rb, wake('s', 'before'))
    await ib.until(1)
    await b.close()
    await c.start(rb, ic.handler)
    await a.send(rb, wake('s', 'after'))
    t.same(await ic.until(1), [wake('s', 'after')])
    await sleep(50)
    t.same(ib.received, [wake('s', 'before')], 'the closed bus got nothing more')
    await b.close()
    t.pass('close twice is fine')
  })

  t.test('close before start is fine', async t => {
    const newBus = await make(t)
    const a = await newBus()
    await a.close()
    t.pass('closed')
  })
}
