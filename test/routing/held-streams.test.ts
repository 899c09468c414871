// Idle GET streams survive an event loop held past their lease. The holder-lease pass
// used to find a lease that had lapsed while the loop was busy (a burst of child starts, many
// streams, a loaded machine) and end the stream with a `retry:` line, even alone in memory mode
// where nobody else could hold it. Here the loop is held on purpose for longer than the lease (the
// gateway runs in this process), so the test is about what happens after, not about timing: a
// lapsed lease nobody took is claimed back and no stream ends. Raw HTTP against a real gateway, a
// real pooled stdio server and, in Redis mode, a real Redis.
import { request, type IncomingMessage } from 'node:http'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { open, type RawSession } from '../helpers/raw-session.js'
import { randomPrefix, startRedis, testRedis } from '../helpers/redis-server.js'
import { eventually } from '../helpers/wait.js'
import { sessionKeys } from '../../src/state/redis/keys.js'

const SESSIONS = 40

interface HeldStream { session: RawSession, res: IncomingMessage, ended: boolean, body: string }

/** Opens the session's GET stream and keeps reading it; `ended` turns true if the gateway ends it. */
async function holdGet (gw: RunningGateway, session: RawSession): Promise<HeldStream> {
  return await new Promise((resolve, reject) => {
    const req = request(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': session.sid, 'mcp-protocol-version': session.version } })
    req.once('error', reject)
    req.once('response', res => {
      if (res.statusCode !== 200) { reject(new Error(`GET answered ${String(res.statusCode)}`)); return }
      const held: HeldStream = { session, res, ended: false, body: '' }
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => { held.body += chunk })
      res.once('end', () => { held.ended = true })
      res.once('close', () => { held.ended = true })
      resolve(held)
    })
    req.end()
  })
}

/** How many stream-lease passes the gateway has finished (its upkeep histogram's count). */
async function leasePasses (gw: RunningGateway): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  return Number(/^mcpgw_upkeep_pass_duration_seconds_count\{pass="stream_leases"\} (\d+)/m.exec(text)?.[1] ?? 0)
}

/** Holds this process's event loop (and so the gateway's) for `ms`. */
function holdLoop (ms: number): void {
  const until = Date.now() + ms
  while (Date.now() < until) { /* busy on purpose */ }
}

async function run (t: Test, gw: RunningGateway, leaseMs: number): Promise<HeldStream[]> {
  const streams: HeldStream[] = []
  for (let i = 0; i < SESSIONS; i++) streams.push(await holdGet(gw, await open(gw, '2025-11-25')))
  t.teardown(() => { for (const s of streams) s.res.destroy() })
  // One pass with every stream open, so each lease was renewed at least once before the hold.
  const before = await leasePasses(gw)
  await eventually('a lease pass', async () => await leasePasses(gw) > before ? true : undefined, 30_000)
  holdLoop(leaseMs + 1000)
  // Two passes after the hold: the first finds every lease lapsed, the second renews what it took.
  const after = await leasePasses(gw)
  await eventually('two lease passes after the hold', async () => await leasePasses(gw) >= after + 2 ? true : undefined, 30_000)
  const ended = streams.filter(s => s.ended)
  t.equal(ended.length, 0, `no stream ended by the gateway (${ended.length} of ${SESSIONS} ended${ended[0] !== undefined ? `; the first got ${JSON.stringify(ended[0].body.slice(-80))}` : ''})`)
  t.notOk(streams.some(s => s.body.includes('retry:') && s.body.lastIndexOf('retry:') > s.body.indexOf('data:')), 'no stream was told to reconnect')
  // The sessions still answer, and a second GET is still refused: the stream is held.
  const again = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': streams[0]!.session.sid, 'mcp-protocol-version': '2025-11-25' } })
  t.equal(again.status, 409, 'a second GET stream is refused: the first is still held')
  await again.body?.cancel()
  return streams
}

t.test('memory mode: an event loop held past the holder lease ends no idle stream', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 }) } })
  // One process, no Redis: the lease is the built-in 10 s.
  await run(t, gw, 10_000)
})

t.test('Redis mode: a lapsed holder lease nobody took is claimed back, not the stream ended', async t => {
  const redis = await startRedis(t)
  const prefix = randomPrefix()
  const leaseMs = 500
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 }) }, redis: { url: redis.url, keyPrefix: prefix, leaseMs } })
  const streams = await run(t, gw, leaseMs)
  const inspect = await testRedis(t, redis.url)
  const holders = await Promise.all(streams.map(async s => await inspect.get(sessionKeys(prefix, s.session.sid).holder('get'))))
  t.ok(holders[0] !== null && holders.every(h => h === holders[0]), `every GET stream's holder lease names this replica again (${String(holders[0])})`)
})
