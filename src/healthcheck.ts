// The image's HEALTHCHECK: asks /healthz on the port the gateway's own config listens on (the same
// file as the gateway: --config, else $MCP_GATEWAY_CONFIG), so a container whose config moves
// `listen.port` is not reported unhealthy. Exit 0 healthy, 1 not. Only the listen address is read
// (no schema compile, none of the gateway's modules): a check costs little more than a Node start.
import { isIP } from 'node:net'
import { parseArgs, readListenAddress } from './config/load.js'

/** The address to ask: a wildcard bind is asked on loopback. */
function healthUrl (host: string, port: number): string {
  const target = host === '0.0.0.0' || host === '' ? '127.0.0.1' : host === '::' ? '::1' : host
  return `http://${isIP(target) === 6 ? `[${target}]` : target}:${port}/healthz`
}

async function check (): Promise<number> {
  const { configPath } = parseArgs(process.argv.slice(2))
  const { host, port } = await readListenAddress(configPath)
  const res = await fetch(healthUrl(host, port), { signal: AbortSignal.timeout(2500) })
  await res.body?.cancel()
  if (res.ok) return 0
  process.stderr.write(`mcp-gateway healthcheck: /healthz answered ${res.status}\n`)
  return 1
}

check().then(code => { process.exitCode = code }, (err: unknown) => {
  process.stderr.write(`mcp-gateway healthcheck: ${err instanceof Error ? err.message : String(err)}\n`)
  process.exitCode = 1
})
