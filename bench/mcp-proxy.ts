// mcp-proxy (punkpeye's, the npm package) as a bench target: one stdio child shared by every
// session. Its CLI connects one SDK client to the child at start, and each HTTP session gets a
// server of its own proxying to that one client (dist/bin/mcp-proxy.mjs, createServer), so it is
// the "shared child" design pooled sessions are compared with. Shipped defaults otherwise.
import { spawn } from 'node:child_process'
import { closeSync, openSync } from 'node:fs'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { childrenOf, freePort, log, stopProcess } from './procs.js'
import { connectHttp, STDIO_ECHO } from './sessions.js'
import { FLOOR, STDIO_COMMAND, type TargetSpec } from './targets.js'

// dist/bench/mcp-proxy.js -> the repository's node_modules (the package exports no bin path).
const MCP_PROXY_BIN = fileURLToPath(new URL('../../node_modules/mcp-proxy/dist/bin/mcp-proxy.mjs', import.meta.url))
const READY_TIMEOUT_MS = 20_000

export function mcpProxyTarget (name = 'mcp-proxy'): TargetSpec {
  return {
    name,
    start: async ctx => {
      const port = await freePort()
      const logFile = join(ctx.dir, `${name}.log`)
      const fd = openSync(logFile, 'a')
      const child = spawn(process.execPath, [
        MCP_PROXY_BIN, '--host', '127.0.0.1', '--port', String(port), '--server', 'stream', '--', STDIO_COMMAND.command, ...STDIO_COMMAND.args
      ], { stdio: ['ignore', fd, fd] })
      closeSync(fd)
      ctx.cleanup.add(name, async () => { await stopProcess(child, 5000) })
      const url = `http://127.0.0.1:${port}/mcp`
      const deadline = Date.now() + READY_TIMEOUT_MS
      // It listens once its client has initialised the child; any HTTP answer means it is up.
      for (;;) {
        if (child.exitCode !== null) throw new Error(`${name} exited with ${String(child.exitCode)}; see ${logFile}`)
        if (await fetch(url, { method: 'GET' }).then(res => { void res.body?.cancel(); return true }, () => false)) break
        if (Date.now() > deadline) throw new Error(`${name} did not listen within ${READY_TIMEOUT_MS} ms; see ${logFile}`)
        await sleep(100)
      }
      log(`${name} pid ${String(child.pid)} at ${url}`)
      const pid = child.pid!
      return {
        name,
        compareTo: FLOOR,
        goals: {},
        echo: STDIO_ECHO,
        connect: async () => await connectHttp(url),
        servingPids: [pid],
        backendPids: () => childrenOf(pid),
        redisPid: null
      }
    }
  }
}
