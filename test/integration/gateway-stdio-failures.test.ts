// Gateway core against hostile stdio backends (docs/spec-rules.md §7):
// crashes and restarts, the restart cap, backends that never answer, garbage and chatter on the
// pipes, over-long lines, idle reaping, graceful shutdown (in this process and as a real
// process on SIGTERM), config errors at boot, and the per-server session limit. One gateway
// process, memory mode, real child processes, the official SDK client or raw fetch where the
// wire (status codes, SSE retry hints) is the point.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import { LoggingMessageNotificationSchema, McpError } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { startGateway, stdioFixture, type RunningGateway } from '../helpers/gateway.js'
import { startReplica } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'
import { reap } from '../helpers/reaper.js'

type Kind = 'streamable' | 'sse'
const ACCEPT = 'application/json, text/event-stream'
const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url))
/** Quick restarts, so tests do not wait out the production backoff. */
const FAST_RESTART = { baseDelayMs: 20, maxDelayMs: 100 }

async function connect (t: Test, url: string, server: string, kind: Kind = 'streamable', attempt = 1): Promise<{ client: Client, transport: Transport, errors: Error[] }> {
  const client = new Client({ name: 'failures-test', version: '1.0.0' }, { capabilities: {} })
  const transport: Transport = kind === 'streamable'
    ? new StreamableHTTPClientTransport(new URL(`${url}/mcp/${server}`), { reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 } })
    : new SSEClientTransport(new URL(`${url}/sse/${server}`))
  const errors: Error[] = []
  client.onerror = err => { errors.push(err) }
  t.teardown(async () => {
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {})
    await client.close().catch(() => {})
  })
  try {
    await client.connect(transport)
  } catch (err) {
    // A short requestTimeoutMs also bounds initialize, which waits for the child to start: on a
    // loaded machine that can take longer. Try again on a new session rather than flake.
    if (!(err instanceof McpError && err.code === -32006) || attempt >= 3) throw err
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {})
    await client.close().catch(() => {})
    return await connect(t, url, server, kind, attempt + 1)
  }
  return { client, transport, errors }
}

const sleep = async (ms: number): Promise<void> => { await new Promise(resolve => setTimeout(resolve, ms)) }


function alive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false
    throw err
  }
}

/** Settles a promise into its value or its error, with how long it took. */
async function settle<T> (promise: Promise<T>): Promise<{ value?: T, error?: unknown, ms: number }> {
  const started = Date.now()
  try {
    return { value: await promise, ms: Date.now() - started }
  } catch (error) {
    return { error, ms: Date.now() - started }
  }
}

// ---- raw Streamable HTTP, for the tests that look at status codes and SSE framing -----------

async function post (url: string, server: string, body: unknown, sid?: string, signal?: AbortSignal): Promise<Response> {
  return await fetch(`${url}/mcp/${server}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT, ...(sid !== undefined ? { 'mcp-session-id': sid } : {}) },
    body: JSON.stringify(body),
    ...(signal !== undefined ? { signal } : {})
  })
}

/** initialize + notifications/initialized over raw HTTP; returns the session id. */
async function rawSession (url: string, server: string, version = '2025-11-25'): Promise<string> {
  const res = await post(url, server, { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  const sid = res.headers.get('mcp-session-id')
  if (res.status !== 200 || sid === null) throw new Error(`initialize got ${res.status}: ${await res.text()}`)
  await new SseReader(res).finished
  const ack = await post(url, server, { jsonrpc: '2.0', method: 'notifications/initialized' }, sid)
  if (ack.status !== 202) throw new Error(`notifications/initialized got ${ack.status}`)
  return sid
}

/** One tools/call over raw HTTP; returns the JSON-RPC response. */
async function rawCall (url: string, server: string, sid: string, id: number, name: string, args: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  const res = await post(url, server, { jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }, sid)
  if (res.status !== 200) throw new Error(`tools/call ${name} got ${res.status}: ${await res.text()}`)
  const reader = new SseReader(res)
  await reader.finished
  const answer = reader.messages().find(m => m.id === id)
  if (answer === undefined) throw new Error(`no answer to tools/call ${name}`)
  return answer
}

async function rawPid (url: string, server: string, sid: string): Promise<number> {
  return Number(textOf((await rawCall(url, server, sid, 900, 'pid')).result))
}

async function sdkPid (client: Client): Promise<number> {
  return Number(textOf(await client.callTool({ name: 'pid', arguments: {} })))
}

const listTools = { jsonrpc: '2.0', id: 77, method: 'tools/list' }

// ---- crashes and restarts ----------------------------------------------------------------

for (const kind of ['streamable', 'sse'] as const) {
  t.test(`${kind}: a child that crashes mid-call is restarted and re-initialised; the session goes on`, async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { requestTimeoutMs: 30_000, restart: FAST_RESTART }) } })
    const { client } = await connect(t, gw.url, 'full', kind)
    const logs: string[] = []
    client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push(String(n.params.data)) })
    const pid1 = await sdkPid(client)
    await client.setLoggingLevel('error')
    await client.subscribeResource({ uri: 'test://counter' })

    const crashed = await settle(client.callTool({ name: 'crash', arguments: {} }))
    t.ok(crashed.error instanceof McpError, 'the in-flight call gets a JSON-RPC error')
    t.equal((crashed.error as McpError).code, -32007, 'backend unavailable')
    t.match((crashed.error as McpError).data, { source: 'gateway' })
    t.ok(crashed.ms < 10_000, `it came at once, not at the 30 s request timeout (${crashed.ms} ms)`)
    await eventually('the crashed child to be gone', () => alive(pid1) ? undefined : true)

    const pid2 = await sdkPid(client)
    t.ok(pid2 > 0 && pid2 !== pid1, `a later call on the same session reaches a new child (${pid1} -> ${pid2})`)
    // The new child got the client's initialize and the session state the client had set.
    t.equal(textOf(await client.callTool({ name: 'log', arguments: { count: 2, level: 'info' } })), 'sent 0 of 2', 'logging/setLevel replayed')
    const touched = JSON.parse(textOf(await client.callTool({ name: 'touch-resource', arguments: { uri: 'test://counter' } }))) as { subscribed: boolean }
    t.equal(touched.subscribed, true, 'resources/subscribe replayed')
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'after' } })), 'after')
    t.same(logs, [], 'no log message got through the replayed level')
  })
}

t.test('restart cap: one crash too many ends the session; the next request gets 404', async t => {
  const gw = await startGateway(t, {
    servers: {
      never: stdioFixture('full-server', [], { restart: { ...FAST_RESTART, maxRestarts: 0 } }),
      once: stdioFixture('full-server', [], { restart: { ...FAST_RESTART, maxRestarts: 1 } })
    }
  })

  t.test('maxRestarts 0: the first crash ends the session', async t => {
    const { client, transport } = await connect(t, gw.url, 'never')
    const sid = (transport as StreamableHTTPClientTransport).sessionId ?? ''
    const pid = await sdkPid(client)
    const crashed = await settle(client.callTool({ name: 'crash', arguments: {} }))
    t.equal((crashed.error as McpError | undefined)?.code, -32007, 'the in-flight call fails')
    const res = await post(gw.url, 'never', listTools, sid)
    t.equal(res.status, 404, 'the session is gone')
    t.equal(((await res.json()) as { error: { code: number } }).error.code, -32001)
    const viaSdk = await settle(client.listTools())
    t.ok(viaSdk.error instanceof StreamableHTTPError, 'the SDK client sees an HTTP error')
    t.equal((viaSdk.error as StreamableHTTPError).code, 404)
    t.notOk(alive(pid), 'the child was not restarted')
  })

  t.test('maxRestarts 1: restarted once, gone on the second crash', async t => {
    const { client, transport } = await connect(t, gw.url, 'once')
    const sid = (transport as StreamableHTTPClientTransport).sessionId ?? ''
    const first = await settle(client.callTool({ name: 'crash', arguments: {} }))
    t.equal((first.error as McpError | undefined)?.code, -32007)
    t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: 'restarted' } })), 'restarted', 'one restart allowed')
    const second = await settle(client.callTool({ name: 'crash', arguments: {} }))
    t.equal((second.error as McpError | undefined)?.code, -32007)
    const res = await post(gw.url, 'once', listTools, sid)
    t.equal(res.status, 404, 'the session is gone')
    await res.body?.cancel()
  })

  t.test('a child that crashes on every call: the session ends instead of looping', async t => {
    // hostile-crash dies on its 3rd message: the first tools/call, and after every restart the
    // replayed initialize + initialized + the next call.
    const gw2 = await startGateway(t, { servers: { crashy: stdioFixture('hostile-crash', ['--after', '3'], { restart: { ...FAST_RESTART, maxRestarts: 2 } }) } })
    const { client, transport } = await connect(t, gw2.url, 'crashy')
    const sid = (transport as StreamableHTTPClientTransport).sessionId ?? ''
    let failures = 0
    for (let i = 0; i < 3; i++) {
      const call = await settle(client.callTool({ name: 'echo', arguments: { text: `try ${i}` } }))
      if ((call.error as McpError | undefined)?.code === -32007) failures++
    }
    t.equal(failures, 3, 'every call failed with backend unavailable')
    const res = await post(gw2.url, 'crashy', listTools, sid)
    t.equal(res.status, 404, 'after maxRestarts + 1 crashes the session is gone')
    await res.body?.cancel()
  })

  t.test('a child that crashes on every start (on initialize): the client is told, the session ends', async t => {
    const gw2 = await startGateway(t, { servers: { dead: stdioFixture('hostile-crash', ['--after', '1'], { restart: { ...FAST_RESTART, maxRestarts: 2 } }) } })
    const transport = new StreamableHTTPClientTransport(new URL(`${gw2.url}/mcp/dead`), { reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 } })
    const client = new Client({ name: 'failures-test', version: '1.0.0' }, { capabilities: {} })
    t.teardown(async () => { await client.close().catch(() => {}) })
    const connected = await settle(client.connect(transport))
    t.ok(connected.error instanceof McpError, 'initialize fails with a JSON-RPC error')
    t.equal((connected.error as McpError).code, -32007)
    const sid = transport.sessionId ?? ''
    t.ok(sid !== '', 'the gateway had created a session')
    // The supervisor keeps replaying initialize into new children until the cap, then gives up.
    const status = await eventually('the session to end', async () => {
      const res = await post(gw2.url, 'dead', listTools, sid)
      await res.body?.cancel()
      return res.status === 404 ? res.status : undefined
    })
    t.equal(status, 404, 'the session is gone once the restarts are spent')
  })
})

// ---- silence, garbage, chatter, huge lines -------------------------------------------------

t.test('a backend that never answers: -32006 after requestTimeoutMs, and the backend is told', async t => {
  const gw = await startGateway(t, {
    servers: {
      silent: stdioFixture('hostile-silent', [], { requestTimeoutMs: 500 }),
      // full-server can report the cancellations it saw; it gets a longer timeout so its
      // slower start (the SDK loads) never trips the initialize request (5 s did once, in a full
      // suite on a loaded machine).
      full: stdioFixture('full-server', [], { requestTimeoutMs: 10_000 })
    }
  })

  const silent = await connect(t, gw.url, 'silent')
  const call = await settle(silent.client.callTool({ name: 'echo', arguments: { text: 'anyone?' } }))
  t.ok(call.error instanceof McpError)
  t.equal((call.error as McpError).code, -32006, 'backend timeout')
  t.match((call.error as McpError).message, /did not answer within 500 ms/)
  t.ok(call.ms >= 450, `not before the deadline (${call.ms} ms)`)
  const again = await settle(silent.client.callTool({ name: 'echo', arguments: { text: 'still?' } }))
  t.equal((again.error as McpError | undefined)?.code, -32006, 'the session is still usable and times out again')

  const full = await connect(t, gw.url, 'full')
  const slow = await settle(full.client.callTool({ name: 'slow', arguments: { ms: 20_000 } }))
  t.equal((slow.error as McpError | undefined)?.code, -32006)
  const cancelled = await eventually('the backend to record the cancellation', async () => {
    const list = JSON.parse(textOf(await full.client.callTool({ name: 'cancelled-requests', arguments: {} }))) as unknown[]
    return list.length > 0 ? list : undefined
  })
  t.equal(cancelled.length, 1, 'the backend got notifications/cancelled for the timed-out request')
  t.equal(textOf(await full.client.callTool({ name: 'echo', arguments: { text: 'fine' } })), 'fine', 'and the session goes on')
})

t.test('garbage on stdout and chatty stderr do not stop calls from working', async t => {
  const gw = await startGateway(t, {
    servers: {
      garbage: stdioFixture('hostile-garbage'),
      chatty: stdioFixture('hostile-stderr', ['200'])
    }
  })
  const garbage = await connect(t, gw.url, 'garbage')
  const logs: string[] = []
  garbage.client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push(String(n.params.data)) })
  for (let i = 0; i < 5; i++) t.equal(textOf(await garbage.client.callTool({ name: 'echo', arguments: { text: `g${i}` } })), `g${i}`)
  t.ok((await garbage.client.listTools()).tools.some(tool => tool.name === 'echo'), 'tools/list works')
  // `batch` is answered as one JSON array line holding a log notification and the response.
  const batch = await garbage.client.callTool({ name: 'batch', arguments: {} })
  t.equal(batch.isError, true, 'the batched response arrived')
  await eventually('the batched notification', () => logs.length > 0 ? true : undefined)
  t.same(logs, ['from a batch'])

  const chatty = await connect(t, gw.url, 'chatty')
  const texts = await Promise.all(Array.from({ length: 10 }, async (_, i) => textOf(await chatty.client.callTool({ name: 'echo', arguments: { text: `c${i}` } }))))
  t.same(texts, Array.from({ length: 10 }, (_, i) => `c${i}`))
})

t.test('a line longer than maxLineBytes is dropped; later calls work and the gateway stays up', async t => {
  const gw = await startGateway(t, { servers: { huge: stdioFixture('hostile-huge', ['2000000'], { maxLineBytes: 1_048_576, requestTimeoutMs: 3000 }) } })
  const { client } = await connect(t, gw.url, 'huge')
  const huge = await settle(client.callTool({ name: 'huge', arguments: {} }))
  t.equal((huge.error as McpError | undefined)?.code, -32006, 'the dropped answer never arrives: the request times out')
  for (let i = 0; i < 3; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { text: `after ${i}` } })), `after ${i}`)
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'the gateway is up')
  const other = await connect(t, gw.url, 'huge')
  t.equal(textOf(await other.client.callTool({ name: 'echo', arguments: { text: 'new session' } })), 'new session')
})

// ---- idle reaping ----------------------------------------------------------------------------

t.test('idle timeout', async t => {
  const idleTimeoutMs = 1500

  t.test('a silent session is ended, its child stopped, and it answers 404', async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs } })
    const sid = await rawSession(gw.url, 'full')
    const pid = await rawPid(gw.url, 'full', sid)
    const started = Date.now()
    await eventually('the idle child to be stopped', () => alive(pid) ? undefined : true, idleTimeoutMs * 6)
    t.ok(Date.now() - started >= idleTimeoutMs - 200, `not reaped before the idle timeout (${Date.now() - started} ms)`)
    const res = await post(gw.url, 'full', listTools, sid)
    t.equal(res.status, 404, 'the idle session answers 404')
    await res.body?.cancel()
  })

  t.test('an open GET stream keeps its session; once it closes the session is reaped', async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs } })
    const sid = await rawSession(gw.url, 'full')
    const pid = await rawPid(gw.url, 'full', sid)
    const ac = new AbortController()
    t.teardown(() => { ac.abort() })
    const get = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal })
    t.equal(get.status, 200, 'GET stream open')
    const stream = new SseReader(get)
    await sleep(idleTimeoutMs * 3)
    t.ok(alive(pid), 'the child is alive after 3 idle timeouts')
    t.notOk(stream.done, 'the GET stream is still open')
    t.equal(Number(textOf((await rawCall(gw.url, 'full', sid, 5, 'pid')).result)), pid, 'the session still answers, same child')

    ac.abort()
    await eventually('the child to be stopped once the stream closed', () => alive(pid) ? undefined : true, idleTimeoutMs * 6)
    const after = await post(gw.url, 'full', listTools, sid)
    t.equal(after.status, 404, 'then it is reaped like any idle session')
    await after.body?.cancel()
  })

  // Regression: the memory event log restarted a silent stream's ids at 1 after it expired,
  // below the writer's cursor, so later entries were never sent.
  t.test('a call that lasts longer than idleTimeoutMs gets its result', async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs } })
    const { client } = await connect(t, gw.url, 'full')
    const ms = idleTimeoutMs * 2
    const call = await settle(client.callTool({ name: 'slow', arguments: { ms } }, undefined, { timeout: ms + 4000 }))
    t.equal(call.error, undefined, 'the call got its result')
    if (call.error === undefined) t.equal(textOf(call.value), `slept ${ms} ms`)
  })

  t.test('a GET stream silent for longer than idleTimeoutMs still gets the next notification', async t => {
    const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, sessions: { idleTimeoutMs } })
    const sid = await rawSession(gw.url, 'full')
    const ac = new AbortController()
    t.teardown(() => { ac.abort() })
    const stream = new SseReader(await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sid }, signal: ac.signal }))
    const listChanged = (): number => stream.messages().filter(m => m.method === 'notifications/tools/list_changed').length
    await rawCall(gw.url, 'full', sid, 1, 'add-tool')
    await stream.until(() => listChanged() === 1)
    await rawCall(gw.url, 'full', sid, 2, 'add-tool')
    await stream.until(() => listChanged() === 2)
    t.pass('two notifications arrived on the GET stream')
    await sleep(idleTimeoutMs * 2) // the session lives on (the stream holds it); its GET log goes quiet
    await rawCall(gw.url, 'full', sid, 3, 'add-tool')
    const third = await stream.until(() => listChanged() === 3, 5000).then(() => true, () => false)
    t.ok(third, 'the notification after the silence arrived')
  })
})

// ---- shutdown ----------------------------------------------------------------------------------

t.test('graceful shutdown: streams end with a retry hint, every child stops, close() resolves', async t => {
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') }, http: { retryMs: 1234 } })
  // 2025-06-18 sessions get no priming event, so any retry hint comes from the shutdown.
  const withGet = await rawSession(gw.url, 'full', '2025-06-18')
  const midCall = await rawSession(gw.url, 'full', '2025-06-18')
  const quiet = await rawSession(gw.url, 'full', '2025-06-18')
  const pids = await Promise.all([withGet, midCall, quiet].map(async sid => await rawPid(gw.url, 'full', sid)))
  t.ok(pids.every(alive), `children running: ${pids.join(', ')}`)

  const get = await fetch(`${gw.url}/mcp/full`, { headers: { accept: 'text/event-stream', 'mcp-session-id': withGet } })
  t.equal(get.status, 200)
  const getStream = new SseReader(get)
  const call = await post(gw.url, 'full', { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'slow', arguments: { ms: 20_000 } } }, midCall)
  t.equal(call.status, 200)
  const callStream = new SseReader(call)
  await sleep(300) // the slow call reaches its child
  t.same(getStream.retries, [], 'no retry hint before the shutdown')

  await gw.close()
  t.pass('close() resolved')
  await Promise.all([getStream.finished, callStream.finished])
  t.same(getStream.retries, [1234], 'the GET stream got a retry hint before it ended')
  // No event id of the call's stream reached its client (no priming before 2025-11-25), so it could
  // not resume it elsewhere: the call is answered on it instead, with an error.
  t.match(callStream.messages(), [{ id: 1, error: { code: -32000, message: 'The gateway is shutting down' } }], 'the call in flight got its one answer, an error')
  t.notOk(callStream.messages().some(m => 'result' in m), 'the slow call never produced a result')
  for (const pid of pids) t.notOk(alive(pid), `child ${pid} is gone`)
})

t.test('a real gateway process: SIGTERM exits 0 and leaves no child behind', async t => {
  const replica = await startReplica(t, 'solo', { servers: { full: stdioFixture('full-server') } })
  const sid = await rawSession(replica.url, 'full')
  const pid = await rawPid(replica.url, 'full', sid)
  t.ok(alive(pid))
  const exited = once(replica.child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  replica.child.kill('SIGTERM')
  const [code, signal] = await exited
  t.equal(code, 0, 'exit code 0')
  t.equal(signal, null)
  t.notOk(alive(pid), 'the child is gone')
  t.ok(replica.logs.some(entry => entry.msg === 'stopped'), 'it logged its clean stop')
})

t.test('a bad config: the process exits non-zero and names every bad path', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-bad-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const file = join(dir, 'bad.json')
  await writeFile(file, JSON.stringify({
    listen: { port: 70000 },
    http: { responseMode: 'xml' },
    sessions: { idleTimeoutMs: 5 },
    servers: {
      nocmd: { transport: 'stdio' },
      extra: { transport: 'stdio', command: 'node', bogus: true }
    }
  }))
  const child = reap(spawn(process.execPath, [MAIN, '--config', file], { stdio: ['ignore', 'pipe', 'pipe'] }))
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stderr = ''
  child.stderr.on('data', chunk => { stderr += String(chunk) })
  child.stdout.resume()
  const [code] = await once(child, 'exit') as [number | null]
  t.not(code, 0, `exit code ${String(code)}`)
  t.ok(code !== null && code > 0, 'a normal non-zero exit, not a signal')
  for (const path of ['/listen/port', '/http/responseMode', '/sessions/idleTimeoutMs', '/servers/nocmd/command', '/servers/extra/bogus']) {
    t.match(stderr, path, `stderr names ${path}`)
  }
})

// ---- capacity ----------------------------------------------------------------------------------

t.test('maxSessions 2: the third initialize gets 503 with Retry-After; after a DELETE a new one succeeds', async t => {
  const gw: RunningGateway = await startGateway(t, { servers: { full: stdioFixture('full-server', [], { maxSessions: 2 }) } })
  const first = await connect(t, gw.url, 'full')
  const second = await connect(t, gw.url, 'full')
  const init = { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } }
  const third = await post(gw.url, 'full', init)
  t.equal(third.status, 503)
  t.ok(Number(third.headers.get('retry-after')) > 0, `Retry-After: ${String(third.headers.get('retry-after'))}`)
  t.match(await third.json(), { id: 0, error: { code: -32007 } })

  await (first.transport as StreamableHTTPClientTransport).terminateSession()
  const again = await connect(t, gw.url, 'full')
  t.equal(textOf(await again.client.callTool({ name: 'echo', arguments: { text: 'slot freed' } })), 'slot freed', 'a new session fits after the DELETE')
  t.equal(textOf(await second.client.callTool({ name: 'echo', arguments: { text: 'unaffected' } })), 'unaffected')
  const fourth = await post(gw.url, 'full', init)
  t.equal(fourth.status, 503, 'and the limit still holds')
  await fourth.body?.cancel()
})
