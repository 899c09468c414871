// ClientStreams upkeep (issue 10): the tick that renews holder leases walks every stream held
// here; with the memory twins each await resolves at once, so it must yield to the event loop
// between slices or 10,000 idle streams stall every request for the whole walk. Pure logic over
// the memory twins; the writers' responses are never started, so a bare object stands in. Ending
// a session: a real HTTP response, read by fetch.
import { NO_METRICS } from '../../src/telemetry/metrics.js'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { GW_ERR_BACKEND_UNAVAILABLE } from '../../src/core/errors.js'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { ClientStreams, newRequestStreamId } from '../../src/routing/streams.js'
import { UPKEEP_SLICE } from '../../src/routing/upkeep.js'
import { MemoryBus } from '../../src/state/bus-memory.js'
import { MemoryEventLog } from '../../src/state/event-log-memory.js'
import { GET_STREAM } from '../../src/state/event-log.js'
import { MemorySessionStore } from '../../src/state/session-store-memory.js'
import { createLogger } from '../../src/telemetry/logger.js'

t.test('renew walks every held stream and yields to the event loop between slices', async t => {
  const config = parseConfig({ servers: { s: { transport: 'stdio', command: 'true' } } })
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const eventLog = new MemoryEventLog(store, 10)
  const log = createLogger('silent', 'r1')
  const streams = new ClientStreams({
    replicaId: 'r1', config, store, eventLog, bus: new MemoryBus(), log, metrics: NO_METRICS,
    isAlive: async () => true,
    endSession: async () => {}
  })
  const count = UPKEEP_SLICE * 3 + 7
  for (let i = 0; i < count; i++) {
    const sid = `session-${String(i).padStart(12, '0')}`
    await store.create({ id: sid, server: 's', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null, backendSessionId: null, createdAt: 0 }, 60_000)
    await streams.open({ res: {} as ServerResponse, sid, streamId: GET_STREAM, mode: 'sse', cursor: null, headers: {}, log })
  }
  // Immediates queued before the walk run while it is still going only if the walk yields.
  let spins = 0
  const spin = (): void => { if (++spins < 5) setImmediate(spin) }
  setImmediate(spin)
  const held = await streams.renew()
  const spinsDuringWalk = spins
  t.equal(held.size, count, 'every session with a stream here is reported held')
  t.ok(spinsDuringWalk >= 3, `the event loop turned during the walk (${spinsDuringWalk} turns)`)
})

t.test('a session that ends answers the requests still waiting on its POST streams, once', async t => {
  const config = parseConfig({ servers: { s: { transport: 'stdio', command: 'true' } } })
  const store = new MemorySessionStore()
  t.teardown(() => store.close())
  const eventLog = new MemoryEventLog(store, 10)
  const log = createLogger('silent', 'r1')
  const streams = new ClientStreams({
    replicaId: 'r1', config, store, eventLog, bus: new MemoryBus(), log, metrics: NO_METRICS,
    isAlive: async () => true,
    endSession: async () => {}
  })
  const sid = 'session-000000000001'
  await store.create({ id: sid, server: 's', principal: 'anonymous', transport: 'streamable', protocolVersion: '2025-11-25', initializeParams: null, backendSessionId: null, createdAt: 0 }, 60_000)
  const streamId = newRequestStreamId('sse', 2)
  const opened = new Promise<void>(resolve => {
    const server = createServer((_req, res) => {
      streams.open({ res, sid, streamId, mode: 'sse', cursor: null, fresh: true, headers: {}, requestIds: [1, 2], log })
        .then(async writer => { await writer.start(); resolve() }, (err: unknown) => { t.fail(String(err)) })
    })
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo
      t.teardown(() => { server.closeAllConnections(); server.close() })
      body = fetch(`http://127.0.0.1:${port}/`).then(async res => await res.text())
    })
  })
  let body: Promise<string> | undefined
  await opened
  // Request 1 is answered through the log; request 2 is still waiting when the session ends.
  await streams.append(sid, streamId, { jsonrpc: '2.0', id: 1, result: {} })
  await new Promise(resolve => setTimeout(resolve, 50))
  streams.endSession(sid, new GW_ERR_BACKEND_UNAVAILABLE('s', 'session ended: owner replica gone'))
  const frames = (await body ?? '').split('\n').filter(line => line.startsWith('data: ')).map(line => JSON.parse(line.slice(6)) as { id: number, result?: unknown, error?: { code: number } })
  t.same(frames.map(f => f.id), [1, 2], 'each request answered exactly once, and the stream ended')
  t.ok('result' in (frames[0] ?? {}), 'the answer that came is kept')
  t.equal(frames[1]?.error?.code, -32007, 'the waiting request gets -32007, not silence')
})
