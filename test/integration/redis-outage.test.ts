// Redis failing is a delay, never a loss. Two gateway processes on one Redis, a stdio
// backend owned by A, calls sent through B (so every answer crosses Redis):
// - A's command connection blinks (CLIENT KILL, as a restart, a failover or a network hiccup
//   does) while its inbox reader stays up: every answer A's backend gives still reaches its client;
// - Redis killed mid-call and restarted from its append-only file: the call gets exactly one
//   answer within seconds, and the session carries on;
// - Redis restarted empty: the old session answers 404 and its child is stopped;
// - a Sentinel failover under SDK sessions calling in a loop: no call unanswered.
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis, testRedis, type RedisServer } from '../helpers/redis-server.js'
import { startSentinelSetup } from '../helpers/redis-topologies.js'
import { startReplica, startRoundRobinProxy, type ReplicaProcess } from '../helpers/replicas.js'
import { SseReader } from '../helpers/sse-client.js'
import { eventually, textOf } from '../helpers/wait.js'

const HEADERS = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' }
/** The backend's deadline: an answer lost on the way would show as -32006 after this plus 5 s. */
const REQUEST_TIMEOUT_MS = 3_000

interface Pair { redis: RedisServer, a: ReplicaProcess, b: ReplicaProcess, sid: string }

async function pair (t: Test, persist = false): Promise<Pair> {
  const redis = await startRedis(t, { persist })
  const config = { redis: { url: redis.url, keyPrefix: randomPrefix(), connectTimeoutMs: 2000 }, servers: { full: stdioFixture('full-server', [], { requestTimeoutMs: REQUEST_TIMEOUT_MS }) } }
  const [a, b] = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config))) as [ReplicaProcess, ReplicaProcess]
  const init = await fetch(`${a.url}/mcp/full`, { method: 'POST', headers: HEADERS, body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'outage', version: '1' } } }) })
  const sid = init.headers.get('mcp-session-id') ?? ''
  await new SseReader(init).finished
  await (await fetch(`${a.url}/mcp/full`, { method: 'POST', headers: { ...HEADERS, 'mcp-session-id': sid }, body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })).body?.cancel()
  return { redis, a, b, sid }
}

/** One tools/call through `url`: its HTTP status, the answers to it, and how long it took. */
async function call (url: string, sid: string, id: number, name: string, args: Record<string, unknown>): Promise<{ status: number, answers: Array<Record<string, unknown>>, ms: number }> {
  const started = Date.now()
  const res = await fetch(`${url}/mcp/full`, {
    method: 'POST',
    headers: { ...HEADERS, 'mcp-session-id': sid },
    body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }),
    signal: AbortSignal.timeout(30_000)
  })
  if (res.status !== 200) { await res.body?.cancel(); return { status: res.status, answers: [], ms: Date.now() - started } }
  const reader = new SseReader(res)
  await reader.finished.catch(() => {})
  return { status: 200, answers: reader.messages().filter(m => m.id === id), ms: Date.now() - started }
}

function replicaIdOf (replica: ReplicaProcess): string {
  return String(replica.logs.find(l => typeof l.replica === 'string')?.replica)
}

t.test('a blink of the owner\'s Redis connection loses no answer', async t => {
  const { redis, a, b, sid } = await pair(t)
  const admin = await testRedis(t, redis.url)
  const name = `mcpgw:${replicaIdOf(a)}`
  // A's command connection (not its inbox reader) is dropped every 250 ms for 3 s.
  let blinks = 0
  const stopAt = Date.now() + 3_000
  const blinking = (async () => {
    while (Date.now() < stopAt) {
      const list = String(await admin.call('CLIENT', 'LIST', 'TYPE', 'normal'))
      for (const line of list.split('\n')) {
        const id = / id=(\d+) /.exec(` ${line}`)?.[1]
        if (id !== undefined && line.includes(` name=${name} `)) { await admin.call('CLIENT', 'KILL', 'ID', id); blinks++ }
      }
      await sleep(250)
    }
  })()
  const results: Array<{ ok: boolean, ms: number, answer: string }> = []
  for (let i = 1; Date.now() < stopAt; i++) {
    const { answers, ms } = await call(b.url, sid, i, 'echo', { text: `b${i}` })
    const answer = answers[0] as { result?: { content?: Array<{ text?: string }> } } | undefined
    results.push({ ok: answers.length === 1 && answer?.result?.content?.[0]?.text === `b${i}`, ms, answer: JSON.stringify(answers).slice(0, 200) })
  }
  await blinking
  t.ok(blinks >= 5, `A's command connection was dropped ${blinks} times`)
  t.ok(results.length >= 5, `${results.length} calls made meanwhile`)
  const wrong = results.filter(r => !r.ok)
  t.same(wrong, [], 'every call got its backend\'s answer, exactly once')
  t.ok(Math.max(...results.map(r => r.ms)) < REQUEST_TIMEOUT_MS, `each within seconds, none waited for a deadline (max ${Math.max(...results.map(r => r.ms))} ms)`)
  t.ok(a.logs.some(l => l.msg === 'append failed; trying again while the store reconnects'), 'an append did fail and was tried again')
})

t.test('Redis killed mid-call and restarted with its data: one answer within seconds, the session carries on', async t => {
  const { redis, a, b, sid } = await pair(t, true)
  t.ok((await call(b.url, sid, 1, 'echo', { text: 'before' })).answers.length === 1, 'a call before')
  const inFlight = call(b.url, sid, 2, 'slow', { ms: 1_500 })
  await sleep(300)
  const killedAt = Date.now()
  await redis.kill()
  await sleep(1_000)
  await redis.restart()
  const { status, answers } = await inFlight
  const waited = Date.now() - killedAt
  t.equal(status, 200)
  t.equal(answers.length, 1, `exactly one answer to the call in flight: ${JSON.stringify(answers[0]).slice(0, 200)}`)
  const answer = (answers[0] ?? {}) as { result?: unknown, error?: { code: number, message: string } }
  t.match(answer, { result: { content: [{ text: 'slept 1500 ms' }] } }, 'its backend\'s result: an outage shorter than the retry bound is a delay')
  t.ok(waited < 10_000, `within seconds (${waited} ms)`)
  // Recovery needs no restart of the gateway: the same session works through either replica.
  const after = await eventually('the session to answer again', async () => {
    const { status, answers } = await call(b.url, sid, 3, 'echo', { text: 'after' })
    return status === 200 && answers.length === 1 && 'result' in (answers[0] ?? {}) ? answers[0] : undefined
  }, 15_000, 300)
  t.match(after, { result: { content: [{ text: 'after' }] } }, 'the session carries on through B')
  t.match((await call(a.url, sid, 4, 'echo', { text: 'on A' })).answers[0], { result: { content: [{ text: 'on A' }] } }, 'and through A')
})

t.test('Redis restarted empty: the old session answers 404 and its child is stopped', async t => {
  const { redis, a, b, sid } = await pair(t)
  const { answers } = await call(b.url, sid, 1, 'pid', {})
  const pid = Number((answers[0] as { result: { content: Array<{ text: string }> } }).result.content[0]?.text)
  t.ok(pid > 0, `the child runs (pid ${pid})`)
  await redis.restart()
  const status = await eventually('a 404 for the old session', async () => {
    const { status } = await call(b.url, sid, 2, 'echo', { text: 'x' })
    return status === 404 ? status : undefined
  }, 15_000, 300)
  t.equal(status, 404, 'the client is told to re-initialise')
  const alive = (): boolean => { try { process.kill(pid, 0); return true } catch { return false } }
  t.equal(await eventually('the child to stop', () => alive() ? undefined : 'stopped', 20_000, 200), 'stopped', 'the session\'s child was stopped')
  t.equal((await call(a.url, sid, 3, 'echo', { text: 'y' })).status, 404, 'on its owner too')
})

t.test('a Sentinel failover under load leaves no call unanswered', async t => {
  const sentinel = await startSentinelSetup(t)
  const config = {
    redis: { url: sentinel.primary.url, sentinels: [sentinel.sentinel.url], name: sentinel.name, keyPrefix: randomPrefix(), connectTimeoutMs: 2000 },
    // A deadline the six children started at once meet on a loaded machine: with 3 s, an initialize
    // answered -32006 failed the test before the failover (the deadline is not what it measures;
    // a call lost in the failover still gets its answer well inside the client's 20 s).
    servers: { full: stdioFixture('full-server', [], { requestTimeoutMs: 15_000 }) }
  }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, config)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  const clients = await Promise.all([0, 1, 2, 3, 4, 5].map(async i => {
    const client = new Client({ name: `failover-${i}`, version: '1' }, { capabilities: {} })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${proxy.url}/mcp/full`)))
    t.teardown(async () => { await client.close().catch(() => {}) })
    return client
  }))
  const figures = { calls: 0, results: 0, unanswered: 0, wrong: 0, errors: {} as Record<string, number> }
  let stopAt = Infinity
  const loops = clients.map(async (client, i) => {
    for (let n = 0; Date.now() < stopAt; n++) {
      figures.calls++
      try {
        const got = textOf(await client.callTool({ name: 'echo', arguments: { text: `c${i}-${n}` } }, undefined, { timeout: 20_000 }))
        if (got === `c${i}-${n}`) figures.results++
        else figures.wrong++
      } catch (err) {
        if (err instanceof McpError && err.code === -32001 && /timed out/i.test(err.message)) figures.unanswered++
        const code = err instanceof McpError ? String(err.code) : 'http'
        figures.errors[code] = (figures.errors[code] ?? 0) + 1
        await sleep(100)
      }
    }
  })
  await sleep(1_500)
  await sentinel.primary.kill()
  await eventually('Sentinel to promote the replica', () => sentinel.primaryPort() === sentinel.replica.port ? true : undefined, 20_000, 100)
  stopAt = Date.now() + 3_000
  await Promise.all(loops)
  t.comment(JSON.stringify(figures))
  t.ok(figures.calls >= 50, `calls made (${figures.calls})`)
  t.equal(figures.unanswered, 0, 'no call went unanswered')
  t.equal(figures.wrong, 0, 'no call got another call\'s answer')
  t.ok(figures.results > figures.calls * 0.5, `most calls got their result (${figures.results} of ${figures.calls})`)
})
