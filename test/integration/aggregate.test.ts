// Aggregate servers (docs/behaviour.md, "Aggregating servers"): one endpoint in front of several
// servers. Driven by the official SDK client (v1) over real sockets against a gateway in memory
// mode; the members are real stdio servers (the full-server fixture, dedicated and pooled, and ones
// that die or never answer).
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import {
  CreateMessageRequestSchema, LoggingMessageNotificationSchema, McpError, ToolListChangedNotificationSchema
} from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { bearer, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { fixture, startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

async function connect (t: Test, gw: RunningGateway, server = 'agg', headers: Record<string, string> = {}, legacy = false): Promise<Client> {
  const client = new Client({ name: 'agg-test', version: '1' }, { capabilities: { sampling: {} } })
  client.setRequestHandler(CreateMessageRequestSchema, async req => ({
    role: 'assistant', model: 'm', content: { type: 'text', text: `sampled ${(req.params.messages[0]?.content as { text?: string }).text ?? ''}` }
  }))
  const url = new URL(`${gw.url}/${legacy ? 'sse' : 'mcp'}/${server}`)
  await client.connect(legacy ? new SSEClientTransport(url, { requestInit: { headers } }) : new StreamableHTTPClientTransport(url, { requestInit: { headers } }))
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}

async function settle<T> (p: Promise<T>): Promise<{ value?: T, error?: unknown }> {
  try { return { value: await p } } catch (error) { return { error } }
}

const full = stdioFixture('full-server')

t.test('one endpoint, two members: names, routing, and what the gateway answers itself', async t => {
  const gw = await startGateway(t, {
    servers: {
      full,
      other: full,
      agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'other' }] }
    }
  })
  const client = await connect(t, gw)
  t.match(client.getServerVersion(), { name: 'agg' }, 'the aggregate\'s own serverInfo')
  t.match(client.getServerCapabilities(), { tools: { listChanged: true }, prompts: { listChanged: true }, resources: { subscribe: true }, logging: {}, completions: {} }, 'the union of the members\' capabilities')

  const { tools } = await client.listTools()
  const names = tools.map(tool => tool.name)
  t.ok(names.includes('echo') && names.includes('other__echo'), 'the first member\'s names pass through, the second\'s are prefixed')
  t.equal(names.indexOf('echo') < names.indexOf('other__echo'), true, 'members in their order')
  t.equal(new Set(names).size, names.length, 'every name once')
  t.match(tools.find(tool => tool.name === 'other__echo'), { description: 'Returns its text argument', _meta: { 'io.mcp-gateway/member': 'other' } }, 'descriptions pass through; _meta names the member')

  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'one' } })), 'one')
  t.equal(textOf(await client.callTool({ name: 'other__echo', arguments: { text: 'two' } })), 'two')
  const pids = [textOf(await client.callTool({ name: 'pid', arguments: {} })), textOf(await client.callTool({ name: 'other__pid', arguments: {} }))]
  t.not(pids[0], pids[1], 'each name reaches its own member')
  // A name nobody listed goes to the member whose names pass through, which answers as it would directly.
  const unlisted = await client.callTool({ name: 'nope', arguments: {} })
  t.equal(unlisted.isError, true, 'an unlisted name reaches the prefix-less member, whose own answer comes back')

  const prompts = (await client.listPrompts()).prompts.map(p => p.name)
  t.ok(prompts.some(p => p.startsWith('other__')), 'prompts are prefixed too')
  t.ok(prompts.includes('greet') && prompts.includes('other__greet'))
  const prompt = await client.getPrompt({ name: 'other__greet', arguments: { name: 'Ann' } })
  t.match(prompt.messages[0]?.content, { type: 'text', text: 'Hello, Ann!' }, 'prompts/get is routed by exposed name')
  const promptCompletion = await client.complete({ ref: { type: 'ref/prompt', name: 'other__greet' }, argument: { name: 'name', value: 'A' } })
  t.ok(promptCompletion.completion.values.length > 0, 'completion of a prompt argument by its exposed name')

  const read = await client.readResource({ uri: 'test://static' })
  t.equal((read.contents[0] as { text?: string }).text, 'static text content', 'resources/read by URI')
  const item = await client.readResource({ uri: 'test://items/42' })
  t.match((item.contents[0] as { text?: string }).text, /"id":"42"/, 'a templated URI reaches the member whose template matches')
  const missing = await settle(client.readResource({ uri: 'nowhere://x' }))
  t.equal((missing.error as McpError | undefined)?.code, -32002, 'an unknown URI: resource not found')

  const progress: number[] = []
  const done = await client.callTool({ name: 'other__progress', arguments: { steps: 3 } }, undefined, { onprogress: p => { progress.push(p.progress) } })
  t.equal(textOf(done), 'done 3 steps')
  t.same(progress, [1, 2, 3], 'progress comes back to the client\'s token')
  t.equal(textOf(await client.callTool({ name: 'other__sample', arguments: { prompt: 'hi' } })), 'sampled hi', 'a member\'s sampling request reaches the client and its answer the member')

  const logs: Array<{ logger?: string, data: unknown }> = []
  client.setNotificationHandler(LoggingMessageNotificationSchema, n => { logs.push({ logger: n.params.logger, data: n.params.data }) })
  await client.setLoggingLevel('debug')
  await client.callTool({ name: 'other__log', arguments: { count: 1, level: 'info' } })
  await eventually('the member\'s log', () => logs.length > 0 ? true : undefined)
  t.match(logs[0], { logger: 'other/full-server', data: 'log 1 of 1' }, 'a log says which member it comes from')
  await client.ping()
  t.pass('ping is answered')

  const completion = await client.complete({ ref: { type: 'ref/resource', uri: 'test://items/{id}' }, argument: { name: 'id', value: '4' } })
  t.same(completion.completion.values, ['42'], 'completion/complete by its ref')

  const metrics = await (await fetch(`${gw.url}/metrics`)).text()
  const count = (server: string, tool: string): boolean => metrics.split('\n').some(l => l.startsWith('mcp_server_operation_duration_seconds_count{') && l.includes(`server="${server}"`) && l.includes(`gen_ai_tool_name="${tool}"`) && !l.endsWith(' 0'))
  t.ok(count('agg', 'other__echo'), 'a call is counted under the aggregate, with its exposed name')
  t.ok(count('other', 'echo'), 'and under its member, with the member\'s own name')
})

t.test('collisions: both stay callable under distinct names, the same every time', async t => {
  const gw = await startGateway(t, {
    servers: { full, dup: full, agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'dup', prefix: '' }] } }
  })
  const client = await connect(t, gw)
  const names = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(names.includes('echo') && names.includes('echo__dup'), 'the later member\'s echo is exposed as echo__dup')
  t.not(textOf(await client.callTool({ name: 'pid', arguments: {} })), textOf(await client.callTool({ name: 'pid__dup', arguments: {} })), 'and reaches the other member')
  const again = await connect(t, gw)
  t.same((await again.listTools()).tools.map(tool => tool.name), names, 'another session gets the same names')
})

t.test('long names are shortened within 64 characters and stay callable; list_changed reaches the client', async t => {
  const gw = await startGateway(t, {
    servers: { full, agg: { transport: 'aggregate', members: [{ server: 'full', prefix: 'a-long-prefix-for-this-member0' }] } }
  })
  const client = await connect(t, gw)
  let changed = 0
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { changed++ })
  const longName = `tool_${'x'.repeat(50)}`
  await client.callTool({ name: 'a-long-prefix-for-this-member0__add-tool', arguments: { name: longName } })
  await eventually('tools/list_changed', () => changed > 0 ? true : undefined)
  const names = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(names.every(n => n.length <= 64), 'every exposed name fits 64 characters')
  const exposed = names.find(n => n.startsWith('a-long-prefix-for-this-member0__tool_x')) as string
  t.ok(exposed !== undefined && /-[0-9a-f]{8}$/.test(exposed), `the long one is shortened with a digest (${exposed})`)
  t.equal(textOf(await client.callTool({ name: exposed, arguments: {} })), `${longName} called`, 'and calls the member\'s tool')
  await new Promise(resolve => setTimeout(resolve, 200))
  t.equal(changed, 1, 'list_changed once')
  const unknown = await settle(client.callTool({ name: 'nope', arguments: {} }))
  t.equal((unknown.error as McpError | undefined)?.code, -32602, 'a name no member can have is the spec\'s unknown tool, from the gateway')
  t.match((unknown.error as McpError | undefined)?.message, /Unknown tool: nope/)
  const unlisted = await client.callTool({ name: 'a-long-prefix-for-this-member0__nope', arguments: {} })
  t.equal(unlisted.isError, true, 'an unlisted name with a member\'s prefix reaches that member')
})

t.test('a member that is down is left out; its return brings its tools back with list_changed', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-agg-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const flag = join(dir, 'up')
  // Exits at once until the flag file exists, then runs the full-server fixture.
  const script = `const fs=require('fs');if(!fs.existsSync(${JSON.stringify(flag)}))process.exit(1);import(${JSON.stringify(`file://${fixture('full-server')}`)})`
  const gw = await startGateway(t, {
    servers: {
      full,
      flaky: { transport: 'stdio', command: process.execPath, args: ['-e', script], restart: { maxRestarts: 0 } },
      silent: stdioFixture('hostile-silent'),
      // A silent member is told from a slow one only by the start deadline: 10 s here, not 30.
      agg: { transport: 'aggregate', memberTimeoutMs: 4000, memberStartTimeoutMs: 10_000, members: [{ server: 'full', prefix: '' }, { server: 'flaky' }, { server: 'silent' }] }
    }
  })
  const client = await connect(t, gw)
  let changed = 0
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => { changed++ })
  const before = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(before.includes('echo'), 'the live member is listed')
  t.notOk(before.some(n => n.startsWith('flaky__') || n.startsWith('silent__')), 'the dead and the silent members are left out')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'still' } })), 'still', 'the aggregate works')
  const metrics = await (await fetch(`${gw.url}/metrics`)).text()
  t.match(metrics, /mcpgw_aggregate_member_left_out_total\{aggregate="agg",member="flaky",reason="down"\} [1-9]/, 'a metric counts it')
  await writeFile(flag, '1')
  await eventually('the member comes back', async () => changed > 0 && (await client.listTools()).tools.some(tool => tool.name === 'flaky__echo') ? true : undefined, 20_000, 200)
  t.equal(textOf(await client.callTool({ name: 'flaky__echo', arguments: { text: 'back' } })), 'back', 'its tools are callable again')
})

t.test('a pooled member, tenants\' tool policy on exposed names, and a legacy SSE client', async t => {
  const key = newKey('agg-bot')
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { agg: { tools: { allow: ['shared__*'], deny: ['shared__crash'] } } } } },
    servers: {
      full,
      shared: stdioFixture('full-server', [], { sessions: 'pooled' }),
      agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '', tools: { allow: ['echo'] } }, { server: 'shared' }] }
    }
  })
  const client = await connect(t, gw, 'agg', bearer(key.key))
  const names = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(names.length > 0 && names.every(n => n.startsWith('shared__') && n !== 'shared__crash'), `the tenant sees only what its policy allows (${names.length} tools)`)
  t.equal(textOf(await client.callTool({ name: 'shared__echo', arguments: { text: 'pooled' } })), 'pooled', 'a pooled member serves calls')
  t.equal(textOf(await client.callTool({ name: 'shared__sample', arguments: { prompt: 'p' } })), 'sampled p', 'and asks the client through its pool')
  const denied = await settle(client.callTool({ name: 'echo', arguments: { text: 'x' } }))
  t.equal((denied.error as McpError | undefined)?.code, -32602, 'a name outside the tenant\'s policy is an unknown tool')

  const legacy = await connect(t, gw, 'agg', bearer(key.key), true)
  t.equal(textOf(await legacy.callTool({ name: 'shared__echo', arguments: { text: 'over sse' } })), 'over sse', 'legacy HTTP+SSE sessions reach the aggregate too')
})

t.test('config: members must be configured servers, and an aggregate cannot be a member', async t => {
  const { parseConfig } = await import('../../src/config/load.js')
  t.throws(() => parseConfig({ servers: { agg: { transport: 'aggregate', members: [{ server: 'missing' }] } } }, {}), /members\/0\/server: names no configured server/)
  t.throws(() => parseConfig({ servers: { full: { transport: 'stdio', command: 'node' }, a: { transport: 'aggregate', members: [{ server: 'full' }] }, b: { transport: 'aggregate', members: [{ server: 'a' }] } } }, {}), /an aggregate cannot be a member/)
  t.throws(() => parseConfig({ servers: { full: { transport: 'stdio', command: 'node' }, a: { transport: 'aggregate', members: [{ server: 'full' }, { server: 'full' }] } } }, {}), /already a member/)
  const ok = parseConfig({ servers: { full: { transport: 'stdio', command: 'node' }, a: { transport: 'aggregate', members: [{ server: 'full' }] } } }, {})
  t.match(ok.servers.a, { separator: '__', memberTimeoutMs: 5000, maxSessions: 1000 }, 'defaults')
})

t.test('2026-07-28 requests to an aggregate: server/discover merged, lists and calls routed through the members\' pools', async t => {
  const gw = await startGateway(t, {
    servers: {
      full,
      shared: stdioFixture('full-server', [], { sessions: 'pooled' }),
      agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'shared' }] }
    }
  })
  const client = new ClientV2({ name: 'agg-modern', version: '1' }, { capabilities: { sampling: {} }, versionNegotiation: { mode: { pin: '2026-07-28' } } })
  client.setRequestHandler('sampling/createMessage', async () => ({ role: 'assistant', model: 'm', content: { type: 'text', text: 'modern sample' } }))
  await client.connect(new TransportV2(new URL(`${gw.url}/mcp/agg`)))
  t.teardown(async () => { await client.close().catch(() => {}) })
  t.match(client.getServerVersion(), { name: 'agg' }, 'server/discover answers as the aggregate')
  const names = (await client.listTools()).tools.map(tool => tool.name)
  t.ok(names.includes('echo') && names.includes('shared__echo'), 'the merged list')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'm1' } })), 'm1')
  t.equal(textOf(await client.callTool({ name: 'shared__echo', arguments: { text: 'm2' } })), 'm2')
  t.equal(textOf(await client.callTool({ name: 'shared__sample', arguments: { prompt: 'x' } })), 'modern sample', 'an input_required round through a member')
  const unlisted = await client.callTool({ name: 'shared__nope', arguments: {} }).then(r => r, (err: { code?: number }) => err)
  t.ok('isError' in unlisted ? unlisted.isError === true : (unlisted as { code?: number }).code === -32602, 'an unlisted name goes to its member, which refuses it')
  const read = await client.readResource({ uri: 'test://static' })
  t.equal((read.contents[0] as { text?: string }).text, 'static text content', 'resources by URI')
})

t.test('pagination over a merged list of more than a page; members\' per-tenant upstream env applies', async t => {
  const key = newKey('page-bot')
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys: [key.entry], servers: { agg: {}, full: { upstream: { env: { AGG_TENANT_MARK: 'acme' } } } } } },
    servers: { full, other: full, agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'other' }] } }
  })
  const client = await connect(t, gw, 'agg', bearer(key.key))
  t.ok((JSON.parse(textOf(await client.callTool({ name: 'env', arguments: {} }))) as string[]).includes('AGG_TENANT_MARK'), 'the member runs with the tenant\'s env for it')
  t.notOk((JSON.parse(textOf(await client.callTool({ name: 'other__env', arguments: {} }))) as string[]).includes('AGG_TENANT_MARK'), 'and only that member')
  for (let i = 0; i < 90; i++) await client.callTool({ name: 'other__add-tool', arguments: { name: `t${String(i).padStart(3, '0')}` } })
  const pages: string[][] = []
  let cursor: string | undefined
  do {
    const page = await client.listTools(cursor !== undefined ? { cursor } : {})
    pages.push(page.tools.map(tool => tool.name))
    cursor = page.nextCursor
  } while (cursor !== undefined && pages.length < 10)
  const all = pages.flat()
  t.ok(pages.length >= 2, `more than one page (${pages.map(p => p.length).join(' + ')})`)
  t.equal(pages[0]?.length, 100, 'a page holds 100')
  t.equal(new Set(all).size, all.length, 'no name on two pages')
  t.ok(all.includes('other__t089') && all.includes('echo'), 'every member\'s entries are on some page')
  const bad = await settle(client.listTools({ cursor: 'not-a-cursor' }))
  t.equal((bad.error as McpError | undefined)?.code, -32602, 'a cursor the gateway did not make is invalid params')
})

t.test('cancellation through an aggregate reaches the member running the call', async t => {
  const gw = await startGateway(t, {
    servers: { full, other: full, agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'other' }] } }
  })
  const client = await connect(t, gw)
  const controller = new AbortController()
  const slow = settle(client.callTool({ name: 'other__slow', arguments: { ms: 5000 } }, undefined, { signal: controller.signal }))
  await new Promise(resolve => setTimeout(resolve, 300))
  controller.abort('the user changed their mind')
  t.ok((await slow).error !== undefined, 'the client stops waiting')
  const seen = await eventually('the member saw the cancellation', async () => {
    const ids = JSON.parse(textOf(await client.callTool({ name: 'other__cancelled-requests', arguments: {} }))) as unknown[]
    return ids.length > 0 ? ids : undefined
  })
  t.equal(seen.length, 1, 'the member running it was told once')
  const untouched = JSON.parse(textOf(await client.callTool({ name: 'cancelled-requests', arguments: {} }))) as unknown[]
  t.same(untouched, [], 'the other member was not')
  t.equal(textOf(await client.callTool({ name: 'other__echo', arguments: { text: 'after' } })), 'after', 'and the session goes on')
})
