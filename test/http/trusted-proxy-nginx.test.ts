// Behind a proxy every client has the proxy's address. Through a real nginx (the
// shipped compose file's front), one client's bad keys must not lock out another's good ones:
// with `http.trustedProxies` naming nginx, each client has a budget of its own (nginx's
// X-Forwarded-For), and even without it a valid key is never refused for another's failures.
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { request } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { ACCEPT_BOTH, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { createLogger } from '../../src/telemetry/logger.js'
import { eventually, freePort } from '../helpers/wait.js'

const NGINX = ['/usr/sbin/nginx', '/usr/bin/nginx'].find(path => spawnSync(path, ['-v']).status === 0)
if (NGINX === undefined) {
  // CI installs nginx (.ci/run): there, a missing one is a failure, not a skip.
  if (process.env.CI === 'true') t.fail('nginx is not installed (apt-get install nginx)')
  else t.plan(0, 'nginx is not installed (Debian: apt-get install nginx); the proxy tests are skipped')
}

/** nginx on a free loopback port in front of `upstream`, set up as config/nginx.conf is. */
async function startNginx (t: Test, upstream: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'mcpgw-nginx-'))
  const port = await freePort()
  writeFileSync(join(dir, 'nginx.conf'), `
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass ${upstream};
      proxy_http_version 1.1;
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_buffering off;
    }
  }
}
`)
  const child = spawn(NGINX ?? 'nginx', ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr.on('data', chunk => { stderr += String(chunk) })
  t.teardown(async () => {
    if (child.exitCode === null) {
      child.kill('SIGTERM')
      await new Promise(resolve => child.once('exit', resolve))
    }
    rmSync(dir, { recursive: true, force: true })
  })
  await eventually('nginx to serve /healthz', async () => {
    if (child.exitCode !== null) throw new Error(`nginx exited: ${stderr}`)
    return await new Promise<true | undefined>(resolve => {
      const req = request({ host: '127.0.0.1', port, path: '/healthz' }, res => { res.resume(); resolve(res.statusCode === 200 ? true : undefined) })
      req.on('error', () => { resolve(undefined) })
      req.end()
    })
  })
  return `http://127.0.0.1:${port}`
}

/** A DELETE of an unknown session through nginx from a local address: 404 once authenticated. */
async function attempt (base: string, key: string, from: string, headers: Record<string, string> = {}): Promise<number> {
  const url = new URL(`${base}/mcp/full`)
  return await new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: url.pathname, method: 'DELETE', localAddress: from, headers: { 'x-api-key': key, 'mcp-session-id': 'nope', accept: ACCEPT_BOTH, ...headers } }, res => {
      res.resume()
      res.on('end', () => { resolve(res.statusCode ?? 0) })
    })
    req.on('error', reject)
    req.end()
  })
}

const BAD = 'mcpgw_not-a-key-of-anybody-at-all-000000000000000'

async function setUp (t: Test, http: Record<string, unknown>): Promise<{ proxy: string, good: string, lines: string[] }> {
  const good = newKey('good')
  const lines: string[] = []
  const log = createLogger('info', 'test', { write: (line: string) => { lines.push(line) } })
  const gw = await startGateway(t, {
    http,
    auth: { publicUrl: PUBLIC_URL, failures: { burst: 4, ratePerSecond: 0.1 } },
    tenants: { acme: { apiKeys: [good.entry], servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  }, { log })
  return { proxy: await startNginx(t, gw.url), good: good.key, lines }
}

t.test('trusted nginx: each client behind it has its own budget, and cannot forge another address', async t => {
  const { proxy, good, lines } = await setUp(t, { trustedProxies: ['127.0.0.1'] })
  const guesser = '127.0.0.2'
  const other = '127.0.0.3'
  const statuses: number[] = []
  for (let i = 0; i < 5; i++) statuses.push(await attempt(proxy, BAD, guesser))
  t.same(statuses, [401, 401, 401, 401, 429], 'the guesser spends its budget')
  t.equal(await attempt(proxy, BAD, other), 401, 'another client behind the same nginx: its own budget (401, not 429)')
  t.equal(await attempt(proxy, good, other), 404, 'and its key is served')
  // The guesser names another address itself: nginx appends the real one, which is what is read.
  t.equal(await attempt(proxy, BAD, guesser, { 'x-forwarded-for': '127.0.0.9' }), 429, 'a forged X-Forwarded-For does not buy a fresh budget')
  const refusals = (): Array<Record<string, unknown>> => lines.map(line => JSON.parse(line) as Record<string, unknown>).filter(l => l.audit === 'request.refused')
  const refused = await eventually('the audit lines', () => refusals().some(l => l.status === 429) ? refusals() : undefined)
  t.ok(refused.some(l => l.status === 429 && l.address === guesser), 'the audit line names the client, not nginx')
  t.ok(refused.some(l => l.status === 401 && l.address === other))
  t.notOk(refused.some(l => l.address === '127.0.0.1' || l.address === '127.0.0.9'), 'never nginx\'s address, never the forged one')
})

t.test('untrusted nginx (nothing set): one budget for all, yet a valid key still passes', async t => {
  const { proxy, good } = await setUp(t, {})
  for (let i = 0; i < 5; i++) await attempt(proxy, BAD, '127.0.0.2')
  t.equal(await attempt(proxy, BAD, '127.0.0.3'), 429, 'every client shares nginx\'s address and its spent budget')
  t.equal(await attempt(proxy, good, '127.0.0.3'), 404, 'but a valid key is never refused for another client\'s failures')
})
