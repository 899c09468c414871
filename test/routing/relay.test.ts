// Unit tests of the relay: pure translation logic between one client session and its backend
// session, with a recording host and backend (no network, no Redis, no child process).
import t, { type Test } from 'tap'
import { pino } from 'pino'
import { CANCELLED_MEMBER, GW_ERR_BACKEND_UNAVAILABLE, isCancelledAnswer } from '../../src/core/errors.js'
import type { JsonRpcMessage, JsonRpcRequest } from '../../src/core/jsonrpc.js'
import { Relay, type RelayOptions } from '../../src/routing/upstream/relay.js'
import { NO_METRICS } from '../../src/telemetry/metrics.js'

interface Appended { sid: string, streamId: string, message: JsonRpcMessage }

interface Harness {
  relay: Relay
  sent: JsonRpcMessage[]
  appended: Appended[]
  ended: string[]
  /** Makes the backend's send() reject from now on. */
  failSends: (err: Error) => void
}

function harness (t: Test, overrides: Partial<RelayOptions> = {}): Harness {
  const sent: JsonRpcMessage[] = []
  const appended: Appended[] = []
  const ended: string[] = []
  let failure: Error | null = null
  let seq = 0
  const relay = new Relay({
    sid: 'sid-1',
    server: 'files',
    legacy: false,
    direct: false,
    isOwner: true,
    protocolVersion: '2025-11-25',
    clientCapabilities: { sampling: {} },
    requestTimeoutMs: 60_000,
    clientRequestTimeoutMs: 60_000,
    cancelOnTimeout: true,
    backendTransport: 'stdio',
    metrics: NO_METRICS.forSession('files', null),
    createdAt: Date.now(),
    host: {
      append: async (sid, streamId, message) => { appended.push({ sid, streamId, message }) },
      endSession: async (_sid, reason) => { ended.push(reason) },
      nextServerRequestId: () => `s.r1.${++seq}`
    },
    log: pino({ level: 'silent' }),
    ...overrides
  })
  relay.backend = {
    send: async message => {
      if (failure !== null) throw failure
      sent.push(message)
    },
    setListening: () => {}
  }
  t.teardown(() => { relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE('files', 'test over')) })
  return { relay, sent, appended, ended, failSends: err => { failure = err } }
}

const call = (id: number | string, name = 'echo', meta?: Record<string, unknown>): JsonRpcRequest =>
  ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: {}, ...(meta !== undefined ? { _meta: meta } : {}) } })

const tick = async (): Promise<void> => { await new Promise(resolve => setImmediate(resolve)) }

t.test('ids are minted toward a routed backend and mapped back to the client', async t => {
  const h = harness(t)
  h.relay.deliver(call(0), 'r1_a')
  h.relay.deliver(call(0), 'r1_b') // the same client id on another stream still gets its own backend id
  await tick()
  t.same(h.sent.map(m => (m as JsonRpcRequest).id), [1, 2], 'gateway-minted, never the client id')
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 2, result: { content: [] } })
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: { content: [] } })
  t.same(h.appended.map(a => [a.streamId, (a.message as { id: unknown }).id]), [['r1_b', 0], ['r1_a', 0]])
  t.equal(h.relay.inFlightCount, 0)
})

t.test('a direct session passes the client ids through', async t => {
  const h = harness(t, { direct: true })
  h.relay.deliver(call('abc'), 'r1_a')
  await tick()
  t.equal((h.sent[0] as JsonRpcRequest).id, 'abc')
})

t.test('a late or unknown answer is dropped', async t => {
  const h = harness(t)
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 99, result: {} })
  t.same(h.appended, [])
})

t.test('ping is answered by the gateway, not the backend', async t => {
  const h = harness(t)
  h.relay.deliver({ jsonrpc: '2.0', id: 7, method: 'ping' }, 'r1_p')
  await tick()
  t.same(h.sent, [])
  t.same(h.appended[0], { sid: 'sid-1', streamId: 'r1_p', message: { jsonrpc: '2.0', id: 7, result: {} } })
})

t.test('progress reaches the stream of the request that carried the token, with the token intact', async t => {
  const h = harness(t)
  h.relay.deliver(call(1, 'slow', { progressToken: 'tok-1' }), 'r1_a')
  h.relay.deliver(call(2, 'slow', { progressToken: 5 }), 'r1_b')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 5, progress: 1 } })
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 'tok-1', progress: 1 } })
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 'nobody', progress: 1 } })
  t.same(h.appended.map(a => a.streamId), ['r1_b', 'r1_a'], 'unknown tokens dropped (U-PROG-1)')
  t.match(h.appended[0]?.message, { params: { progressToken: 5 } }, 'numeric token stays numeric')
})

t.test('progress for a JSON-mode stream goes to the GET stream (JSON bodies carry only responses)', async t => {
  const h = harness(t)
  h.relay.deliver(call(1, 'slow', { progressToken: 't' }), 'j1_a')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 't', progress: 1 } })
  t.equal(h.appended[0]?.streamId, 'get')
})

t.test('other notifications: the one request in flight, else GET; list_changed always GET', async t => {
  const h = harness(t)
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'idle' } })
  h.relay.deliver(call(1), 'r1_a')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'busy' } })
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/tools/list_changed' })
  h.relay.deliver(call(2), 'r1_b')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'two in flight' } })
  t.same(h.appended.map(a => a.streamId), ['get', 'r1_a', 'get', 'get'])
})

t.test('a legacy HTTP+SSE session sends everything to its one stream', async t => {
  const h = harness(t, { legacy: true })
  await h.relay.fromBackend({ jsonrpc: '2.0', method: 'notifications/tools/list_changed' })
  h.relay.deliver(call(1), null)
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: {} })
  t.same(h.appended.map(a => a.streamId), ['legacy', 'legacy'])
})

t.test('server-to-client requests: opaque id out, the client answer mapped back to the backend id', async t => {
  const h = harness(t)
  h.relay.deliver(call(1), 'r1_a')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 'srv-9', method: 'sampling/createMessage', params: {} })
  t.same(h.appended[0], { sid: 'sid-1', streamId: 'r1_a', message: { jsonrpc: '2.0', id: 's.r1.1', method: 'sampling/createMessage', params: {} } })
  h.relay.deliver({ jsonrpc: '2.0', id: 's.r1.1', result: { content: { type: 'text', text: 'hi' } } }, null)
  await tick()
  t.same(h.sent.at(-1), { jsonrpc: '2.0', id: 'srv-9', result: { content: { type: 'text', text: 'hi' } } })
  h.relay.deliver({ jsonrpc: '2.0', id: 's.r1.1', result: {} }, null)
  await tick()
  t.equal(h.sent.length, 2, 'a second answer to the same request is ignored')
})

t.test('a server request needing an undeclared capability is refused to the backend (L-4)', async t => {
  const h = harness(t, { clientCapabilities: {} })
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 3, method: 'elicitation/create', params: {} })
  t.same(h.appended, [], 'the client never sees it')
  t.match(h.sent[0], { id: 3, error: { code: -32601 } })
  h.relay.setClient(undefined, { elicitation: {} })
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 4, method: 'elicitation/create', params: {} })
  t.equal(h.appended.length, 1, 'allowed once the client declares it')
})

t.test('a backend ping is answered without the client', async t => {
  const h = harness(t)
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 'p', method: 'ping' })
  t.same(h.sent, [{ jsonrpc: '2.0', id: 'p', result: {} }])
  t.same(h.appended, [])
})

t.test('cancellation is mapped to the backend id and stops the wait', async t => {
  const h = harness(t)
  h.relay.deliver(call(41), 'r1_a')
  await tick()
  h.relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 41, reason: 'user' } }, null)
  await tick()
  t.same(h.sent.at(-1), { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 1, reason: 'user' } })
  t.equal(h.appended.length, 1, 'the request\'s stream is told once')
  t.match(h.appended[0], { streamId: 'r1_a', message: { id: 41, error: { data: { code: 'GW_ERR_REQUEST_CANCELLED' } } } })
  t.ok(isCancelledAnswer(h.appended[0]!.message), 'as the cancelled mark, which writers never send')
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: {} })
  t.equal(h.appended.length, 1, 'the late answer is dropped')
  h.relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 'unknown' } }, null)
  await tick()
  t.equal(h.sent.length, 2, 'a cancel for an unknown request is not forwarded (routed session)')
  t.equal(h.appended.length, 1, 'and changes no stream')
})

t.test('a backend answer carrying the cancelled mark loses it: only the gateway marks a request cancelled', async t => {
  const h = harness(t)
  h.relay.deliver(call(42), 'r1_b')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: { ok: true }, [CANCELLED_MEMBER]: true } as unknown as JsonRpcMessage)
  t.equal(h.appended.length, 1)
  t.same(h.appended[0]?.message, { jsonrpc: '2.0', id: 42, result: { ok: true } }, 'the answer, without the mark')
  t.notOk(isCancelledAnswer(h.appended[0]!.message))
})

t.test('initialize is never cancelled (L-5), and its answer carries the client hop version', async t => {
  const h = harness(t, { protocolVersion: '2025-06-18' })
  h.relay.deliver({ jsonrpc: '2.0', id: 0, method: 'initialize', params: {} }, 'r1_i')
  await tick()
  h.relay.deliver({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 0 } }, null)
  await tick()
  t.equal(h.sent.length, 1)
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: { protocolVersion: '2025-11-25', capabilities: {} } })
  t.match(h.appended[0]?.message, { id: 0, result: { protocolVersion: '2025-06-18' } })
})

t.test('a failed initialize ends the session after the client could read the error', async t => {
  const h = harness(t)
  h.relay.deliver({ jsonrpc: '2.0', id: 0, method: 'initialize', params: {} }, 'r1_i')
  await tick()
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, error: { code: -32602, message: 'bad version' } })
  t.match(h.appended[0]?.message, { id: 0, error: { code: -32602 } })
  await new Promise(resolve => setTimeout(resolve, 1100))
  t.same(h.ended, ['initialize failed'])
})

t.test('a timeout answers -32006 and cancels a stdio backend request', async t => {
  const h = harness(t, { requestTimeoutMs: 30 })
  h.relay.deliver(call(5), 'r1_a')
  await new Promise(resolve => setTimeout(resolve, 80))
  t.match(h.appended[0], { streamId: 'r1_a', message: { id: 5, error: { code: -32006 } } })
  t.match(h.sent.at(-1), { method: 'notifications/cancelled', params: { requestId: 1 } })
  const http = harness(t, { requestTimeoutMs: 30, cancelOnTimeout: false })
  http.relay.deliver(call(5), 'r1_a')
  await new Promise(resolve => setTimeout(resolve, 80))
  t.equal(http.sent.length, 1, 'HTTP connections send their own cancel: the relay does not')
})

t.test('a send that fails answers the request with -32007 at once', async t => {
  const h = harness(t)
  h.failSends(new Error('EPIPE'))
  h.relay.deliver(call(8), 'r1_a')
  await tick()
  await tick()
  t.match(h.appended[0], { streamId: 'r1_a', message: { id: 8, error: { code: -32007, data: { source: 'gateway' } } } })
  t.equal(h.relay.inFlightCount, 0)
})

t.test('failAll answers every request in flight exactly once', async t => {
  const h = harness(t)
  h.relay.deliver(call(1), 'r1_a')
  h.relay.deliver(call(2), 'r1_b')
  await tick()
  h.relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE('files', 'child exited'))
  h.relay.failAll(new GW_ERR_BACKEND_UNAVAILABLE('files', 'again'))
  await tick()
  t.same(h.appended.map(a => [a.streamId, (a.message as { id: unknown }).id]).sort(), [['r1_a', 1], ['r1_b', 2]])
  await h.relay.fromBackend({ jsonrpc: '2.0', id: 1, result: {} })
  t.equal(h.appended.length, 2, 'a late answer after failAll is dropped')
})

t.test('without a backend connection a request is answered with -32007', async t => {
  const h = harness(t)
  h.relay.backend = null
  h.relay.deliver(call(3), 'r1_a')
  await tick()
  t.match(h.appended[0]?.message, { id: 3, error: { code: -32007 } })
})
