// A cold gateway under load: an aggregate's dedicated member whose child takes longer than
// memberTimeoutMs to initialise is still starting, not down. Twenty concurrent SDK sessions (v1)
// over real sockets; the member is the full-server fixture told to answer nothing for a while
// (--start-delay), as a child on a loaded machine does.
import { Writable } from 'node:stream'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { textOf } from '../helpers/wait.js'

const SESSIONS = Number(process.env.COLD_SESSIONS ?? 20)
const LONG_MS = 300_000

/** A gateway whose log lines are kept (parsed) for the test to read. */
async function loggedGateway (t: Test, raw: Record<string, unknown>): Promise<{ gw: RunningGateway, lines: Array<Record<string, unknown>> }> {
  const lines: Array<Record<string, unknown>> = []
  const sink = new Writable({
    write (chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      done()
    }
  })
  const gw = await startGateway(t, { ...raw, log: { level: 'info' } }, { log: pino({ level: 'info' }, sink) })
  return { gw, lines }
}

async function session (t: Test, gw: RunningGateway, i: number): Promise<Client> {
  const client = new Client({ name: `cold-${i}`, version: '1' })
  // A loaded machine (the point here) may take more than the SDK's 60 s default.
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/agg`)), { timeout: LONG_MS })
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

t.test('twenty concurrent sessions on a cold aggregate: a member still starting delays the first list, it does not vanish from it', async t => {
  const { gw } = await loggedGateway(t, {
    servers: {
      // Forty children starting at once on two loaded cores may take longer than the members' own
      // 60 s request deadline to answer initialize: that deadline bounds a start too.
      quick: stdioFixture('full-server', [], { requestTimeoutMs: 240_000 }),
      slow: stdioFixture('full-server', ['--start-delay', '2500'], { requestTimeoutMs: 240_000 }),
      agg: { transport: 'aggregate', memberTimeoutMs: 1000, memberStartTimeoutMs: 240_000, members: [{ server: 'quick' }, { server: 'slow' }] }
    }
  })
  const clients = await Promise.all(Array.from({ length: SESSIONS }, async (_, i) => await session(t, gw, i)))
  const lists = await Promise.all(clients.map(async c => (await c.listTools(undefined, { timeout: LONG_MS })).tools.map(tool => tool.name)))
  const missing = lists.filter(names => !names.includes('slow__echo') || !names.includes('quick__echo')).length
  t.equal(missing, 0, 'every first tools/list has both members')
  t.match(clients[0]?.getServerCapabilities(), { prompts: {}, resources: {} }, 'and initialize answered with what the members have')
  const answers = await Promise.all(clients.map(async (c, i) => textOf(await c.callTool({ name: 'slow__echo', arguments: { text: `s${i}` } }, undefined, { timeout: LONG_MS }))))
  t.same(answers, clients.map((_, i) => `s${i}`), 'the slow member serves every session')
})

t.test('a member that fails its first start is logged once, as down; a retry failing again is not logged again', async t => {
  const { gw, lines } = await loggedGateway(t, {
    servers: {
      quick: stdioFixture('full-server'),
      broken: { transport: 'stdio', command: process.execPath, args: ['-e', 'process.exit(2)'], restart: { maxRestarts: 0 } },
      agg: { transport: 'aggregate', memberTimeoutMs: 1000, memberStartTimeoutMs: 60_000, members: [{ server: 'quick' }, { server: 'broken' }] }
    }
  })
  const clients = await Promise.all([0, 1, 2].map(async i => await session(t, gw, i)))
  const lists = await Promise.all(clients.map(async c => (await c.listTools()).tools.map(tool => tool.name)))
  t.ok(lists.every(names => names.includes('quick__echo') && !names.some(n => n.startsWith('broken__'))), `the broken member is left out (${JSON.stringify(lists.map(l => l.length))})`)
  // Past a retry (every 5 s) that fails again.
  await new Promise(resolve => setTimeout(resolve, 6500))
  const down = lines.filter(l => l.msg === 'aggregate member is down: left out of lists, its calls fail at once' && l.member === 'broken')
  t.equal(down.length, 3, 'one warning per session whose member fell, its first start included')
  t.ok(down.every(l => l.level === 40), 'at warn')
})
