// The supervisor against real child processes: capacity, restart with transparent
// re-initialisation (IO-6), the restart cap, stop during a restart, and stopAll.
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t, { type Test } from 'tap'
import { liveChildPids, openStdioBackend } from '../../src/backends/stdio.js'
import type { BackendExit } from '../../src/backends/backend.js'
import type { ServerConfig } from '../../src/config/schema.js'
import type { GatewayError } from '../../src/core/errors.js'
import type { JsonRpcMessage } from '../../src/core/jsonrpc.js'
import { restartDelay, Supervisor, type BackendSession, type SupervisedHandlers } from '../../src/backends/supervisor.js'
import {
  callTool,
  collectingLogger,
  Inbox,
  initializeParams,
  isGone,
  request,
  stdioConfig,
  toolText,
  waitUntil,
  type LogLine
} from './stdio-helpers.js'

type Restarting = BackendExit & { attempt: number, delayMs: number }

interface Recorder {
  handlers: SupervisedHandlers
  inbox: Inbox
  restarting: Restarting[]
  gone: string[]
}

function recorder (): Recorder {
  const inbox = new Inbox()
  const restarting: Restarting[] = []
  const gone: string[] = []
  return { inbox, restarting, gone, handlers: { onMessage: inbox.push, onRestarting: i => restarting.push(i), onGone: r => gone.push(r) } }
}

function supervisor (t: Test, servers: Record<string, ServerConfig>): { sup: Supervisor, lines: LogLine[] } {
  const { log, lines } = collectingLogger()
  const sup = new Supervisor({ config: { servers }, log, factories: { stdio: openStdioBackend } })
  t.teardown(async () => await sup.stopAll())
  return { sup, lines }
}

async function errorOf (p: Promise<unknown>): Promise<GatewayError | null> {
  return await p.then(() => null, (err: unknown) => err as GatewayError)
}

async function initialize (s: BackendSession, r: Recorder): Promise<void> {
  await s.send(request(1, 'initialize', initializeParams))
  await r.inbox.response(1)
  await s.send({ jsonrpc: '2.0', method: 'notifications/initialized' })
}

t.test('restartDelay is jittered exponential backoff, capped', async t => {
  for (let i = 0; i < 50; i++) {
    const d0 = restartDelay(0, 100, 1000)
    const d3 = restartDelay(3, 100, 1000)
    const d9 = restartDelay(9, 100, 1000)
    t.ok(d0 >= 50 && d0 <= 100, `attempt 0: ${d0}`)
    t.ok(d3 >= 400 && d3 <= 800, `attempt 3: ${d3}`)
    t.ok(d9 >= 500 && d9 <= 1000, `attempt 9 capped: ${d9}`)
  }
})

t.test('open() refuses unknown servers and missing factories', async t => {
  const { sup } = supervisor(t, { files: stdioConfig('hostile-crash'), remote: { transport: 'sse', url: 'http://127.0.0.1:1/sse' } as ServerConfig })
  const r = recorder()
  t.equal((await errorOf(sup.open('s1', 'nope', r.handlers)))?.code, 'GW_ERR_SERVER_NOT_FOUND')
  t.equal((await errorOf(sup.open('s1', 'toString', r.handlers)))?.code, 'GW_ERR_SERVER_NOT_FOUND', 'no prototype keys')
  t.equal((await errorOf(sup.open('s1', 'remote', r.handlers)))?.code, 'GW_ERR_BACKEND_UNAVAILABLE', 'no factory plugged in for sse')
  t.equal(sup.count('remote'), 0)
})

t.test('a backend that cannot start: GW_ERR_BACKEND_UNAVAILABLE, and no slot is held', async t => {
  const { sup } = supervisor(t, { broken: { ...stdioConfig('hostile-crash'), command: '/nonexistent/no-such-binary', args: [] } })
  const err = await errorOf(sup.open('s1', 'broken', recorder().handlers))
  t.equal(err?.code, 'GW_ERR_BACKEND_UNAVAILABLE')
  t.equal(sup.count('broken'), 0)
  t.same([...sup.sessions()], [])
})

t.test('capacity: maxSessions per server, GW_ERR_BACKEND_CAPACITY with retryAfter', async t => {
  const { sup } = supervisor(t, { quiet: stdioConfig('hostile-silent', [], { maxSessions: 2 }) })
  // concurrent opens must not overshoot the limit
  const results = await Promise.allSettled(['a', 'b', 'c'].map(async sid => await sup.open(sid, 'quiet', recorder().handlers)))
  const refused = results.filter(r => r.status === 'rejected') as PromiseRejectedResult[]
  t.equal(refused.length, 1, 'the third open is refused')
  const err = refused[0]!.reason as GatewayError
  t.equal(err.code, 'GW_ERR_BACKEND_CAPACITY')
  t.equal(err.statusCode, 503)
  t.equal(err.retryAfter, 5)
  t.equal(sup.count('quiet'), 2)
  const [first] = [...sup.sessions()]
  const pid = sup.get(first!)!.pid!
  await sup.stop(first!)
  await sup.stop(first!) // idempotent, and cheap for an unknown sid
  t.ok(isGone(pid), 'the stopped session’s child is gone')
  t.equal(sup.count('quiet'), 1)
  const again = await sup.open('d', 'quiet', recorder().handlers)
  t.equal(again.sid, 'd')
  t.equal(again.server, 'quiet')
  t.equal(sup.count('quiet'), 2)
  t.equal((await errorOf(sup.open('d', 'quiet', recorder().handlers)))?.code, 'GW_ERR_CONFLICT', 'one connection per session')
})

t.test('a crash restarts the child and re-initialises it transparently (IO-6)', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'gw-sup-'))
  t.teardown(async () => await rm(dir, { recursive: true, force: true }))
  // The first child crashes on its 7th message; the restarted one (marker file present) behaves.
  const { sup, lines } = supervisor(t, { crashy: stdioConfig('hostile-crash', ['--after', '7', '--once', join(dir, 'crashed')]) })
  const r = recorder()
  const s = await sup.open('sid-crash', 'crashy', r.handlers)
  const firstPid = s.pid!
  await initialize(s, r) //                                                        messages 1, 2
  await s.send(request(2, 'logging/setLevel', { level: 'debug' })) //               3
  await s.send(request(3, 'resources/subscribe', { uri: 'test://a' })) //           4
  await s.send(request(4, 'resources/subscribe', { uri: 'test://b' })) //           5
  await s.send(request(5, 'resources/unsubscribe', { uri: 'test://b' })) //         6
  await r.inbox.response(5)
  await s.send(callTool(6, 'echo', { text: 'lost with the child' })) //             7: crash

  await waitUntil(() => r.restarting.length > 0, 'onRestarting')
  t.match(r.restarting[0], { code: 1, attempt: 1, reason: 'process exited with code 1' })
  t.ok(r.restarting[0]!.delayMs >= 0)
  t.ok(isGone(firstPid), 'the crashed child is gone')

  // Sent while restarting: queued, then delivered to the re-initialised child.
  await s.send(callTool(7, 'received'))
  const seen = JSON.parse(toolText(await r.inbox.response(7))) as JsonRpcMessage[]
  t.not(s.pid, firstPid, 'a new child')
  t.equal(seen.length, 5, 'the new child saw exactly the re-initialisation, the replay and the request')
  t.match(seen[0], { method: 'initialize', id: /^gw-init-/ })
  t.same((seen[0] as { params: unknown }).params, initializeParams, 'with the client’s own initialize params')
  t.same(seen[1], { jsonrpc: '2.0', method: 'notifications/initialized' })
  t.match(seen[2], { method: 'logging/setLevel', id: /^gw-replay-/, params: { level: 'debug' } })
  t.match(seen[3], { method: 'resources/subscribe', id: /^gw-replay-/, params: { uri: 'test://a' } })
  t.match(seen[4], { method: 'tools/call', id: 7 })

  await s.send(callTool(8, 'echo', { text: 'works again' }))
  t.equal(toolText(await r.inbox.response(8)), 'works again')
  const ids = r.inbox.messages.map(m => 'id' in m ? m.id : undefined)
  t.notOk(ids.some(id => typeof id === 'string' && id.startsWith('gw-')), 'no gw- response reached onMessage')
  t.notOk(ids.includes(6), 'the request in flight at the crash was never answered by the backend')
  t.same(r.gone, [])
  t.ok(lines.some(l => l.msg === 'backend restarting' && l.attempt === 1), 'the restart is logged')
})

t.test('the restart cap ends the session: onGone', async t => {
  // Every child crashes on its first message, so each re-initialisation fails too.
  const { sup } = supervisor(t, {
    crashy: stdioConfig('hostile-crash', ['--after', '1'], { restart: { maxRestarts: 2, windowMs: 60_000, baseDelayMs: 5, maxDelayMs: 20 } })
  })
  const r = recorder()
  const s = await sup.open('sid-cap', 'crashy', r.handlers)
  await s.send(request(1, 'initialize', initializeParams))
  await waitUntil(() => r.gone.length > 0, 'onGone')
  t.same(r.restarting.map(i => i.attempt), [1, 2], 'two restarts were tried')
  t.equal(r.gone.length, 1)
  t.match(r.gone[0], /crashed 3 times within 60000 ms/)
  t.equal(sup.get('sid-cap'), undefined, 'the session is gone')
  t.equal(sup.count('crashy'), 0)
  t.equal((await errorOf(s.send(request(2, 'ping'))))?.code, 'GW_ERR_BACKEND_UNAVAILABLE')
  await s.stop() // still safe
})

t.test('maxRestarts 0: the first crash is final', async t => {
  const { sup } = supervisor(t, {
    crashy: stdioConfig('hostile-crash', ['--after', '1'], { restart: { maxRestarts: 0, windowMs: 60_000, baseDelayMs: 5, maxDelayMs: 20 } })
  })
  const r = recorder()
  const s = await sup.open('sid-zero', 'crashy', r.handlers)
  await s.send(request(1, 'initialize', initializeParams))
  await waitUntil(() => r.gone.length > 0, 'onGone')
  t.same(r.restarting, [])
  t.equal(sup.count('crashy'), 0)
})

t.test('no restart happens once the session is stopped', async t => {
  const { sup } = supervisor(t, {
    crashy: stdioConfig('hostile-crash', ['--after', '1'], { restart: { maxRestarts: 3, windowMs: 60_000, baseDelayMs: 400, maxDelayMs: 400 } })
  })
  const r = recorder()
  const s = await sup.open('sid-stop', 'crashy', r.handlers)
  const before = liveChildPids().length
  await s.send(request(1, 'initialize', initializeParams))
  await waitUntil(() => r.restarting.length > 0, 'onRestarting')
  const queued = s.send(request(2, 'ping')) // waits in the restart queue
  const more = Array.from({ length: 999 }, async () => await s.send({ jsonrpc: '2.0', method: 'notifications/roots/list_changed' }))
  const settled = Promise.allSettled([queued, ...more])
  t.equal((await errorOf(s.send(request(3, 'ping'))))?.code, 'GW_ERR_BACKEND_UNAVAILABLE', 'the restart queue is bounded')
  await s.stop()
  t.equal((await errorOf(queued))?.code, 'GW_ERR_BACKEND_UNAVAILABLE', 'the queued message is refused')
  t.ok((await settled).every(r => r.status === 'rejected'), 'every queued message is refused on stop')
  await new Promise(resolve => setTimeout(resolve, 500)) // past the restart delay
  t.equal(liveChildPids().length, before - 1, 'no child was started after stop')
  t.same(r.gone, [], 'stop() is not reported as gone')
  t.equal(r.restarting.length, 1)
})

t.test('stopAll stops every child, stubborn ones too, and refuses new sessions', async t => {
  const { sup } = supervisor(t, {
    plain: stdioConfig('hostile-crash'),
    stubborn: stdioConfig('hostile-stubborn', [], { stopGraceMs: 200 }),
    chatty: stdioConfig('hostile-stderr', ['5'])
  })
  const opened = await Promise.all(['plain', 'plain', 'stubborn', 'chatty'].map(async (server, i) => {
    const r = recorder()
    return { r, s: await sup.open(`s${i + 1}`, server, r.handlers) }
  }))
  // Initialised first, so the stubborn child has installed its SIGTERM handler.
  await Promise.all(opened.map(async ({ r, s }) => await initialize(s, r)))
  const sessions = opened.map(o => o.s)
  const pids = sessions.map(s => s.pid!)
  t.ok(pids.every(pid => !isGone(pid)), 'all children run')
  t.same([...sup.sessions()].sort(), ['s1', 's2', 's3', 's4'])
  await sup.stopAll()
  t.ok(pids.every(isGone), 'no child is left (kill(pid, 0) fails with ESRCH)')
  t.same([...sup.sessions()], [])
  t.notOk(pids.some(pid => liveChildPids().includes(pid)))
  t.equal((await errorOf(sup.open('s5', 'plain', recorder().handlers)))?.code, 'GW_ERR_SHUTTING_DOWN')
})

// Regression from the review: a client's own request id may start with 'gw-' (direct HTTP
// sessions pass client ids through); only answers to the supervisor's requests are kept back.
t.test("a client request whose id starts with 'gw-' gets its answer", async t => {
  const { sup } = supervisor(t, { files: stdioConfig('hostile-garbage') })
  const r = recorder()
  const s = await sup.open('s-gw', 'files', r.handlers)
  await initialize(s, r)
  await s.send(callTool('gw-1', 'echo', { text: 'mine' }))
  const answer = await r.inbox.response('gw-1')
  t.equal(toolText(answer), 'mine')
})
