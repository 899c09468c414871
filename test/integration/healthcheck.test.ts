// The image's HEALTHCHECK command (dist/src/healthcheck.js): it asks /healthz on the port of the
// config the gateway runs, found like the gateway finds it ($MCP_GATEWAY_CONFIG, or --config).
import { execFile } from 'node:child_process'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { freePort } from '../helpers/wait.js'

const HEALTHCHECK = fileURLToPath(new URL('../../src/healthcheck.js', import.meta.url))

async function runCheck (args: string[], env: Record<string, string>): Promise<{ code: number, stderr: string }> {
  return await new Promise(resolve => {
    execFile(process.execPath, [HEALTHCHECK, ...args], { env: { ...process.env, ...env }, timeout: 10_000 }, (err, _stdout, stderr) => {
      resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : -1, stderr })
    })
  })
}

t.test('healthy on the configured port, whichever it is; unhealthy where nothing answers', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'gw-healthcheck-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const gw = await startGateway(t, { servers: { full: stdioFixture('full-server') } })
  const port = Number(new URL(gw.url).port)
  const config = (host: string, p: number): string => JSON.stringify({ listen: { host, port: p }, auth: { anonymous: true }, servers: { full: stdioFixture('full-server') } })
  const file = join(dir, 'gateway.json')
  await writeFile(file, config('127.0.0.1', port))
  t.equal((await runCheck([], { MCP_GATEWAY_CONFIG: file })).code, 0, 'the file named by MCP_GATEWAY_CONFIG, its port')
  t.equal((await runCheck(['--config', file], { MCP_GATEWAY_CONFIG: '' })).code, 0, '--config too')
  const wildcard = join(dir, 'wildcard.json')
  await writeFile(wildcard, config('0.0.0.0', port))
  t.equal((await runCheck([], { MCP_GATEWAY_CONFIG: wildcard })).code, 0, 'a wildcard bind is asked on loopback')
  const placeholder = join(dir, 'placeholder.yaml')
  await writeFile(placeholder, `listen:\n  host: 127.0.0.1\n  port: "\${HC_PORT:-1}"\nservers: {}\n`)
  t.equal((await runCheck([], { MCP_GATEWAY_CONFIG: placeholder, HC_PORT: String(port) })).code, 0, 'a placeholder port is expanded (and the rest of the file is not validated)')
  const elsewhere = join(dir, 'elsewhere.json')
  await writeFile(elsewhere, config('127.0.0.1', await freePort()))
  const down = await runCheck([], { MCP_GATEWAY_CONFIG: elsewhere })
  t.equal(down.code, 1, 'nothing on the configured port: unhealthy')
  t.match(down.stderr, /mcp-gateway healthcheck:/, 'saying why')
  const broken = await runCheck([], { MCP_GATEWAY_CONFIG: join(dir, 'missing.yaml') })
  t.equal(broken.code, 1, 'an unreadable config: unhealthy')
  t.match(broken.stderr, /cannot read/)
})
