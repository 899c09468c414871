// The floor's MCP logic, shared by its two HTTP front-ends: the minimal proxy (plain
// node:http, the floor every figure is divided by) and fastify-floor (the same logic behind
// Fastify, to show what the framework alone adds). One child per session; the POSTed line is
// written to the child and the child's answer goes back as one JSON body. No validation, no
// logging, no SSE, no resumption.
//
// POST without mcp-session-id: spawn the child, mint a session id, write the line; the answer
// carries the id. Later POSTs: a request (id and method) waits for the child's line with that id;
// anything else is written and answered 202. DELETE kills the child. Batches and
// server-to-client requests are not supported. Callbacks, not promises: the floor stays as cheap
// as the first minimal proxy was.
import { spawn, type ChildProcess } from 'node:child_process'
import { randomUUID } from 'node:crypto'

/** How a front-end answers one HTTP request. */
export type Respond = (status: number, headers: Record<string, string>, body?: string) => void

interface Session {
  child: ChildProcess
  /** Answers waiting for the child, by JSON.stringify(id) so 1 and "1" differ. */
  waiting: Map<string, Respond>
}

export class FloorSessions {
  readonly #command: string
  readonly #args: string[]
  readonly #sessions = new Map<string, Session>()

  constructor (command: string, args: string[]) {
    this.#command = command
    this.#args = args
  }

  #start (sid: string): Session {
    const child = spawn(this.#command, this.#args, { stdio: ['pipe', 'pipe', 'ignore'] })
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
        const respond = session.waiting.get(key)
        if (respond === undefined) continue
        session.waiting.delete(key)
        respond(200, { 'content-type': 'application/json', 'mcp-session-id': sid }, line)
      }
    })
    // A write after the child died is answered by the exit handler below, not by a crash here.
    child.stdin!.on('error', () => {})
    child.on('exit', () => {
      this.#sessions.delete(sid)
      for (const respond of session.waiting.values()) respond(502, {})
      session.waiting.clear()
    })
    this.#sessions.set(sid, session)
    return session
  }

  post (text: string, sid: string | string[] | undefined, respond: Respond): void {
    let message: { id?: unknown, method?: unknown }
    try {
      message = JSON.parse(text) as { id?: unknown, method?: unknown }
    } catch {
      respond(400, {})
      return
    }
    let session: Session | undefined
    if (typeof sid === 'string') {
      session = this.#sessions.get(sid)
      if (session === undefined) {
        respond(404, {})
        return
      }
    } else if (message.method === 'initialize') {
      session = this.#start(randomUUID())
    } else {
      respond(400, {})
      return
    }
    if (message.id !== undefined && message.method !== undefined) {
      session.waiting.set(JSON.stringify(message.id), respond)
    } else {
      respond(202, {})
    }
    session.child.stdin!.write(text.endsWith('\n') ? text : `${text}\n`)
  }

  /** DELETE: kills the session's child; false when there is no such session. */
  delete (sid: string | string[] | undefined): boolean {
    const session = typeof sid === 'string' ? this.#sessions.get(sid) : undefined
    if (session === undefined) return false
    this.#sessions.delete(sid as string)
    session.child.kill()
    return true
  }

  killAll (): void {
    for (const session of this.#sessions.values()) session.child.kill()
  }
}

/** The command line both front-ends take: `<script> <command> [args...]`. */
export function floorCommand (script: string): { command: string, args: string[] } {
  const [command, ...args] = process.argv.slice(2)
  if (command === undefined) {
    process.stderr.write(`usage: ${script} <command> [args...]\n`)
    process.exit(2)
  }
  return { command, args }
}
