// Parked MRTR calls (routing/upstream/mrtr.ts) as pure logic: the signed requestState claims its call once,
// for its principal, before its expiry; anything tampered, foreign, replayed or expired is -32602.
// The calls are stand-ins (only onExpire is exercised); the wire is test/integration/modern.test.ts.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { isGatewayError, jsonRpcCodeOf } from '../../src/core/errors.js'
import { ParkedCalls, type ParkedCall } from '../../src/routing/upstream/mrtr.js'
import type { PooledCall } from '../../src/routing/upstream/pool.js'

function parkedCall (onExpire: () => void = () => {}): ParkedCall {
  const call: PooledCall = { key: 'm1', connectionId: 'pool.test.1', cancel: () => {}, answer: () => {}, rebind: () => {} }
  return { call, server: 's', serverInfo: { name: 'b', version: '1' }, method: 'tools/call', pending: new Map(), onExpire }
}

function code (fn: () => unknown): number | string {
  try {
    fn()
    return 'accepted'
  } catch (err) {
    return isGatewayError(err) ? jsonRpcCodeOf(err) : 'threw something else'
  }
}

t.test('a requestState claims its call exactly once, and only for its principal', async t => {
  const calls = new ParkedCalls({ replicaId: 'r1', ttlMs: 60_000 })
  t.teardown(() => { calls.clear() })
  const parked = parkedCall()
  const state = calls.park(parked, 'acme:alice')
  t.equal(calls.size, 1)
  t.equal(code(() => calls.take(state, 'acme:bob')), -32602, "another principal's retry is refused")
  t.equal(calls.size, 1, 'and does not consume the call')
  t.equal(calls.take(state, 'acme:alice'), parked, 'its principal takes it')
  t.equal(calls.size, 0)
  t.equal(code(() => calls.take(state, 'acme:alice')), -32602, 'a replay is refused')
})

t.test('tampered, malformed and foreign states are refused', async t => {
  const calls = new ParkedCalls({ replicaId: 'r1', ttlMs: 60_000 })
  const other = new ParkedCalls({ replicaId: 'r2', ttlMs: 60_000 })
  t.teardown(() => { calls.clear(); other.clear() })
  const state = calls.park(parkedCall(), 'p')
  const [body, sig] = state.split('.') as [string, string]
  const payload = JSON.parse(Buffer.from(body, 'base64url').toString()) as Record<string, unknown>
  const forged = Buffer.from(JSON.stringify({ ...payload, e: Date.now() + 10 * 86_400_000 })).toString('base64url')
  t.equal(code(() => calls.take(`${forged}.${sig}`, 'p')), -32602, 'a changed payload under the old signature')
  t.equal(code(() => calls.take(`${body}.${sig.slice(0, -2)}AA`, 'p')), -32602, 'a changed signature')
  t.equal(code(() => calls.take('no-dot-at-all', 'p')), -32602, 'not a state')
  t.equal(code(() => calls.take(42, 'p')), -32602, 'not a string')
  t.equal(code(() => calls.take('x'.repeat(5000), 'p')), -32602, 'oversized')
  t.equal(code(() => other.take(state, 'p')), -32602, "another replica's key does not verify it")
  t.equal(code(() => calls.take(state, 'p')), 'accepted', 'the untouched state still works')
})

t.test('a call nobody comes back for expires: cancelled once, its state refused', async t => {
  const calls = new ParkedCalls({ replicaId: 'r1', ttlMs: 50 })
  let expired = 0
  const state = calls.park(parkedCall(() => { expired++ }), 'p')
  await sleep(120)
  t.equal(expired, 1, 'onExpire ran once')
  t.equal(calls.size, 0)
  t.equal(code(() => calls.take(state, 'p')), -32602, 'an expired state is refused')
})

t.test('shutdown cancels every parked call', async t => {
  const calls = new ParkedCalls({ replicaId: 'r1', ttlMs: 60_000 })
  let expired = 0
  calls.park(parkedCall(() => { expired++ }), 'p')
  calls.park(parkedCall(() => { expired++ }), 'q')
  calls.clear()
  t.equal(expired, 2)
  t.equal(calls.size, 0)
})
