// Remote MCP servers behind the gateway (docs/behaviour.md, HTTP servers). Real SDK upstreams on
// loopback (Streamable HTTP in SSE and JSON modes, legacy HTTP+SSE), driven through the gateway by
// the official SDK client; upstream failures; and, with Redis, any replica serving the session
// while the backend's GET stream lease fails over when its holder dies.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import { closedPort, listen, startLegacyUpstream, startStreamableUpstream } from '../fixtures/http-upstreams.js'
import { startGateway } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'

async function connect (t: Test, url: string, opts: { legacy?: boolean, headers?: Record<string, string> } = {}): Promise<Client> {
  const client = new Client({ name: 'http-backend-test', version: '1' }, { capabilities: { sampling: {} } })
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({ role: 'assistant', model: 'm', content: { type: 'text', text: 'from the client' } }))
  const requestInit = { headers: opts.headers ?? {} }
  const transport = opts.legacy === true
    ? new SSEClientTransport(new URL(url), { requestInit, eventSourceInit: { fetch: async (u, init) => await fetch(u, { ...init, headers: { ...(init?.headers as Record<string, string>), ...requestInit.headers } }) } })
    : new StreamableHTTPClientTransport(new URL(url), { requestInit })
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  return client
}



t.test('Streamable HTTP upstream: every message passes, credentials stay per hop', async t => {
  const upstream = await startStreamableUpstream()
  t.teardown(upstream.close)
  const gw = await startGateway(t, {
    servers: { remote: { transport: 'streamable-http', url: upstream.url, headers: { 'x-api-key': 'configured-secret' } } }
  })
  const client = await connect(t, `${gw.url}/mcp/remote`, { headers: { authorization: 'Bearer client-token' } })
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'hi' } })), 'echo: hi')

  const logs: unknown[] = []
  client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push(n.params.data) })
  const progress: number[] = []
  t.equal(textOf(await client.callTool({ name: 'progress-log', arguments: {} }, undefined, { onprogress: p => { progress.push(p.progress) } })), 'done')
  t.same(progress, [1], 'progress relayed on the request stream')
  await eventually('the log notification', () => logs.length > 0 ? true : undefined)
  t.same(logs, ['working'])
  t.equal(textOf(await client.callTool({ name: 'ask-sampling', arguments: {} })), 'sampled: from the client', 'server-to-client request round trip')

  const clientSid = (client.transport as StreamableHTTPClientTransport).sessionId
  t.notOk([...upstream.sessions.keys()].includes(clientSid ?? ''), "the backend's session id is not the client's")
  t.ok(upstream.requests.length > 0)
  t.ok(upstream.requests.every(r => r.headers.authorization === undefined), "the client's Authorization never goes upstream")
  t.ok(upstream.requests.every(r => r.headers['x-api-key'] === 'configured-secret'), 'configured headers go upstream')
  // The first POST is the era probe (protocol: auto), a 2026-07-28 server/discover; then the session.
  const posts = upstream.requests.filter(r => r.method === 'POST')
  t.equal((posts[0]?.body as { method?: string } | undefined)?.method, 'server/discover', 'the era is probed first, once')
  t.equal(posts.filter(r => (r.body as { method?: string } | undefined)?.method === 'server/discover').length, 1)
  t.ok(posts.slice(2).every(r => r.headers['mcp-protocol-version'] === '2025-11-25'), 'MCP-Protocol-Version sent after initialize')

  await (client.transport as StreamableHTTPClientTransport).terminateSession()
  await eventually('the upstream DELETE', () => upstream.requests.some(r => r.method === 'DELETE') ? true : undefined)
  t.pass('DELETE reached the backend session')
})

t.test('JSON-mode and legacy SSE upstreams, over both client transports', async t => {
  const json = await startStreamableUpstream({ enableJsonResponse: true })
  const legacy = await startLegacyUpstream()
  t.teardown(json.close)
  t.teardown(legacy.close)
  const gw = await startGateway(t, {
    servers: {
      json: { transport: 'streamable-http', url: json.url },
      old: { transport: 'sse', url: legacy.url }
    }
  })
  for (const server of ['json', 'old']) {
    const viaStreamable = await connect(t, `${gw.url}/mcp/${server}`)
    t.equal(textOf(await viaStreamable.callTool({ name: 'echo', arguments: { message: server } })), `echo: ${server}`, `${server} via Streamable HTTP`)
    const viaLegacy = await connect(t, `${gw.url}/sse/${server}`, { legacy: true })
    t.equal(textOf(await viaLegacy.callTool({ name: 'echo', arguments: { message: server } })), `echo: ${server}`, `${server} via legacy SSE`)
    // The SDK's JSON-response upstream has no stream to ask on mid-request: sampling only on 'old'.
    if (server === 'old') t.equal(textOf(await viaLegacy.callTool({ name: 'ask-sampling', arguments: {} })), 'sampled: from the client')
  }
})

t.test('upstream failures: clear JSON-RPC errors in time, other sessions unaffected', async t => {
  const healthy = await startStreamableUpstream()
  t.teardown(healthy.close)
  const broken = await listen((_req, res) => { res.writeHead(503, { 'content-type': 'text/plain' }).end('down for maintenance') })
  t.teardown(broken.close)
  // Answers initialize normally, then cuts every tools/call mid-stream (one event, no id, reset).
  const resetting = await listen((req, res) => {
    let body = ''
    req.on('data', chunk => { body += String(chunk) })
    req.on('end', () => {
      const msg = body === '' ? {} : JSON.parse(body) as { id?: number, method?: string }
      if (msg.method === 'initialize') {
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'upstream-1' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { protocolVersion: '2025-11-25', capabilities: { tools: {} }, serverInfo: { name: 'resetting', version: '1' } } }))
      } else if (msg.method === 'tools/call') {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write('data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"half"}}\n\n')
        setTimeout(() => { res.socket?.destroy() }, 20)
      } else {
        res.writeHead(req.method === 'GET' ? 405 : 202).end()
      }
    })
  })
  t.teardown(resetting.close)
  const refused = await closedPort()
  const gw = await startGateway(t, {
    servers: {
      healthy: { transport: 'streamable-http', url: healthy.url, requestTimeoutMs: 500 },
      refused: { transport: 'streamable-http', url: `http://127.0.0.1:${refused}/mcp`, connectTimeoutMs: 1000 },
      broken: { transport: 'streamable-http', url: `${broken.url}/mcp` },
      resetting: { transport: 'streamable-http', url: `${resetting.url}/mcp` }
    }
  })
  const cut = await connect(t, `${gw.url}/mcp/resetting`)
  const cutErr = await cut.callTool({ name: 'any', arguments: {} }).then(() => null, (e: { code?: number }) => e)
  t.equal(cutErr?.code, -32007, 'an upstream reset mid-stream: connection error, no hang')
  const init = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'raw', version: '1' } } })
  for (const [server, status] of [['refused', undefined], ['broken', 503]] as const) {
    const res = await fetch(`${gw.url}/mcp/${server}`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: init })
    const reader = new SseReader(res)
    await reader.finished
    const answer = reader.messages().find(m => m.id === 0) as { error: { code: number, message: string, data: { status?: number, source: string } } } | undefined
    t.equal(answer?.error.code, -32007, `${server}: connection error code`)
    t.equal(answer?.error.data.source, 'gateway', `${server}: marked as the gateway's error`)
    if (status !== undefined) t.equal(answer?.error.data.status, status, `${server}: upstream status in data`)
  }
  const client = await connect(t, `${gw.url}/mcp/healthy`)
  const err = await client.callTool({ name: 'hang', arguments: {} }).then(() => null, (e: { code?: number }) => e)
  t.equal(err?.code, -32006, 'a slow upstream: timeout error')
  await eventually('notifications/cancelled upstream', () => healthy.requests.some(r => (r.body as { method?: string } | undefined)?.method === 'notifications/cancelled') ? true : undefined)
  t.pass('the upstream was told to cancel')
  t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: 'still fine' } })), 'echo: still fine', 'the session goes on')
})

t.test('with Redis: any replica serves the session; the GET-stream lease fails over without a 404 or a lost notification', async t => {
  const upstream = await startStreamableUpstream({ eventStore: true })
  t.teardown(upstream.close)
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1000, connectTimeoutMs: 2000 },
    servers: { remote: { transport: 'streamable-http', url: upstream.url } }
  }
  const replicas = await Promise.all(['A', 'B', 'C'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const client = await connect(t, `${proxy.url}/mcp/remote`)
  for (let i = 0; i < 6; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `m${i}` } })), `echo: m${i}`)
  const initializes = (): number => upstream.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'initialize').length
  t.equal(initializes(), 1, 'one backend session, resumed by every replica (no re-initialize)')
  const gets = (): number => upstream.requests.filter(r => r.method === 'GET').length
  await eventually('the lease holder to open the backend GET stream', () => gets() >= 1 ? true : undefined)

  // The initialize went to A (first through the proxy), so A holds the lease. Kill it, and let
  // the backend push a notification while no replica listens: the upstream stores it.
  const logs: unknown[] = []
  client.setNotificationHandler(LoggingMessageNotificationSchema, async n => { logs.push(n.params.data) })
  const backendSession = [...upstream.sessions.values()][0]
  await backendSession?.send({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'before failover' } })
  await eventually('the first notification', () => logs.includes('before failover') ? true : undefined)
  const [a, ...alive] = replicas
  proxy.setTargets(alive.map(r => r.url))
  const before = gets()
  await a?.kill()
  await backendSession?.send({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'during the gap' } })
  await eventually('another replica to resume the backend GET stream', () => gets() > before ? true : undefined)
  const resume = upstream.requests.filter(r => r.method === 'GET').at(-1)
  t.ok(typeof resume?.headers['last-event-id'] === 'string', 'the new lease holder resumed the backend stream with Last-Event-ID')
  await eventually('the notification sent during the gap', () => logs.includes('during the gap') ? true : undefined)
  t.equal(logs.filter(l => l === 'during the gap').length, 1, 'the notification sent while nobody listened arrived, once')
  for (let i = 0; i < 4; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `after${i}` } })), `echo: after${i}`, 'no 404 after the failover')
  t.equal(initializes(), 1, 'still the same backend session')

  // A notification the backend pushes on its GET stream now reaches the client.
  await eventually('the notification to reach the client', async () => {
    await backendSession?.send({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'pushed after failover' } })
    return logs.includes('pushed after failover') ? true : undefined
  })
  t.pass('a GET-stream notification after the failover reached the client')
})

// Regressions from the review: replicas resuming a backend session must speak the version the
// backend negotiated (not the client's), and a graceful stop of a replica must not DELETE backend
// sessions that other replicas still serve.
t.test('with Redis: resuming replicas send the backend\'s version; a graceful stop leaves the backend session alive', async t => {
  const seen: Array<{ method: string, version: string | undefined, rpc: string | undefined }> = []
  const upstream = await listen((req, res) => {
    let body = ''
    req.on('data', chunk => { body += String(chunk) })
    req.on('end', () => {
      const msg = body === '' ? {} : JSON.parse(body) as { id?: number | string, method?: string, params?: { arguments?: { message?: string } } }
      const version = req.headers['mcp-protocol-version'] as string | undefined
      seen.push({ method: req.method ?? '', version, rpc: msg.method })
      if (req.method === 'GET') { res.writeHead(405).end(); return }
      if (req.method === 'DELETE') { res.writeHead(200).end(); return }
      if (msg.method === 'initialize') {
        // An older server: it negotiates 2025-06-18, whatever the client asked for.
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'old-1' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { protocolVersion: '2025-06-18', capabilities: { tools: {} }, serverInfo: { name: 'old', version: '1' } } }))
        return
      }
      if (version !== '2025-06-18') {
        res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: `Unsupported protocol version: ${String(version)}` } }))
        return
      }
      if (msg.id === undefined) { res.writeHead(202).end(); return }
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { content: [{ type: 'text', text: `old: ${msg.params?.arguments?.message ?? ''}` }] } }))
    })
  })
  t.teardown(upstream.close)
  const redis = await startRedis(t)
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1000, connectTimeoutMs: 2000 },
    servers: { old: { transport: 'streamable-http', url: `${upstream.url}/mcp` } }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const client = await connect(t, `${proxy.url}/mcp/old`)
  for (let i = 0; i < 4; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `v${i}` } })), `old: v${i}`, `call ${i}: both replicas send 2025-06-18`)
  t.ok(seen.filter(s => s.method === 'POST' && s.rpc !== 'initialize' && s.rpc !== 'server/discover').every(s => s.version === '2025-06-18'), 'every request after initialize carried the backend\'s version')

  const [a, b] = replicas
  proxy.setTargets([b?.url ?? ''])
  await a?.stop() // SIGTERM: graceful
  t.equal(a?.child.exitCode, 0, 'replica A stopped cleanly')
  t.equal(seen.filter(s => s.method === 'DELETE').length, 0, 'no DELETE: the backend session outlives the replica')
  for (let i = 0; i < 2; i++) t.equal(textOf(await client.callTool({ name: 'echo', arguments: { message: `after${i}` } })), `old: after${i}`, 'the session goes on through B')
})
