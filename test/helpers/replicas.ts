// Several gateway processes against one Redis, and a round-robin HTTP proxy in front of them
// with no stickiness: the multi-replica topology of docker-compose.yml, without Docker.
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { writeFile, mkdtemp, rm } from 'node:fs/promises'
import { createServer, request, type IncomingMessage, type ServerResponse } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import type { Test } from 'tap'
import { reap } from './reaper.js'

const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url))

export interface ReplicaProcess {
  name: string
  url: string
  child: ChildProcess
  /** The config file it was started with (a test may rewrite it and send SIGHUP). */
  file: string
  /** Every log line the replica printed (JSON). */
  logs: Array<Record<string, unknown>>
  /** SIGKILL: the replica dies at once, without its shutdown path. */
  kill: () => Promise<void>
  /** SIGTERM: graceful stop. */
  stop: () => Promise<void>
}

async function waitExit (child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return true
  const timer = new Promise<false>(resolve => setTimeout(() => resolve(false), ms).unref())
  return await Promise.race([once(child, 'exit').then(() => true), timer])
}

/** Starts one gateway process with the given config (written to a temp file). */
export async function startReplica (t: Test, name: string, config: Record<string, unknown>): Promise<ReplicaProcess> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-'))
  const file = join(dir, 'gateway.json')
  // No drain in tests: a stop should not wait for a load balancer that is not there. Log lines are
  // written as they are logged (flushMs 0), so a test can read what a request logged as soon as it
  // is answered; process.test.ts covers the buffered default.
  await writeFile(file, JSON.stringify({ listen: { host: '127.0.0.1', port: 0 }, log: { level: 'info', flushMs: 0 }, shutdown: { drainMs: 0 }, ...config }))
  const child = reap(spawn(process.execPath, [MAIN, '--config', file], { stdio: ['ignore', 'pipe', 'pipe'] }))
  const logs: Array<Record<string, unknown>> = []
  let stderr = ''
  child.stderr?.on('data', chunk => { stderr += String(chunk) })
  const lines = createInterface({ input: child.stdout! })
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`replica ${name} did not start: ${stderr}`)), 20_000)
    lines.on('line', line => {
      try {
        const entry = JSON.parse(line) as Record<string, unknown>
        logs.push(entry)
        if (entry.msg === 'mcp-gateway listening' && typeof entry.address === 'string') { clearTimeout(timer); resolve(entry.address) }
      } catch { /* not JSON */ }
    })
    child.on('exit', code => { clearTimeout(timer); reject(new Error(`replica ${name} exited with ${code}: ${stderr}`)) })
  })
  const kill = async (): Promise<void> => { child.kill('SIGKILL'); await waitExit(child, 5000) }
  const stop = async (): Promise<void> => {
    child.kill('SIGTERM')
    if (!await waitExit(child, 10_000)) await kill()
  }
  t.teardown(async () => { await stop(); await rm(dir, { recursive: true, force: true }) })
  return { name, url, child, file, logs, kill, stop }
}

export interface RoundRobinProxy {
  url: string
  /** How many requests went to each target, by index. */
  counts: number[]
  /** Send only to these targets from now on (a load balancer that noticed a dead replica). */
  setTargets: (targets: string[]) => void
}

/**
 * A plain round-robin load balancer: each request goes to the next target, whatever its session.
 * Bodies stream both ways (SSE included) and a client abort aborts the upstream request.
 */
export async function startRoundRobinProxy (t: Test, initial: string[]): Promise<RoundRobinProxy> {
  let targets = [...initial]
  const counts = initial.map(() => 0)
  let next = 0
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const index = next++ % targets.length
    const target = new URL(targets[index] ?? '')
    counts[initial.indexOf(targets[index] ?? '')]! += 1
    const upstream = request({
      host: target.hostname,
      port: target.port,
      method: req.method,
      path: req.url,
      headers: { ...req.headers, host: `${target.hostname}:${target.port}` }
    }, up => {
      res.writeHead(up.statusCode ?? 502, up.headers)
      up.pipe(res)
      // A replica that dies mid-response resets its socket: the client's connection breaks too,
      // as behind a real load balancer (pipe() alone would leave it open and silent forever).
      up.on('error', () => { res.destroy() })
      up.on('close', () => { if (!up.complete) res.destroy() })
    })
    upstream.on('error', () => {
      if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json' })
      res.end()
    })
    res.on('close', () => { if (!res.writableFinished) upstream.destroy() })
    req.pipe(upstream)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const address = server.address()
  if (address === null || typeof address === 'string') throw new Error('no address')
  t.teardown(async () => {
    server.closeAllConnections()
    server.close()
  })
  return { url: `http://127.0.0.1:${address.port}`, counts, setTargets: list => { targets = [...list] } }
}

/** A fetch that sends each request to the replica `target()` names now (a client steered between replicas). */
export function steeredFetch (target: () => ReplicaProcess): (input: string | URL | Request, init?: RequestInit) => Promise<Response> {
  return async (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input))
    url.host = new URL(target().url).host
    return await fetch(url, init)
  }
}
