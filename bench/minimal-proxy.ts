// The benchmark's floor (issue 10): a deliberately minimal MCP proxy that the gateway's figures
// are divided by. Plain node:http, one child per session; the POSTed line is written to the
// child and the child's answer goes back as one JSON body. No validation, no logging, no SSE, no
// resumption: whatever the gateway does beyond this is what its ratios measure.
//
//   node dist/bench/minimal-proxy.js <command> [args...]
//     prints {"url": "http://127.0.0.1:<port>/mcp"} once listening; exits on SIGTERM/SIGINT or
//     when stdin closes (parent gone), killing its children.
//
// POST without mcp-session-id: spawn the child, mint a session id, write the line; the answer
// carries the id. Later POSTs: a request (id and method) waits for the child's line with that id;
// anything else is written and answered 202. GET 405 (the SDK client then goes without a
// stream), DELETE kills the child. Batches and server-to-client requests are not supported.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { closeServer, listenLoopback, serveAsChild } from './child-lifecycle.js'

interface Session {
  child: ChildProcess
  /** HTTP responses waiting for the child's answer, by JSON.stringify(id) so 1 and "1" differ. */
  waiting: Map<string, ServerResponse>
}

const [command, ...args] = process.argv.slice(2)
if (command === undefined) {
  process.stderr.write('usage: minimal-proxy <command> [args...]\n')
  process.exit(2)
}

const sessions = new Map<string, Session>()

function startSession (sid: string): Session {
  const child = spawn(command!, args, { stdio: ['pipe', 'pipe', 'ignore'] })
  const session: Session = { child, waiting: new Map() }
  let partial = ''
  child.stdout!.setEncoding('utf8')
  child.stdout!.on('data', (chunk: string) => {
    const lines = (partial + chunk).split('\n')
    partial = lines.pop()!
    for (const line of lines) {
      if (line === '') continue
      let id: unknown
      try {
        id = (JSON.parse(line) as { id?: unknown }).id
      } catch {
        continue
      }
      if (id === undefined) continue
      const key = JSON.stringify(id)
      const res = session.waiting.get(key)
      if (res === undefined) continue
      session.waiting.delete(key)
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': sid }).end(line)
    }
  })
  // A write after the child died is answered by the exit handler below, not by a crash here.
  child.stdin!.on('error', () => {})
  child.on('exit', () => {
    sessions.delete(sid)
    for (const res of session.waiting.values()) res.writeHead(502).end()
    session.waiting.clear()
  })
  sessions.set(sid, session)
  return session
}

function onPost (req: IncomingMessage, res: ServerResponse, text: string): void {
  let message: { id?: unknown, method?: unknown }
  try {
    message = JSON.parse(text) as { id?: unknown, method?: unknown }
  } catch {
    res.writeHead(400).end()
    return
  }
  const header = req.headers['mcp-session-id']
  let session: Session | undefined
  if (typeof header === 'string') {
    session = sessions.get(header)
    if (session === undefined) {
      res.writeHead(404).end()
      return
    }
  } else if (message.method === 'initialize') {
    session = startSession(randomUUID())
  } else {
    res.writeHead(400).end()
    return
  }
  if (message.id !== undefined && message.method !== undefined) {
    session.waiting.set(JSON.stringify(message.id), res)
  } else {
    res.writeHead(202).end()
  }
  session.child.stdin!.write(text.endsWith('\n') ? text : `${text}\n`)
}

const server = createServer((req, res) => {
  if (req.method === 'POST') {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => { chunks.push(chunk) })
    req.on('end', () => { onPost(req, res, Buffer.concat(chunks).toString('utf8')) })
    return
  }
  if (req.method === 'DELETE') {
    const sid = req.headers['mcp-session-id']
    const session = typeof sid === 'string' ? sessions.get(sid) : undefined
    if (session === undefined) {
      res.writeHead(404).end()
      return
    }
    sessions.delete(sid as string)
    session.child.kill()
    res.writeHead(200).end()
    return
  }
  res.writeHead(405, { allow: 'POST, DELETE' }).end()
})

serveAsChild(await listenLoopback(server, '/mcp'), async () => {
  for (const session of sessions.values()) session.child.kill()
  await closeServer(server)
})
