// ClientStreams upkeep (issue 10): the tick that renews holder leases walks every stream held
// here; with the memory twins each await resolves at once, so it must yield to the event loop
// between slices or 10,000 idle streams stall every request for the whole walk. Pure logic over
// the memory twins; the writers' responses are never started, so a bare object stands in.
import { NO_METRICS } from '../../src/telemetry/metrics.js'
import type { ServerResponse } from 'node:http'
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { ClientStreams } from '../../src/routing/streams.js'
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
