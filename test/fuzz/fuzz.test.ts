// Hostile input at volume (docs/operating.md): seeded, bounded, thousands of malformed HTTP, JSON,
// JSON-RPC, session, auth and slow-client inputs against a gateway in memory mode and a Redis pair
// (two replicas on one real Redis), with tenants. Every answer must be a 4xx (or a deliberate 503)
// in the gateway's JSON-RPC error format, or a 2xx; no other 5xx; every process stays up; its
// memory stays flat; and one tenant never reaches another's session (404).
//
// `npm test` runs a short pass; `npm run fuzz` a long one. FUZZ_SEED and FUZZ_COUNT (inputs per
// gateway) set the run; a failure names the seed and the input, so it can be replayed.
import { readFile } from 'node:fs/promises'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { ACCEPT_BOTH, initMessage, newKey, openSession, PUBLIC_URL, type TestKey } from '../helpers/auth.js'
import { stdioFixture } from '../helpers/gateway.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, type ReplicaProcess } from '../helpers/replicas.js'
import { rawExchange } from '../helpers/raw-http.js'

const SEED = Number(process.env.FUZZ_SEED ?? 28)
const COUNT = Number(process.env.FUZZ_COUNT ?? 1200)
/** RSS growth allowed between the end of the warm-up and the end of the run. */
const RSS_BOUND = 80 * 1024 * 1024
const WARMUP = Math.min(300, Math.floor(COUNT / 4))

/** mulberry32: small, seeded, good enough to pick inputs. */
function prng (seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6D2B79F5) >>> 0
    let x = a
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
}

interface Fixture { acme: TestKey, beta: TestKey, acmeSid: string, acmeVersion: string }

type Input =
  | { kind: 'fetch', label: string, method: string, path: string, headers: Record<string, string>, body?: string | Uint8Array }
  | { kind: 'raw', label: string, bytes: string }
  | { kind: 'slow', label: string, bytes: string, pauseMs: number }

function generator (seed: number, fx: Fixture): () => Input {
  const r = prng(seed)
  const pick = <T>(items: readonly T[]): T => items[Math.floor(r() * items.length)] as T
  const junk = (n: number): string => Array.from({ length: n }, () => String.fromCharCode(32 + Math.floor(r() * 95))).join('')
  const creds = (): Record<string, string> => pick<Record<string, string>>([
    {}, { 'x-api-key': fx.acme.key }, { 'x-api-key': fx.beta.key }, { 'x-api-key': `mcpgw_${junk(20)}` },
    { authorization: `Bearer ${junk(30).replace(/\s/g, '')}` }, { authorization: 'Bearer a.b.c' }, { authorization: 'Basic Zm9vOmJhcg==' },
    { authorization: 'Bearer' }, { authorization: `Bearer ${fx.acme.key}`, 'x-api-key': fx.beta.key },
    { authorization: `Bearer ${Buffer.from('{"alg":"RS256","kid":"x"}').toString('base64url')}.${Buffer.from('{"iss":"https://nobody/"}').toString('base64url')}.sig` }
  ])
  const paths = [
    '/mcp/full', '/mcp/full', '/mcp/other', '/mcp/nosuch', '/mcp/%ff%fe', `/mcp/${'a'.repeat(101)}`, '/mcp/', '/mcp', '/sse/full',
    '/sse/full/messages?sessionId=x', '/sse/full/messages', '/.well-known/oauth-protected-resource/mcp/full', '/mcp/full?x=%zz',
    '/%2e%2e/mcp/full', '/mcp/full/../full', `/${junk(8).replace(/[\s?#]/g, '')}`, '/healthz', '/readyz'
  ]
  const bodies = (): string | Uint8Array => pick<() => string | Uint8Array>([
    () => junk(Math.floor(r() * 200)),
    () => '',
    () => '{',
    () => '[]',
    () => '[' + '['.repeat(300) + ']'.repeat(300) + ']',
    () => Uint8Array.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]),
    () => JSON.stringify({ jsonrpc: '2.0', id: null, method: 'tools/list' }),
    () => JSON.stringify({ jsonrpc: '1.0', id: 1, method: 'ping' }),
    () => JSON.stringify({ jsonrpc: '2.0', id: 1, method: 42 }),
    () => JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: [] }),
    () => JSON.stringify({ jsonrpc: '2.0', id: { x: 1 }, method: 'tools/list' }),
    () => JSON.stringify([{ jsonrpc: '2.0', id: 1, method: 'tools/list' }, 7, null]),
    () => JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: 'x' }),
    () => JSON.stringify({ ...initMessage(1), params: { protocolVersion: junk(5) } }),
    () => JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'tools/call', params: { name: 'echo', arguments: { text: junk(20) } } }),
    () => JSON.stringify({ jsonrpc: '2.0', result: {}, id: 's.nobody.1' }),
    () => JSON.stringify({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: junk(4) } }),
    () => JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'x', params: { _meta: { 'io.modelcontextprotocol/protocolVersion': junk(6) } } })
  ])()
  const sessionHeaders = (): Record<string, string> => pick<Record<string, string>>([
    {}, { 'mcp-session-id': fx.acmeSid }, { 'mcp-session-id': junk(40).replace(/\s/g, '') }, { 'mcp-session-id': '' },
    { 'mcp-session-id': fx.acmeSid, 'mcp-protocol-version': junk(10) }, { 'mcp-session-id': fx.acmeSid, 'last-event-id': junk(12) },
    { 'mcp-session-id': fx.acmeSid, 'mcp-protocol-version': fx.acmeVersion }
  ])
  const otherHeaders = (): Record<string, string> => pick<Record<string, string>>([
    {}, { origin: 'https://evil.example' }, { 'content-type': 'text/plain' }, { accept: 'text/html' }, { accept: '*/*' },
    { 'content-type': 'application/json; charset=latin1' }, { 'mcp-method': junk(5) }
  ])
  const raws = [
    () => `${junk(10)}\r\n\r\n`,
    () => 'POST /mcp/full HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello',
    () => 'POST /mcp/full HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n',
    () => `GET /mcp/full HTTP/1.1\r\nhost: 127.0.0.1\r\nx: ${'y'.repeat(20_000)}\r\n\r\n`,
    () => 'GET /mcp/full HTTP/9.9\r\n\r\n',
    () => `GET ${'/'.repeat(3)}\x00 HTTP/1.1\r\n\r\n`,
    () => 'POST /mcp/full HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: -1\r\n\r\n'
  ]
  return () => {
    const roll = r()
    if (roll < 0.08) return { kind: 'raw', label: 'raw', bytes: pick(raws)() }
    if (roll < 0.10) {
      const head = `POST /mcp/full HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"jsonrpc"`
      return { kind: 'slow', label: 'slow', bytes: head.slice(0, Math.floor(r() * head.length)), pauseMs: 5 + Math.floor(r() * 40) }
    }
    const method = pick(['POST', 'POST', 'POST', 'GET', 'DELETE', 'PUT', 'OPTIONS', 'PATCH'])
    const path = pick(paths)
    const headers: Record<string, string> = { 'content-type': 'application/json', accept: ACCEPT_BOTH, ...creds(), ...sessionHeaders(), ...otherHeaders() }
    // acme may end its own session; the run needs it to the end (the isolation check uses it).
    if (method === 'DELETE' && headers['x-api-key'] === fx.acme.key) headers['mcp-session-id'] = junk(12).replace(/\s/g, '')
    const body = method === 'GET' || method === 'OPTIONS' ? undefined : bodies()
    return { kind: 'fetch', label: `${method} ${path.slice(0, 40)}`, method, path, headers, ...(body !== undefined ? { body } : {}) }
  }
}

interface Outcome { status: number, body: string }

async function send (base: string, input: Input): Promise<Outcome> {
  // A slow client that gives up: nothing is answered, and nothing may be left behind.
  if (input.kind !== 'fetch') return await rawExchange(base, input.bytes, input.kind === 'slow' ? { giveUpMs: input.pauseMs } : {})
  const ac = new AbortController()
  const timer = setTimeout(() => ac.abort(), 3000)
  try {
    const res = await fetch(base + input.path, { method: input.method, headers: input.headers, body: input.body, signal: ac.signal })
    // An SSE answer (a GET stream, a call's stream) is not read to its end: only its status counts.
    const sse = (res.headers.get('content-type') ?? '').includes('event-stream')
    const body = sse ? '' : await res.text()
    if (sse) await res.body?.cancel()
    return { status: res.status, body }
  } catch (err) {
    return { status: ac.signal.aborted ? -1 : -2, body: String((err as { cause?: unknown }).cause ?? err) }
  } finally {
    clearTimeout(timer)
  }
}

/** What an answer must be: a 2xx, a 3xx never, a 4xx or 503 in the gateway's JSON-RPC error format. */
function verdict (input: Input, out: Outcome): string | null {
  if (input.kind === 'slow') return null
  if (out.status === -1) return input.kind === 'fetch' && input.method === 'GET' ? null : 'no answer within 3 s'
  if (out.status <= 0) return input.kind === 'raw' && out.status === 0 ? 'connection closed without an answer' : `transport error ${out.body}`
  if (out.status >= 200 && out.status < 300) return null
  if (out.status >= 500 && out.status !== 503) return `status ${out.status}`
  if (out.status < 400) return `status ${out.status}`
  let parsed: { jsonrpc?: unknown, error?: { code?: unknown, message?: unknown, data?: { source?: unknown } } }
  try { parsed = JSON.parse(out.body) } catch { return `status ${out.status} without a JSON body: ${out.body.slice(0, 80)}` }
  if (parsed.jsonrpc !== '2.0' || typeof parsed.error?.code !== 'number' || typeof parsed.error.message !== 'string' || parsed.error.data?.source !== 'gateway') {
    return `status ${out.status} not in the gateway's format: ${out.body.slice(0, 120)}`
  }
  return null
}

async function rssOf (replica: ReplicaProcess): Promise<number> {
  const status = await readFile(`/proc/${replica.child.pid ?? 0}/status`, 'utf8')
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) * 1024
}

function tenantsConfig (): { acme: TestKey, beta: TestKey, config: Record<string, unknown> } {
  const acme = newKey('acme-bot')
  const beta = newKey('beta-bot')
  return {
    acme,
    beta,
    config: {
      // The failure budget would turn most of the run into 429s from this one address.
      auth: { publicUrl: PUBLIC_URL, failures: { burst: 0 } },
      http: { bodyLimit: 65536 },
      tenants: { acme: { apiKeys: [acme.entry], servers: { full: {} } }, beta: { apiKeys: [beta.entry], servers: { full: {}, other: {} } } },
      servers: { full: stdioFixture('full-server', [], { maxSessions: 20 }), other: stdioFixture('full-server', [], { maxSessions: 20 }) }
    }
  }
}

async function run (t: Test, replicas: ReplicaProcess[], keys: { acme: TestKey, beta: TestKey }, seed: number): Promise<void> {
  const first = replicas[0] as ReplicaProcess
  const session = await openSession(first.url, 'full', { 'x-api-key': keys.acme.key })
  const fx: Fixture = { acme: keys.acme, beta: keys.beta, acmeSid: session.sid, acmeVersion: session.version }
  const next = generator(seed, fx)
  const failures: string[] = []
  let baseline: number[] = []
  for (let i = 0; i < COUNT; i++) {
    if (i === WARMUP) baseline = await Promise.all(replicas.map(rssOf))
    const replica = replicas[i % replicas.length] as ReplicaProcess
    const input = next()
    const wrong = verdict(input, await send(replica.url, input))
    if (wrong !== null && failures.length < 20) failures.push(`seed ${seed} input ${i} (${input.label}) on ${replica.name}: ${wrong}`)
    // The isolation check, now and then on every replica: another tenant's use of the session is 404.
    if (i % 97 === 0) {
      const foreign = await fetch(`${replica.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'x-api-key': keys.beta.key, 'mcp-session-id': fx.acmeSid, 'mcp-protocol-version': fx.acmeVersion }, body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }) })
      await foreign.body?.cancel()
      if (foreign.status !== 404 && failures.length < 20) failures.push(`seed ${seed} input ${i}: beta reached acme's session (${foreign.status})`)
    }
  }
  t.same(failures, [], `${COUNT} inputs (seed ${seed}): every answer in the right family and format`)
  for (const replica of replicas) {
    t.equal(replica.child.exitCode, null, `${replica.name} is still up`)
    const health = await fetch(`${replica.url}/healthz`)
    t.equal(health.status, 200, `${replica.name} still answers`)
  }
  await sleep(500)
  const after = await Promise.all(replicas.map(rssOf))
  replicas.forEach((replica, n) => {
    const grown = (after[n] ?? 0) - (baseline[n] ?? 0)
    t.ok(grown < RSS_BOUND, `${replica.name}: RSS ${Math.round((baseline[n] ?? 0) / 1048576)} -> ${Math.round((after[n] ?? 0) / 1048576)} MiB after the warm-up, within ${RSS_BOUND / 1048576} MiB`)
  })
  // The session the run kept hitting with garbage still serves its owner.
  const own = await fetch(`${first.url}/mcp/full`, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'x-api-key': keys.acme.key, 'mcp-session-id': fx.acmeSid, 'mcp-protocol-version': fx.acmeVersion }, body: JSON.stringify({ jsonrpc: '2.0', id: 10, method: 'ping' }) })
  t.equal(own.status, 200, "acme's session still serves acme")
  await own.body?.cancel()
}

t.test('memory mode, with tenants', async t => {
  const { acme, beta, config } = tenantsConfig()
  const gw = await startReplica(t, 'memory', config)
  await run(t, [gw], { acme, beta }, SEED)
})

t.test('a Redis pair (two replicas, one Redis), with tenants', async t => {
  const redis = await startRedis(t)
  const { acme, beta, config } = tenantsConfig()
  const shared = { ...config, redis: { url: redis.url, keyPrefix: randomPrefix() } }
  const a = await startReplica(t, 'redis-a', shared)
  const b = await startReplica(t, 'redis-b', shared)
  await run(t, [a, b], { acme, beta }, SEED + 1)
})
