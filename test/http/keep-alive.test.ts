// One keep-alive timer per interval for every open SSE stream (http/keep-alive.ts):
// each stream is called about once per interval, the streams are spread over the ticks, and a
// stream taken out (or that ends itself meanwhile) is called no more. Pure logic, real timers.
import t from 'tap'
import { keepAliveCount, SLOTS, startKeepAlive, stopKeepAlive, type KeepAliveTarget } from '../../src/http/keep-alive.js'

const sleep = async (ms: number): Promise<void> => await new Promise(resolve => setTimeout(resolve, ms))

t.test('every stream is called about once per interval, not all in the same tick', async t => {
  const intervalMs = 320
  const calls: number[][] = []
  const started = Date.now()
  const targets: Array<[KeepAliveTarget, ReturnType<typeof startKeepAlive>]> = []
  for (let i = 0; i < 40; i++) {
    const seen: number[] = []
    calls.push(seen)
    const target = { keepAlive: () => { seen.push(Date.now() - started) } }
    targets.push([target, startKeepAlive(intervalMs, target)])
    // Spread the openings over one interval, as streams open over time.
    await sleep(intervalMs / 40)
  }
  await sleep(intervalMs * 3)
  for (const [i, seen] of calls.entries()) {
    t.ok(seen.length >= 2 && seen.length <= 4, `stream ${i} was kept alive ${seen.length} times in about three intervals`)
    for (let k = 1; k < seen.length; k++) {
      const gap = (seen[k] ?? 0) - (seen[k - 1] ?? 0)
      t.ok(gap > intervalMs * 0.7 && gap < intervalMs * 1.9, `stream ${i}: ${gap} ms between keep-alives (interval ${intervalMs})`)
    }
  }
  const ticks = new Set(calls.flat().map(ms => Math.round(ms / (intervalMs / SLOTS))))
  t.ok(ticks.size > 4, `the calls fell in ${ticks.size} different ticks`)
  for (const [target, slot] of targets) stopKeepAlive(intervalMs, target, slot)
  t.equal(keepAliveCount(), 0, 'none left in the timer')
})

t.test('a stopped stream is called no more, and the timer goes with the last one', async t => {
  const intervalMs = 160
  let a = 0
  let b = 0
  const ta = { keepAlive: () => { a++ } }
  const slotA = startKeepAlive(intervalMs, ta)
  const tb: KeepAliveTarget = { keepAlive: () => { b++; stopKeepAlive(intervalMs, tb, slotB) } }
  const slotB = startKeepAlive(intervalMs, tb)
  const before = keepAliveCount()
  await sleep(intervalMs * 2.5)
  t.equal(b, 1, 'a stream that ends itself in its keep-alive is called once')
  t.ok(a >= 2, `the other goes on (${a} keep-alives)`)
  stopKeepAlive(intervalMs, ta, slotA)
  stopKeepAlive(intervalMs, ta, slotA)
  const count = a
  await sleep(intervalMs * 2)
  t.equal(a, count, 'stopped: no more keep-alives')
  t.equal(keepAliveCount(), before - 2, 'both are out of the timer')
})
