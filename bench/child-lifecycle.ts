// The life of a server the benchmark runs as a child process (http-upstream, idle-upstream,
// minimal-proxy): tell the parent where it listens, and stop on SIGTERM, SIGINT or when stdin
// closes, so it cannot outlive a bench that died without cleaning up. procs.ts starts them.
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'

/** Listens on a free loopback port; resolves to the URL of `path` there. */
export async function listenLoopback (server: Server, path: string, backlog = 511): Promise<string> {
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', backlog, resolve))
  const { port } = server.address() as AddressInfo
  return `http://127.0.0.1:${port}${path}`
}

/** Stops the node:http server, dropping keep-alive and streaming sockets. */
export async function closeServer (server: Server): Promise<void> {
  server.closeAllConnections()
  await new Promise<void>(resolve => server.close(() => resolve()))
}

/** Prints {"url": ...} as the first stdout line (the parent waits for it); runs `stop` once, then exits. */
export function serveAsChild (url: string, stop: () => Promise<void>): void {
  let stopping = false
  const onStop = (): void => {
    if (stopping) return
    stopping = true
    stop().finally(() => process.exit(0))
  }
  process.on('SIGTERM', onStop)
  process.on('SIGINT', onStop)
  process.stdin.on('end', onStop)
  process.stdin.on('error', onStop)
  process.stdin.resume()
  process.stdout.write(`${JSON.stringify({ url })}\n`)
}
