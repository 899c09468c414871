// The benchmark's Streamable HTTP upstream: the SDK's StreamableHTTPServerTransport (stateful,
// one McpServer per session, the test fixture's tools, `echo` among them) on node:http, in its
// own process so it does not share an event loop with the benchmark's clients. Unlike the test
// fixture it records nothing, so a long run does not grow it.
//
//   node dist/bench/http-upstream.js   prints {"url": "http://127.0.0.1:<port>/mcp"} once listening;
//                                      exits on SIGTERM/SIGINT or when stdin closes (parent gone).
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { buildMcpServer, listen, readBody } from '../test/fixtures/http-upstreams.js'

const sessions = new Map<string, StreamableHTTPServerTransport>()

async function handle (req: IncomingMessage, res: ServerResponse): Promise<void> {
  const text = req.method === 'POST' ? await readBody(req) : ''
  const body: unknown = text === '' ? undefined : JSON.parse(text)
  const sid = req.headers['mcp-session-id']
  if (typeof sid === 'string') {
    const transport = sessions.get(sid)
    if (transport === undefined) {
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }))
      return
    }
    await transport.handleRequest(req, res, body)
    return
  }
  const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: id => { sessions.set(id, transport) }
  })
  transport.onclose = () => {
    if (transport.sessionId !== undefined) sessions.delete(transport.sessionId)
  }
  await buildMcpServer().connect(transport)
  await transport.handleRequest(req, res, body)
}

const http = await listen((req, res) => {
  handle(req, res).catch(err => {
    if (!res.headersSent) res.writeHead(500).end(String(err))
  })
})

let stopping = false
async function stop (): Promise<void> {
  if (stopping) return
  stopping = true
  for (const transport of sessions.values()) await transport.close().catch(() => {})
  await http.close()
  process.exit(0)
}
process.on('SIGTERM', () => { void stop() })
process.on('SIGINT', () => { void stop() })
process.stdin.on('end', () => { void stop() })
process.stdin.on('error', () => { void stop() })
process.stdin.resume()

process.stdout.write(`${JSON.stringify({ url: `${http.url}/mcp` })}\n`)
