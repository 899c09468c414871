// The benchmark's floor: a deliberately minimal MCP proxy that the gateway's figures
// are divided by. Plain node:http in front of floor-sessions.ts (one child per session, the POSTed
// line to the child, its answer back as one JSON body). Whatever the gateway does beyond this is
// what its ratios measure.
//
//   node dist/bench/minimal-proxy.js <command> [args...]
//     prints {"url": "http://127.0.0.1:<port>/mcp"} once listening; exits on SIGTERM/SIGINT or
//     when stdin closes (parent gone), killing its children.
//
// GET 405 (the SDK client then goes without a stream).
import { createServer } from 'node:http'
import { closeServer, listenLoopback, serveAsChild } from './child-lifecycle.js'
import { floorCommand, FloorSessions } from './floor-sessions.js'

const { command, args } = floorCommand('minimal-proxy')
const sessions = new FloorSessions(command, args)

const server = createServer((req, res) => {
  if (req.method === 'POST') {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => { chunks.push(chunk) })
    req.on('end', () => {
      sessions.post(Buffer.concat(chunks).toString('utf8'), req.headers['mcp-session-id'], (status, headers, body) => {
        res.writeHead(status, headers).end(body)
      })
    })
    return
  }
  if (req.method === 'DELETE') {
    res.writeHead(sessions.delete(req.headers['mcp-session-id']) ? 200 : 404).end()
    return
  }
  res.writeHead(405, { allow: 'POST, DELETE' }).end()
})

serveAsChild(await listenLoopback(server, '/mcp'), async () => {
  sessions.killAll()
  await closeServer(server)
})
