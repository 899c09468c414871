// A bare Streamable HTTP MCP server for the 10,000-idle-streams benchmark: it must hold one GET
// stream per gateway session cheaply, which the SDK upstream (an McpServer and a transport per
// session) does not do at that count on this machine's memory and CPU. It speaks just enough of
// the protocol for the gateway: initialize (answered as one JSON body with a session id),
// notifications (202), ping and any other request (an empty result), GET (an SSE stream held
// open and never written to), DELETE.
//
//   node dist/bench/idle-upstream.js [--no-get]
//     --no-get  answer GET with 405, so the gateway holds no upstream stream per session
//     prints {"url": "http://127.0.0.1:<port>/mcp"} once listening; exits on SIGTERM/SIGINT or
//     when stdin closes (parent gone).
import { randomUUID } from 'node:crypto'
import { createServer, type ServerResponse } from 'node:http'
import { closeServer, listenLoopback, serveAsChild } from './child-lifecycle.js'

const offerGet = !process.argv.includes('--no-get')
/** Session id -> its open GET stream, if any. */
const sessions = new Map<string, ServerResponse | null>()

const json = (res: ServerResponse, headers: Record<string, string>, body: unknown): void => {
  res.writeHead(200, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body))
}

const server = createServer((req, res) => {
  const header = req.headers['mcp-session-id']
  const sid = typeof header === 'string' ? header : ''
  const known = sessions.has(sid)
  if (req.method === 'GET') {
    if (!offerGet) return void res.writeHead(405, { allow: 'POST, DELETE' }).end()
    if (!known) return void res.writeHead(404).end()
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
    res.flushHeaders()
    sessions.set(sid, res)
    res.on('close', () => { if (sessions.get(sid) === res) sessions.set(sid, null) })
    return
  }
  if (req.method === 'DELETE') {
    if (!known) return void res.writeHead(404).end()
    sessions.get(sid)?.end()
    sessions.delete(sid)
    return void res.writeHead(200).end()
  }
  const chunks: Buffer[] = []
  req.on('data', (chunk: Buffer) => { chunks.push(chunk) })
  req.on('end', () => {
    const message = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown, method?: string, params?: { protocolVersion?: string } }
    if (message.method === 'initialize') {
      const id = randomUUID()
      sessions.set(id, null)
      json(res, { 'mcp-session-id': id }, {
        jsonrpc: '2.0',
        id: message.id,
        result: { protocolVersion: message.params?.protocolVersion ?? '2025-06-18', capabilities: {}, serverInfo: { name: 'bench-idle-upstream', version: '1.0.0' } }
      })
      return
    }
    if (!known) return void res.writeHead(404).end()
    if (message.id === undefined || message.method === undefined) return void res.writeHead(202).end()
    json(res, {}, { jsonrpc: '2.0', id: message.id, result: {} })
  })
})

// A deep accept queue: the ramp opens streams many at a time.
serveAsChild(await listenLoopback(server, '/mcp', 4096), async () => { await closeServer(server) })
