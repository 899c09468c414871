// stdio backends against real child processes (docs/spec-rules.md §7): env allow-list, framing, hostile
// stdout, stderr capture, backpressure and the stop ladder.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import t, { type Test } from 'tap'
import type { BackendConnection, BackendExit } from '../../src/backends/backend.js'
import {
  childEnvironment,
  createStdioBackendFactory,
  liveChildPids,
  LineSplitter,
  MAX_WAITING_WRITERS,
  openStdioBackend,
  stopAllChildren
} from '../../src/backends/stdio.js'
import type { StdioServerConfig } from '../../src/config/schema.js'
import type { GatewayError } from '../../src/core/errors.js'
import type { BackendFactory } from '../../src/backends/backend.js'
import {
  callTool,
  collectingLogger,
  fixture,
  Inbox,
  initializeParams,
  isGone,
  request,
  stdioConfig,
  toolText,
  waitUntil,
  type LogLine
} from './stdio-helpers.js'

interface Opened {
  conn: BackendConnection
  inbox: Inbox
  exits: BackendExit[]
  lines: LogLine[]
  pid: number
}

async function open (t: Test, config: StdioServerConfig, factory: BackendFactory = openStdioBackend): Promise<Opened> {
  const { log, lines } = collectingLogger()
  const inbox = new Inbox()
  const exits: BackendExit[] = []
  const conn = await factory({ server: 'fx', config, sid: 'sid-1', log, handlers: { onMessage: inbox.push, onExit: e => exits.push(e) } })
  t.teardown(async () => await conn.close())
  return { conn, inbox, exits, lines, pid: conn.pid! }
}

async function initialize (o: Opened): Promise<void> {
  await o.conn.send(request(1, 'initialize', initializeParams))
  await o.inbox.response(1)
  await o.conn.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
}

t.test('childEnvironment: safe base set, inheritEnv names, then config.env; nothing else', async t => {
  const base = { PATH: '/bin', HOME: '/home/gw', SECRET_TOKEN: 'nope', SHARED: 'yes', FN: '() { evil; }', LANG: 'C' }
  const env = childEnvironment(base, { inheritEnv: ['SHARED', 'FN', 'MISSING'], env: { SET: 'set', HOME: '/override' } })
  t.same(env, { PATH: '/bin', HOME: '/override', SHARED: 'yes', SET: 'set' })
})

t.test('a burst of opens spawns one child per event-loop turn, so I/O and timers run between spawns', async t => {
  // Spawning blocks the loop until the child has exec'd (10-150 ms on a loaded machine); opened
  // back to back in one turn, a burst of sessions blocked everything else for seconds.
  let turn = 0
  let ticking = true
  const tick = (): void => { turn++; if (ticking) setImmediate(tick) }
  setImmediate(tick)
  t.teardown(() => { ticking = false })
  const config = stdioConfig('hostile-crash')
  const opened = await Promise.all(Array.from({ length: 6 }, async (_, i) => {
    const conn = await openStdioBackend({ server: 'fx', config, sid: `burst-${i}`, log: collectingLogger().log, handlers: { onMessage: () => {}, onExit: () => {} } })
    t.teardown(async () => await conn.close())
    return { pid: conn.pid, turn }
  }))
  t.equal(new Set(opened.map(o => o.pid)).size, 6, 'six children')
  t.equal(new Set(opened.map(o => o.turn)).size, 6, `each spawned in a turn of its own (turns ${opened.map(o => o.turn).join(', ')})`)
})

t.test('the child sees only allow-listed variables (IO-9)', async t => {
  const factory = createStdioBackendFactory({
    baseEnv: { ...process.env, GW_TEST_SECRET: 'bearer-abc', GW_TEST_SHARED: 'shared-value' }
  })
  const o = await open(t, stdioConfig('hostile-crash', [], { inheritEnv: ['GW_TEST_SHARED'], env: { GW_TEST_SET: 'from-config' } }), factory)
  await initialize(o)
  await o.conn.send(callTool(2, 'env'))
  const env = JSON.parse(toolText(await o.inbox.response(2))) as Record<string, string>
  t.equal(env.GW_TEST_SHARED, 'shared-value', 'inheritEnv name is passed')
  t.equal(env.GW_TEST_SET, 'from-config', 'config.env is set')
  t.notOk('GW_TEST_SECRET' in env, 'an unlisted gateway variable is absent')
  t.equal(env.PATH, process.env.PATH, 'PATH comes from the safe base set')
  const allowed = new Set(['HOME', 'LOGNAME', 'PATH', 'SHELL', 'TERM', 'USER', 'GW_TEST_SHARED', 'GW_TEST_SET'])
  // Under the tap runner, @tapjs/processinfo wraps child_process.spawn and adds its own variables
  // (coverage tracking of subprocesses); those are the harness's, not the gateway's.
  const injectedByTap = (k: string): boolean => k.startsWith('_TAPJS_') || (k === 'NODE_OPTIONS' && /tapjs/.test(env[k] ?? ''))
  const extra = Object.keys(env).filter(k => !allowed.has(k) && !injectedByTap(k))
  t.same(extra, [], 'no other variable reaches the child')
})

t.test('the default factory reads the gateway environment through the allow-list', async t => {
  process.env.GW_TEST_UNLISTED = 'must-not-leak'
  t.teardown(() => { delete process.env.GW_TEST_UNLISTED })
  const o = await open(t, stdioConfig('hostile-crash'))
  await o.conn.send(callTool(1, 'env'))
  const env = JSON.parse(toolText(await o.inbox.response(1))) as Record<string, string>
  t.notOk('GW_TEST_UNLISTED' in env)
  t.equal(env.PATH, process.env.PATH)
})

t.test('framing: newlines, CRLF and unicode in arguments round-trip through a real SDK server (IO-1)', async t => {
  const o = await open(t, stdioConfig('hostile-stderr', ['3']))
  await initialize(o)
  const text = 'line one\nline two\r\nquote " backslash \\ tab\t u2028:\u2028 ünïcødé 🚀'
  await o.conn.send(callTool(2, 'echo', { text }))
  t.equal(toolText(await o.inbox.response(2)), text)
})

t.test('stderr goes to the child logger, never counts as an error (IO-3)', async t => {
  const o = await open(t, stdioConfig('hostile-stderr', ['40']))
  await initialize(o)
  for (let i = 0; i < 5; i++) {
    await o.conn.send(callTool(10 + i, 'echo', { text: `n${i}` }))
    t.equal(toolText(await o.inbox.response(10 + i)), `n${i}`)
  }
  const stderr = o.lines.filter(l => l.stream === 'stderr')
  t.ok(stderr.length >= 40, `stderr lines logged (${stderr.length})`)
  t.ok(stderr.every(l => l.backend === 'fx' && l.pid === o.pid), 'each carries backend and pid')
  t.ok(stderr.some(l => l.level === 30 && l.msg === 'hostile-stderr: startup line 0'), 'plain lines at info')
  t.ok(stderr.some(l => l.level === 40 && String(l.msg).includes('ERROR this looks bad')), 'error-looking lines at warn')
  t.notOk(o.lines.some(l => l.level >= 50), 'nothing logged at error')
  t.same(o.exits, [], 'the backend is healthy')
})

t.test('garbage on stdout is logged and dropped; batches are split (IO-2, IO-4)', async t => {
  const o = await open(t, stdioConfig('hostile-garbage'))
  await initialize(o)
  await o.conn.send(callTool(2, 'echo', { text: 'still fine' }))
  t.equal(toolText(await o.inbox.response(2)), 'still fine')
  await o.conn.send(callTool(3, 'batch'))
  await o.conn.send(request(4, 'ping'))
  await o.inbox.response(4)
  t.same(o.inbox.messages.map(m => 'id' in m ? m.id : (m as { method: string }).method),
    [1, 2, 'notifications/message', 3, 4], 'only the JSON-RPC messages arrive, in order')
  const warns = o.lines.filter(l => l.level === 40)
  t.ok(warns.some(l => l.msg === 'backend wrote a non-JSON line to stdout; dropped'), 'non-JSON lines warned')
  t.ok(warns.some(l => l.msg === 'backend wrote JSON that is not a JSON-RPC message; dropped'), 'non-JSON-RPC JSON warned')
  const loud = o.lines.filter(l => l.level >= 30)
  t.notOk(loud.some(l => JSON.stringify(l).includes('hostile-garbage server v1.0')), 'the garbage itself is not logged at info or above')
  t.ok(o.lines.some(l => l.level === 20 && l.prefix === '*** hostile-garbage server v1.0 starting ***'), 'a prefix is logged at debug')
  t.same(o.exits, [])
})

t.test('a line over maxLineBytes is dropped and the connection keeps working (IO-2)', async t => {
  const size = 2_000_000
  const o = await open(t, stdioConfig('hostile-huge', [String(size)], { maxLineBytes: 65_536 }))
  await initialize(o)
  await o.conn.send(callTool(2, 'huge'))
  await o.conn.send(callTool(3, 'echo', { text: 'after the flood' }))
  t.equal(toolText(await o.inbox.response(3)), 'after the flood')
  t.notOk(o.inbox.messages.some(m => 'id' in m && m.id === 2), 'the oversized response is dropped')
  const err = o.lines.find(l => l.level === 50 && l.msg === 'backend wrote a line longer than maxLineBytes; dropped')
  t.ok(err, 'logged as an error')
  t.ok(Number(err?.bytes) > size, 'with its size')
  t.same(o.exits, [], 'the child is still connected')
  t.notOk(isGone(o.pid))
})

t.test('LineSplitter never holds more than maxLineBytes', async t => {
  const lines: string[] = []
  const oversize: number[] = []
  const split = new LineSplitter(16, l => lines.push(l.toString('utf8')), b => oversize.push(b))
  let high = 0
  const feed = (s: string | Buffer): void => {
    split.push(Buffer.isBuffer(s) ? s : Buffer.from(s))
    high = Math.max(high, split.buffered)
  }
  feed('ab')
  feed('c\r\nde')
  feed('f\n')
  for (let i = 0; i < 1000; i++) feed('0123456789') // 10 000 bytes, no newline
  feed('tail\nok\n')
  const euro = Buffer.from('€\n') // a multi-byte character split across chunks
  feed(euro.subarray(0, 1))
  feed(euro.subarray(1))
  feed('last')
  split.end()
  t.same(lines, ['abc', 'def', 'ok', '€', 'last'])
  t.same(oversize, [10_004], 'the long line is reported once, with its length')
  t.ok(high <= 16, `buffered at most ${high} bytes`)
})

t.test('send respects backpressure: a child that stops reading holds the writers', async t => {
  const o = await open(t, stdioConfig('hostile-silent', ['--stop-reading'], { stopGraceMs: 100 }))
  await o.conn.send(request(1, 'initialize', initializeParams))
  await o.inbox.response(1)
  const big = 'y'.repeat(64 * 1024)
  let settled = 0
  const sends = Array.from({ length: 50 }, async (_, i) => {
    try {
      await o.conn.send(callTool(100 + i, 'echo', { text: big }))
    } finally {
      settled++
    }
  })
  const all = Promise.allSettled(sends)
  await new Promise(resolve => setTimeout(resolve, 300))
  t.ok(settled < 10, `most sends wait for drain (${settled} of 50 settled)`)
  t.same(o.exits, [], 'the child is alive')
  await o.conn.close()
  const results = await all
  const rejected = results.filter(r => r.status === 'rejected')
  t.ok(rejected.length > 40, 'the waiting sends reject once the connection closes')
  t.equal((rejected[0] as PromiseRejectedResult).reason.code, 'GW_ERR_BACKEND_UNAVAILABLE')
})

t.test('close() ends a child that ignores EOF and SIGTERM with SIGKILL (IO-5)', async t => {
  const o = await open(t, stdioConfig('hostile-stubborn', [], { stopGraceMs: 300 }))
  await initialize(o)
  t.ok(liveChildPids().includes(o.pid), 'registered as live')
  await Promise.all([o.conn.close(), o.conn.close()])
  await o.conn.close() // idempotent
  t.ok(isGone(o.pid), 'the process is gone')
  t.notOk(liveChildPids().includes(o.pid), 'and out of the registry')
  const stopped = o.lines.find(l => l.msg === 'backend stopped')
  t.match(stopped, { escalatedTo: 'SIGKILL', signal: 'SIGKILL' })
  t.ok(o.lines.some(l => l.stream === 'stderr' && l.msg === 'hostile-stubborn: SIGTERM ignored'), 'SIGTERM came first')
  t.same(o.exits, [], 'onExit is not called after close()')
  await t.rejects(o.conn.send(request(2, 'ping')), { code: 'GW_ERR_BACKEND_UNAVAILABLE' })
})

t.test('a well-behaved child exits on stdin EOF, no signal needed', async t => {
  const o = await open(t, stdioConfig('hostile-crash'))
  await initialize(o)
  await o.conn.close()
  t.match(o.lines.find(l => l.msg === 'backend stopped'), { escalatedTo: null, code: 0 })
  t.ok(isGone(o.pid))
})

t.test('an unexpected exit calls onExit exactly once; later sends reject', async t => {
  const o = await open(t, stdioConfig('hostile-crash', ['--after', '2']))
  await o.conn.send(request(1, 'initialize', initializeParams))
  await o.inbox.response(1)
  await o.conn.send(request(2, 'ping'))
  await waitUntil(() => o.exits.length > 0, 'onExit')
  await new Promise(resolve => setTimeout(resolve, 50)) // room for a (wrong) second call
  t.equal(o.exits.length, 1)
  t.match(o.exits[0], { code: 1, signal: null, reason: 'process exited with code 1' })
  t.ok(o.lines.some(l => l.stream === 'stderr' && String(l.msg).includes('crashing on message 2')), 'its last words were logged')
  await t.rejects(o.conn.send(request(3, 'ping')), { code: 'GW_ERR_BACKEND_UNAVAILABLE' })
  t.notOk(liveChildPids().includes(o.pid))
})

t.test('a command that cannot be spawned rejects with GW_ERR_BACKEND_UNAVAILABLE', async t => {
  const { log } = collectingLogger()
  const config = { ...stdioConfig('hostile-crash'), command: '/nonexistent/definitely-not-a-command', args: [] }
  const err = await openStdioBackend({ server: 'fx', config, sid: 's', log, handlers: { onMessage () {}, onExit () { t.fail('no onExit') } } })
    .then(() => null, (e: unknown) => e as GatewayError)
  t.equal(err?.code, 'GW_ERR_BACKEND_UNAVAILABLE')
  t.match(err?.message, /ENOENT/)
})

t.test('stopAllChildren closes every live connection without reporting exits', async t => {
  const a = await open(t, stdioConfig('hostile-crash'))
  const b = await open(t, stdioConfig('hostile-stubborn', [], { stopGraceMs: 200 }))
  await initialize(a)
  await initialize(b)
  await stopAllChildren()
  t.ok(isGone(a.pid) && isGone(b.pid), 'both children are gone')
  t.same([...a.exits, ...b.exits], [], 'closed, not crashed: no onExit')
  t.notOk(liveChildPids().includes(a.pid) || liveChildPids().includes(b.pid))
})

t.test('no child outlives a gateway that dies of an uncaught exception', async t => {
  const parent = spawn(process.execPath, [fixture('crashing-gateway')], { stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { parent.kill('SIGKILL') })
  let out = ''
  parent.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  const [code] = await once(parent, 'exit') as [number | null]
  t.equal(code, 1, 'the parent died of its exception')
  const pid = Number(out.trim())
  t.ok(pid > 0, `it had a child (${pid})`)
  t.teardown(() => { if (pid > 0 && !isGone(pid)) process.kill(pid, 'SIGKILL') }) // even when the test fails
  await waitUntil(() => isGone(pid), 'the orphan is reaped')
  t.ok(isGone(pid), 'the child was killed by the exit hook')
})

// Regressions from the review of the stdio backend.
t.test('a child that stops reading stdin: senders beyond the cap are refused at once, memory stays bounded', async t => {
  const o = await open(t, { ...stdioConfig('hostile-silent'), command: 'sleep', args: ['600'] })
  const big = 'x'.repeat(100_000)
  const refused: GatewayError[] = []
  for (let i = 0; i < MAX_WAITING_WRITERS + 200; i++) o.conn.send(request(i, 'tools/call', { big })).catch((err: GatewayError) => { refused.push(err) })
  await waitUntil(() => refused.length >= 150, 'the senders beyond the cap to be refused')
  t.ok(refused.every(e => e.code === 'GW_ERR_BACKEND_UNAVAILABLE' && /not reading its stdin/.test(e.message)), 'refused with a clear reason')
})

t.test('a backend that cannot be spawned: the log names the command, never its (secret) arguments', async t => {
  const { log, lines } = collectingLogger()
  const config = { ...stdioConfig('hostile-silent'), command: '/nonexistent/mcp-server', args: ['--api-key', 'sk-SECRET-123'] }
  await t.rejects(openStdioBackend({ server: 'fx', config, sid: 'sid-1', log, handlers: { onMessage: () => {}, onExit: () => {} } }), { code: 'GW_ERR_BACKEND_UNAVAILABLE' })
  t.ok(lines.some(l => JSON.stringify(l).includes('/nonexistent/mcp-server')), 'the failure is logged')
  t.notOk(lines.some(l => JSON.stringify(l).includes('sk-SECRET-123')), 'the arguments are not')
})
