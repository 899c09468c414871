// Gateway core, seen by the official SDK client: every MCP method and notification passes
// through one gateway process (memory mode) to a real stdio backend and back, over real sockets,
// once with Streamable HTTP and once with legacy HTTP+SSE. Wire-level rules (status codes,
// headers, resumption) are test/http-streamable.test.ts; this file is about what a client sees.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { FetchLike, Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import {
  CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema, LoggingMessageNotificationSchema, McpError,
  PromptListChangedNotificationSchema, ResourceListChangedNotificationSchema, ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
  type ClientCapabilities, type JSONRPCMessage
} from '@modelcontextprotocol/sdk/types.js'
import { createParser } from 'eventsource-parser'
import t, { type Test } from 'tap'
import * as z from 'zod/v4'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { eventually, textOf } from '../helpers/wait.js'

type Kind = 'streamable' | 'sse'
const KINDS: Kind[] = ['streamable', 'sse']

// 1x1 PNG the full-server fixture returns as image content and as the test://binary blob.
const PNG_BASE64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII='
const FULL_CAPABILITIES: ClientCapabilities = { sampling: {}, elicitation: {}, roots: { listChanged: true } }

const everything = {
  transport: 'stdio',
  command: process.execPath,
  args: [fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url)), 'stdio']
}

/** One HTTP exchange the Streamable HTTP client made, with the JSON-RPC messages of its SSE body. */
interface Exchange {
  method: string
  body: unknown
  messages: Array<Record<string, unknown>>
}

/** A fetch that lets the SDK have the response and keeps a parsed copy of every SSE body. */
function recordingFetch (exchanges: Exchange[]): FetchLike {
  return async (url, init) => {
    const res = await fetch(url, init)
    const exchange: Exchange = {
      method: init?.method ?? 'GET',
      body: typeof init?.body === 'string' ? JSON.parse(init.body) as unknown : undefined,
      messages: []
    }
    exchanges.push(exchange)
    if (res.body === null || !(res.headers.get('content-type') ?? '').includes('text/event-stream')) return res
    const [mine, theirs] = res.body.tee()
    const parser = createParser({
      onEvent: e => { if (e.data !== '') exchange.messages.push(JSON.parse(e.data) as Record<string, unknown>) }
    })
    void (async () => {
      const decoder = new TextDecoder()
      try {
        for await (const chunk of mine) parser.feed(decoder.decode(chunk, { stream: true }))
      } catch { /* aborted with the client */ }
    })()
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers })
  }
}

interface Connected {
  client: Client
  transport: Transport
  /** Every JSON-RPC message the client's transport received after connect, in order. */
  inbound: JSONRPCMessage[]
  /** Every JSON-RPC message the client sent after connect, in order. */
  outbound: JSONRPCMessage[]
  /** Streamable HTTP only: the HTTP exchanges, SSE bodies parsed. */
  exchanges: Exchange[]
  /** Errors the SDK reported through onerror (unknown response ids among them). */
  errors: Error[]
}

interface ConnectOptions {
  server?: string
  capabilities?: ClientCapabilities
}

async function connect (t: Test, gw: RunningGateway, kind: Kind, options: ConnectOptions = {}): Promise<Connected> {
  const capabilities = options.capabilities ?? FULL_CAPABILITIES
  const client = new Client({ name: 'gateway-sdk-test', version: '1.0.0' }, { capabilities })
  if (capabilities.sampling !== undefined) {
    client.setRequestHandler(CreateMessageRequestSchema, async req => ({
      role: 'assistant', model: 'test-model', content: { type: 'text', text: `sampled: ${JSON.stringify(req.params.messages[0]?.content)}` }
    }))
  }
  if (capabilities.elicitation !== undefined) {
    client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { answer: 'yes' } }))
  }
  if (capabilities.roots !== undefined) {
    client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [{ uri: 'file:///tmp/root-a', name: 'a' }] }))
  }
  const server = options.server ?? 'full'
  const exchanges: Exchange[] = []
  const transport: Transport = kind === 'streamable'
    ? new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`), { fetch: recordingFetch(exchanges) })
    : new SSEClientTransport(new URL(`${gw.url}/sse/${server}`))
  const errors: Error[] = []
  client.onerror = err => { errors.push(err) }
  await client.connect(transport)
  t.teardown(async () => {
    // DELETE first: a Streamable HTTP session (and its child) outlives a closed client otherwise.
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {})
    await client.close().catch(() => {})
  })
  const inbound: JSONRPCMessage[] = []
  const outbound: JSONRPCMessage[] = []
  // Protocol installed its handlers in connect(); wrap them to see the wire messages.
  const onmessage = transport.onmessage
  transport.onmessage = (message, extra) => { inbound.push(message); onmessage?.(message, extra) }
  const send = transport.send.bind(transport)
  transport.send = async (message, opts) => { outbound.push(message); await send(message, opts) }
  return { client, transport, inbound, outbound, exchanges, errors }
}

const sleep = async (ms: number): Promise<void> => { await new Promise(resolve => setTimeout(resolve, ms)) }


/** Resolves with the first notification a handler is given (rejects after `ms`). */
function waitFor<T> (what: string, register: (resolve: (value: T) => void) => void, ms = 10_000): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms)
    register(value => { clearTimeout(timer); resolve(value) })
  })
}

const isResponseTo = (id: unknown) => (m: JSONRPCMessage): boolean => 'id' in m && m.id === id && !('method' in m)

for (const kind of KINDS) {
  t.test(`${kind}: the full-server backend through the gateway`, async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })

    t.test('initialize: serverInfo, capabilities and instructions come from the backend', async t => {
      const { client } = await connect(t, gw, kind)
      t.same(client.getServerVersion(), { name: 'full-server', version: '1.0.0' })
      t.match(client.getServerCapabilities(), {
        tools: { listChanged: true },
        resources: { subscribe: true, listChanged: true },
        prompts: { listChanged: true },
        completions: {},
        logging: {}
      })
      t.equal(client.getInstructions(), 'Test fixture for the mcp-gateway integration tests.')
    })

    t.test('tools: list and call (text, image, isError result, thrown JSON-RPC error)', async t => {
      const { client } = await connect(t, gw, kind)
      const { tools } = await client.listTools()
      const names = tools.map(tool => tool.name)
      for (const name of ['echo', 'add', 'image', 'progress', 'sample', 'slow', 'big']) t.ok(names.includes(name), `tools/list has ${name}`)
      t.match(tools.find(tool => tool.name === 'add')?.inputSchema, { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } } })

      t.equal(textOf(await client.callTool({ name: 'add', arguments: { a: 2, b: 40 } })), '42')
      const image = await client.callTool({ name: 'image', arguments: {} })
      t.same(image.content, [{ type: 'image', data: PNG_BASE64, mimeType: 'image/png' }], 'image content intact')

      const failed = await client.callTool({ name: 'fail', arguments: {} })
      t.equal(failed.isError, true, 'a tool error result passes as a result')
      t.equal(textOf(failed), 'this tool always fails')

      const thrown = await client.callTool({ name: 'throw', arguments: {} }).then(() => null, (err: unknown) => err)
      t.ok(thrown instanceof McpError, 'a JSON-RPC error surfaces as McpError')
      const mcpErr = thrown as McpError
      t.equal(mcpErr.code, -32603, "the backend's own code")
      t.match(mcpErr.message, /the throw tool always throws/)
      t.not((mcpErr.data as { source?: string } | undefined)?.source, 'gateway', 'not a gateway-made error')
    })

    t.test('resources: list, read text and blob, templates, subscribe/updated/unsubscribe', async t => {
      const { client } = await connect(t, gw, kind)
      const uris = (await client.listResources()).resources.map(r => r.uri)
      for (const uri of ['test://static', 'test://binary', 'test://counter']) t.ok(uris.includes(uri), `resources/list has ${uri}`)
      t.same((await client.readResource({ uri: 'test://static' })).contents,
        [{ uri: 'test://static', mimeType: 'text/plain', text: 'static text content' }])
      t.same((await client.readResource({ uri: 'test://binary' })).contents,
        [{ uri: 'test://binary', mimeType: 'image/png', blob: PNG_BASE64 }])
      const templates = (await client.listResourceTemplates()).resourceTemplates
      t.ok(templates.some(tpl => tpl.uriTemplate === 'test://items/{id}'), 'resources/templates/list has test://items/{id}')
      const item = (await client.readResource({ uri: 'test://items/42' })).contents[0] as { text: string }
      t.same(JSON.parse(item.text), { id: '42', name: 'item 42' }, 'a templated resource is read')

      const updates: string[] = []
      client.setNotificationHandler(ResourceUpdatedNotificationSchema, async n => { updates.push(n.params.uri) })
      await client.subscribeResource({ uri: 'test://counter' })
      const touched = JSON.parse(textOf(await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }))) as { subscribed: boolean }
      t.equal(touched.subscribed, true, 'the backend holds the subscription')
      await eventually('notifications/resources/updated', () => updates.length > 0 ? true : undefined)
      t.same(updates, ['test://counter'])

      await client.unsubscribeResource({ uri: 'test://counter' })
      const after = JSON.parse(textOf(await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }))) as { subscribed: boolean }
      t.equal(after.subscribed, false, 'the backend dropped the subscription')
      // A session-level notification sent after the touch travels the same stream: once it is
      // here, an updated notification sent before it would have been too.
      const barrier = waitFor<void>('tools/list_changed', resolve => client.setNotificationHandler(ToolListChangedNotificationSchema, async () => { resolve() }))
      await client.callTool({ name: 'add-tool', arguments: {} })
      await barrier
      t.same(updates, ['test://counter'], 'no update after unsubscribe')
      t.equal(((await client.readResource({ uri: 'test://counter' })).contents[0] as { text?: string }).text, '2')
    })

    t.test('prompts: list, get with arguments; completion/complete', async t => {
      const { client } = await connect(t, gw, kind)
      const { prompts } = await client.listPrompts()
      t.match(prompts.find(p => p.name === 'greet'), { name: 'greet', arguments: [{ name: 'name', required: true }] })
      const prompt = await client.getPrompt({ name: 'greet', arguments: { name: 'Zoë' } })
      t.same(prompt.messages, [{ role: 'user', content: { type: 'text', text: 'Hello, Zoë!' } }])
      const names = await client.complete({ ref: { type: 'ref/prompt', name: 'greet' }, argument: { name: 'name', value: 'A' } })
      t.same(names.completion.values, ['Alice', 'Alan', 'Ada'], 'prompt argument completion')
      const ids = await client.complete({ ref: { type: 'ref/resource', uri: 'test://items/{id}' }, argument: { name: 'id', value: '1' } })
      t.same(ids.completion.values, ['1', '10'], 'resource template completion')
    })

    t.test('logging/setLevel filters the log notifications the backend sends', async t => {
      const { client } = await connect(t, gw, kind)
      const logs: Array<{ level: string, data: unknown }> = []
      client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push({ level: n.params.level, data: n.params.data }) })
      await client.setLoggingLevel('warning')
      t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 3, level: 'info' } })), 'sent 0 of 3', 'info is below warning')
      t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 2, level: 'error' } })), 'sent 2 of 2')
      await eventually('2 log messages', () => logs.length >= 2 ? true : undefined)
      t.same(logs, [{ level: 'error', data: 'log 1 of 2' }, { level: 'error', data: 'log 2 of 2' }], 'only the error logs, in order')
      await client.setLoggingLevel('debug')
      t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 1, level: 'debug' } })), 'sent 1 of 1')
      await eventually('the debug log message', () => logs.length >= 3 ? true : undefined)
      t.same(logs[2], { level: 'debug', data: 'log 1 of 1' })
    })

    t.test('progress: every step, in order, on the stream of the request', async t => {
      const { client, transport, inbound, exchanges } = await connect(t, gw, kind)
      // SDK client race (modelcontextprotocol/typescript-sdk#2580): notifications are dispatched a
      // microtask late but responses at once, so when the last progress notification and the
      // result arrive in one socket read (a loaded machine), the result retires the progress
      // handler first and onprogress misses steps. Handing responses over a macrotask later lets
      // the queued notifications through first; the wire order is checked separately below.
      const deliver = transport.onmessage
      transport.onmessage = (message, extra) => {
        if ('id' in message && !('method' in message)) setImmediate(() => { deliver?.(message, extra) })
        else deliver?.(message, extra)
      }
      const steps: Array<{ progress: number, total: number | undefined }> = []
      const result = await client.callTool({ name: 'progress', arguments: { steps: 5, delayMs: 20 } }, undefined, {
        onprogress: p => { steps.push({ progress: p.progress, total: p.total }) }
      })
      t.equal(textOf(result), 'done 5 steps')
      t.same(steps, [1, 2, 3, 4, 5].map(progress => ({ progress, total: 5 })), 'onprogress got every step, in order')
      const response = inbound.find(m => 'result' in m && textOf(m.result) === 'done 5 steps')
      const requestId = response !== undefined && 'id' in response ? response.id : undefined
      const wire = inbound.filter(m => ('method' in m && m.method === 'notifications/progress') || ('id' in m && m.id === requestId && !('method' in m)))
        .map(m => 'method' in m ? (m.params as { progress: number }).progress : 'result')
      t.same(wire, [1, 2, 3, 4, 5, 'result'], 'on the wire: every step, in order, then the result')
      if (kind === 'streamable') {
        const post = exchanges.find(e => e.method === 'POST' && (e.body as { params?: { name?: string } }).params?.name === 'progress')
        t.ok(post, 'the tools/call POST was recorded')
        const requestId = (post?.body as { id: unknown }).id
        const onStream = (post?.messages ?? []).map(m => m.method === 'notifications/progress' ? (m.params as { progress: number }).progress : m.id === requestId ? 'result' : m.method)
        t.same(onStream, [1, 2, 3, 4, 5, 'result'], 'progress and result on the POST response stream, result last')
      }
    })

    t.test('server-to-client requests: sampling, elicitation, roots reach the client handlers', async t => {
      const { client } = await connect(t, gw, kind)
      t.equal(textOf(await client.callTool({ name: 'sample', arguments: { prompt: 'hello' } })), 'sampled: {"type":"text","text":"hello"}')
      t.same(JSON.parse(textOf(await client.callTool({ name: 'elicit', arguments: { message: 'ok?' } }))), { action: 'accept', content: { answer: 'yes' } })
      t.same(JSON.parse(textOf(await client.callTool({ name: 'roots', arguments: {} }))), [{ uri: 'file:///tmp/root-a', name: 'a' }])
    })

    t.test('a server-to-client request the client did not declare is refused; the client never sees it', async t => {
      const { client, inbound } = await connect(t, gw, kind, { capabilities: {} })
      const result = await client.callTool({ name: 'sample', arguments: { prompt: 'hello' } })
      t.equal(result.isError, true, 'the backend got an error and its tool reports it')
      t.match(textOf(result), /-32601.*Client does not support sampling\/createMessage/)
      const roots = await client.callTool({ name: 'roots', arguments: {} })
      t.equal(roots.isError, true, 'roots/list refused as well')
      t.notOk(inbound.some(m => 'method' in m && (m.method === 'sampling/createMessage' || m.method === 'roots/list')), 'no server-to-client request reached the client')
    })

    t.test('list_changed notifications (tools, prompts, resources) reach the client handlers', async t => {
      const { client } = await connect(t, gw, kind)
      const tools = waitFor<void>('tools/list_changed', resolve => client.setNotificationHandler(ToolListChangedNotificationSchema, async () => { resolve() }))
      const prompts = waitFor<void>('prompts/list_changed', resolve => client.setNotificationHandler(PromptListChangedNotificationSchema, async () => { resolve() }))
      const resources = waitFor<void>('resources/list_changed', resolve => client.setNotificationHandler(ResourceListChangedNotificationSchema, async () => { resolve() }))
      const toolName = textOf(await client.callTool({ name: 'add-tool', arguments: { name: 'fresh-tool' } }))
      await tools
      t.ok((await client.listTools()).tools.some(tool => tool.name === toolName), 'the new tool is listed')
      t.equal(textOf(await client.callTool({ name: 'fresh-tool', arguments: {} })), 'fresh-tool called')
      await client.callTool({ name: 'add-prompt', arguments: { name: 'fresh-prompt' } })
      await prompts
      t.ok((await client.listPrompts()).prompts.some(p => p.name === 'fresh-prompt'), 'the new prompt is listed')
      await client.callTool({ name: 'add-resource', arguments: { uri: 'test://fresh' } })
      await resources
      t.ok((await client.listResources()).resources.some(r => r.uri === 'test://fresh'), 'the new resource is listed')
    })

    t.test('cancellation: the backend sees notifications/cancelled and no result arrives', async t => {
      const { client, transport, inbound, outbound, errors } = await connect(t, gw, kind)
      // Abort only once the gateway has taken the request (the POST answered): from there on it
      // is on its way down the child's stdin, ahead of any cancellation.
      let sent: Promise<void> | undefined
      const send = transport.send.bind(transport)
      transport.send = async (message, opts) => {
        const sending = send(message, opts)
        if ('method' in message && message.method === 'tools/call') sent = sending
        await sending
      }
      const ac = new AbortController()
      const started = Date.now()
      const slow = client.callTool({ name: 'slow', arguments: { ms: 1500 } }, undefined, { signal: ac.signal })
      await (await eventually('the call to be sent', () => sent === undefined ? undefined : { sent })).sent
      await sleep(50)
      ac.abort('test cancels')
      await t.rejects(slow, 'the call rejects on abort')
      const request = outbound.find(m => 'method' in m && m.method === 'tools/call' && (m.params as { name?: string }).name === 'slow')
      const cancel = outbound.find(m => 'method' in m && m.method === 'notifications/cancelled')
      t.ok(request !== undefined && 'id' in request, 'the call was sent')
      const requestId = request !== undefined && 'id' in request ? request.id : undefined
      t.match(cancel, { params: { requestId } }, 'the client sent notifications/cancelled for it')
      const cancelled = await eventually('the backend to record the cancellation', async () => {
        const list = JSON.parse(textOf(await client.callTool({ name: 'cancelled-requests', arguments: {} }))) as unknown[]
        return list.length > 0 ? list : undefined
      })
      t.equal(cancelled.length, 1, 'the backend saw exactly one cancellation')
      await sleep(Math.max(0, started + 1800 - Date.now())) // past the time the tool would have answered
      t.notOk(inbound.some(isResponseTo(requestId)), 'no response for the cancelled request')
      t.notOk(errors.some(e => /unknown message ID/.test(e.message)), 'no stray response reached the client')
    })

    t.test('a method the gateway does not know passes through; the backend error comes back unchanged', async t => {
      const { client, inbound, outbound } = await connect(t, gw, kind)
      const err = await client.request({ method: 'x-custom/echo', params: { hello: 'world' } }, z.object({}).passthrough(), { timeout: 10_000 })
        .then(() => null, (e: unknown) => e)
      t.ok(err instanceof McpError)
      t.equal((err as McpError).code, -32601)
      const request = outbound.find(m => 'method' in m && m.method === 'x-custom/echo')
      const id = request !== undefined && 'id' in request ? request.id : undefined
      t.same(inbound.find(isResponseTo(id)), { jsonrpc: '2.0', id, error: { code: -32601, message: 'Method not found' } },
        "the backend's -32601, with the client's id, nothing added")
    })

    t.test('a tool argument with newlines and unicode round-trips', async t => {
      const { client } = await connect(t, gw, kind)
      const text = 'line one\nline two\r\n\ttabbed "quoted" \\ back\u2028sep\u2029 ünïcødé 日本語 🚀 \u0000 end'
      t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text } })), text)
    })

    t.test('a 2 MB result arrives intact', async t => {
      const { client } = await connect(t, gw, kind)
      const bytes = 2 * 1024 * 1024
      const text = textOf(await client.callTool({ name: 'big', arguments: { bytes } }))
      t.equal(text.length, bytes)
      t.ok(text === 'x'.repeat(bytes), 'every byte is there')
    })

    t.test('two sessions using the same request ids never see each other\'s results', async t => {
      const [a, b] = await Promise.all([connect(t, gw, kind), connect(t, gw, kind)])
      const calls = Array.from({ length: 8 }, (_, i) => [
        a.client.callTool({ name: 'echo', arguments: { text: `a-${i}` } }),
        b.client.callTool({ name: 'echo', arguments: { text: `b-${i}` } })
      ]).flat()
      const texts = (await Promise.all(calls)).map(textOf)
      t.same(texts, Array.from({ length: 8 }, (_, i) => [`a-${i}`, `b-${i}`]).flat())
      const idsOf = (c: Connected): unknown[] => c.outbound.filter(m => 'method' in m && 'id' in m).map(m => (m as { id: unknown }).id)
      const shared = idsOf(a).filter(id => idsOf(b).includes(id))
      t.ok(shared.length >= 8, `the sessions really used the same ids (${shared.length} shared)`)
    })

    t.test('20 concurrent calls on one session each get their own result', async t => {
      const { client } = await connect(t, gw, kind)
      // Later calls sleep less, so the answers come back in the reverse order of the requests.
      const results = await Promise.all(Array.from({ length: 20 }, async (_, i) =>
        textOf(await client.callTool({ name: 'slow', arguments: { ms: (19 - i) * 15 } }))))
      t.same(results, Array.from({ length: 20 }, (_, i) => `slept ${(19 - i) * 15} ms`))
    })
  })

  t.test(`${kind}: server-everything through the gateway`, async t => {
    const gw = await startGateway(t, { servers: { everything } })
    const { client } = await connect(t, gw, kind, { server: 'everything' })
    t.match(client.getServerVersion(), { name: /everything/i })
    const names = (await client.listTools()).tools.map(tool => tool.name)
    t.ok(names.includes('echo') && names.includes('get-sum'), 'echo and get-sum are listed')
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'hi there' } })), 'Echo: hi there')
    t.match(textOf(await client.callTool({ name: 'get-sum', arguments: { a: 19, b: 23 } })), /\b42\b/)
  })
}
