// A pool's `list_changed` reaches the sessions only when the list really changed. server-everything
// registers tools after `initialized`, so each new pooled child announces a change of a list that
// is the same as every other child's: a burst that opens children must not make every session of
// the server re-list. Real SDK clients (v1) over real sockets; real stdio children.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

const everything = {
  transport: 'stdio',
  command: process.execPath,
  args: [fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url)), 'stdio']
}

interface Listening { client: Client, changed: number }

async function listening (t: Test, gw: RunningGateway, server: string, count: number): Promise<Listening[]> {
  const sessions = await Promise.all(Array.from({ length: count }, async (_, i) => {
    const session: Listening = { client: new Client({ name: `idle-${i}`, version: '1' }), changed: 0 }
    session.client.setNotificationHandler(ToolListChangedNotificationSchema, () => { session.changed++ })
    await session.client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`)))
    t.teardown(async () => { await session.client.close().catch(() => {}) })
    return session
  }))
  // The SDK opens its GET stream after initialize: wait until the gateway holds them all.
  await eventually(`${count} GET streams`, async () => {
    const text = await (await fetch(`${gw.url}/metrics`)).text()
    return new RegExp(`mcpgw_client_streams_open\\{stream="get"\\} ${count}\\b`).test(text) ? true : undefined
  })
  return sessions
}

async function pooledChildren (gw: RunningGateway, server: string): Promise<number> {
  const text = await (await fetch(`${gw.url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith('mcpgw_backend_children_by_mode{') && l.includes(`server="${server}"`) && l.includes('mode="pooled"'))
  return Number(line?.split(' ').pop() ?? NaN)
}

t.test('server-everything pooled: a burst that opens new children sends no list_changed to idle sessions', async t => {
  const gw = await startGateway(t, { servers: { everything: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 4, poolWaitMs: 30_000 } } })
  const idle = await listening(t, gw, 'everything', 4)
  const tools = (await idle[0]?.client.listTools())?.tools.map(tool => tool.name) ?? []
  t.ok(tools.includes('trigger-sampling-request'), 'the first child\'s list has the tools registered after initialized')
  // Settle: whatever the first child announced after initialized has been seen (or not) by now.
  await new Promise(resolve => setTimeout(resolve, 500))
  const before = idle.map(s => s.changed)

  const burst = new Client({ name: 'burst', version: '1' })
  await burst.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/everything`)))
  t.teardown(async () => { await burst.close().catch(() => {}) })
  const answers = await Promise.all([0, 1, 2, 3].map(async () => textOf(await burst.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 2 } }))))
  t.ok(answers.every(a => a.includes('completed')), 'four concurrent long calls answered')
  t.ok(await pooledChildren(gw, 'everything') >= 3, 'the burst opened new children')
  // Their announcements arrive right after their initialize: give them time to (not) arrive.
  await new Promise(resolve => setTimeout(resolve, 1000))
  t.same(idle.map(s => s.changed), before, 'no idle session was told the tool list changed')
  t.same(before, [0, 0, 0, 0], 'nor by the first child')
})

t.test('a list that really changes is still announced, once per change, on every child', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 3 }) } })
  const idle = await listening(t, gw, 'full', 3)
  const actor = idle[0]?.client as Client
  await actor.callTool({ name: 'add-tool', arguments: { name: 'fresh-one' } })
  await eventually('every session heard the change', () => idle.every(s => s.changed === 1) ? true : undefined)
  // The next change lands on another child of the pool (three at once open more children).
  await Promise.all([0, 1, 2].map(async () => await actor.callTool({ name: 'slow', arguments: { ms: 300 } })))
  const texts = await Promise.all(['fresh-two', 'fresh-three'].map(async name => textOf(await actor.callTool({ name: 'add-tool', arguments: { name } }))))
  t.equal(texts.length, 2)
  await eventually('every session heard the later changes', () => idle.every(s => s.changed >= 2) ? true : undefined)
  await new Promise(resolve => setTimeout(resolve, 300))
  t.ok(idle.every(s => s.changed <= 3), `at most one announcement per change (${idle.map(s => s.changed).join(',')})`)
})
