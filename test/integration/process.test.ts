// The gateway as an operating-system process (docs/operating.md): the graceful drain at SIGTERM, and
// `--check-config`, which validates without starting anything.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { reap } from '../helpers/reaper.js'
import { startReplica } from '../helpers/replicas.js'
import { eventually } from '../helpers/wait.js'

const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url))

const initialize = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'drain-test', version: '1' } }
}

async function postInitialize (url: string): Promise<Response> {
  return await fetch(`${url}/mcp/full`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify(initialize)
  })
}

t.test('SIGTERM: /readyz answers 503 at once while requests are still served, then the process stops after the drain', async t => {
  const replica = await startReplica(t, 'drain', { shutdown: { drainMs: 1500 }, servers: { full: stdioFixture('full-server') } })
  t.equal((await fetch(`${replica.url}/readyz`)).status, 200, 'ready before the signal')
  const sentAt = Date.now()
  const exited = once(replica.child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
  replica.child.kill('SIGTERM')
  let notReady: Response | undefined
  for (let i = 0; i < 50 && notReady === undefined; i++) {
    const res = await fetch(`${replica.url}/readyz`)
    if (res.status === 503) notReady = res
    else await res.body?.cancel()
  }
  t.ok(notReady !== undefined, '/readyz turned 503')
  t.match(await notReady?.json(), { status: 'not ready', shuttingDown: true })
  t.ok(Date.now() - sentAt < 1000, 'well before the drain ends')
  t.equal((await fetch(`${replica.url}/healthz`)).status, 200, 'the process still answers')
  const init = await postInitialize(replica.url)
  t.equal(init.status, 200, 'a request that arrives while draining is still served')
  await init.body?.cancel()
  const [code] = await exited
  t.equal(code, 0, 'clean exit after the drain')
  t.ok(Date.now() - sentAt >= 1400, `it waited out the drain (${Date.now() - sentAt} ms)`)
  t.ok(replica.logs.some(entry => entry.msg === 'shutting down' && entry.drainMs === 1500), 'the drain is logged')
})

t.test('SIGINT skips the drain', async t => {
  const replica = await startReplica(t, 'no-drain', { shutdown: { drainMs: 30_000 }, servers: { full: stdioFixture('full-server') } })
  const sentAt = Date.now()
  const exited = once(replica.child, 'close') as Promise<[number | null]>
  replica.child.kill('SIGINT')
  const [code] = await exited
  t.equal(code, 0)
  t.ok(Date.now() - sentAt < 10_000, `stopped without the 30 s drain (${Date.now() - sentAt} ms)`)
})

async function runCheck (args: string[]): Promise<{ code: number | null, stdout: string, stderr: string }> {
  const child = reap(spawn(process.execPath, [MAIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] }))
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', chunk => { stdout += String(chunk) })
  child.stderr.on('data', chunk => { stderr += String(chunk) })
  const [code] = await once(child, 'exit') as [number | null]
  return { code, stdout, stderr }
}

t.test('--check-config: a valid file exits 0 and names its servers; nothing listens', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-check-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const file = join(dir, 'ok.yaml')
  // Port 1 would need privileges: if the check tried to listen, it would fail loudly.
  await writeFile(file, 'listen: { host: 127.0.0.1, port: 1 }\nservers:\n  a: { transport: stdio, command: node }\n  b: { transport: streamable-http, url: "http://127.0.0.1:9/mcp" }\n')
  const { code, stdout } = await runCheck(['--check-config', file])
  t.equal(code, 0)
  t.match(stdout, /is valid \(2 servers: a, b\)/)
})

t.test('--check-config: an invalid file exits 1 and lists every problem', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-check-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const file = join(dir, 'bad.yaml')
  await writeFile(file, 'listen: { port: 70000 }\nshutdown: { drainMs: -1 }\nservers:\n  a: { transport: stdio }\n')
  const { code, stdout, stderr } = await runCheck(['--check-config', file])
  t.equal(code, 1)
  t.equal(stdout, '')
  for (const path of ['/listen/port', '/shutdown/drainMs', '/servers/a/command']) t.match(stderr, path, `names ${path}`)
  const missing = await runCheck(['--check-config', join(dir, 'nope.yaml')])
  t.equal(missing.code, 1)
  t.match(missing.stderr, /cannot read/)
})

t.test('buffered logs (the default): the listening line at once, a call\'s audit line within flushMs, every line by exit', async t => {
  // A long flush interval, so a line the timer wrote would arrive seconds after it was logged.
  const replica = await startReplica(t, 'buffered', { log: { level: 'info', flushMs: 4000 }, servers: { full: stdioFixture('full-server') } })
  const listening = replica.logs.find(entry => entry.msg === 'mcp-gateway listening')
  const lag = Date.now() - Date.parse(String(listening?.time))
  t.ok(lag < 1500, `the listening line was flushed at once, not by the timer (${lag} ms after it was logged)`)
  const init = await postInitialize(replica.url)
  const sid = init.headers.get('mcp-session-id') ?? ''
  await init.text()
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': '2025-11-25' }
  await (await fetch(`${replica.url}/mcp/full`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })).text()
  const call = await fetch(`${replica.url}/mcp/full`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } }) })
  await call.text()
  const answeredAt = Date.now()
  const audited = (): boolean => replica.logs.some(entry => entry.audit === 'tools.call' && entry.tool === 'echo')
  t.ok(await eventually('the audit line of the call', () => audited() ? true : undefined, 6000).catch(() => false), 'the audit line of the call arrived')
  t.ok(Date.now() - answeredAt < 5000, `within the flush interval and some slack (${Date.now() - answeredAt} ms)`)
  // Lines logged just before exit are written by the exit flush, not lost with the buffer.
  const exited = once(replica.child, 'close')
  replica.child.kill('SIGINT')
  await exited
  t.ok(replica.logs.some(entry => entry.msg === 'stopped'), 'the last line, logged right before exit, is there')
})
