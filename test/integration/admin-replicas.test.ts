// The admin API across two gateway processes on one Redis, under traffic that alternates between
// them (docs/console.md): the counts are what the test made, a session is ended from the replica
// that does not own it, and a reload asked on one replica reloads both.
import { randomBytes } from 'node:crypto'
import t from 'tap'
import { stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, newKey, openSession, PUBLIC_URL } from '../helpers/auth.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica } from '../helpers/replicas.js'
import { eventually } from '../helpers/wait.js'
import { shortHash } from '../../src/telemetry/logger.js'

const TOKEN = randomBytes(24).toString('base64url')

interface Overview {
  replicas: Array<{ id: string, self: boolean, sessions: number, version: string, draining: boolean, seenAt: number, lastReload: { ok: boolean } | null }>
  servers: Array<{ name: string, mode: string, sessions: number, children: number, callsPerMinute: number, errorsPerMinute: number, pool: { inUse: number, warm: number, waiting: number } }>
  tenants: Array<{ name: string, sessions: number, callsPerMinute: number }>
  sessions: { total: number }
}
interface SessionPage { total: number, sessions: Array<{ session: string, server: string, tenant: string, owner: string | null, holder: string | null, client: string, pooled: boolean, subject: string }> }

async function admin<T> (base: string, path: string, init: RequestInit = {}): Promise<{ status: number, body: T, text: string }> {
  const res = await fetch(`${base}/admin/api${path}`, { ...init, headers: bearer(TOKEN) })
  const text = await res.text()
  return { status: res.status, body: JSON.parse(text) as T, text }
}

t.test('two replicas on one Redis: counts, ending a session from the other replica, reload everywhere', async t => {
  const redis = await startRedis(t)
  const acme = newKey('acme-bot')
  const beta = newKey('beta-bot')
  const config = {
    redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 },
    admin: { token: TOKEN },
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [acme.entry], servers: { full: {}, pooled: {} } },
      beta: { apiKeys: [beta.entry], servers: { full: {} } }
    },
    servers: {
      full: stdioFixture('full-server'),
      pooled: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1, poolMax: 2 })
    }
  }
  const a = await startReplica(t, 'A', config)
  const b = await startReplica(t, 'B', config)
  const replicas = [a, b]

  // Traffic, alternating: acme opens 3 sessions of `full` and 1 pooled, beta 2 of `full`.
  const made: Array<{ sid: string, version: string, tenant: string, server: string, key: string, via: number }> = []
  const plan: Array<[string, string, string]> = [['acme', 'full', acme.key], ['beta', 'full', beta.key], ['acme', 'full', acme.key], ['acme', 'pooled', acme.key], ['beta', 'full', beta.key], ['acme', 'full', acme.key]]
  for (const [i, [tenant, server, key]] of plan.entries()) {
    const s = await openSession(replicas[i % 2]!.url, server, bearer(key))
    made.push({ ...s, tenant, server, key, via: i % 2 })
  }
  // Two calls per session, one through each replica.
  let calls = 0
  for (const s of made) {
    for (const r of [b, a]) {
      const answer = await callTool(r.url, s.server, bearer(s.key), s, 'echo', { text: 'hi' }, 10 + calls)
      t.ok(answer.message !== undefined && 'result' in answer.message, 'the call is answered')
      calls++
    }
  }

  const ids = await Promise.all(replicas.map(async r => (await admin<Overview>(r.url, '/overview')).body.replicas.find(x => x.self)?.id))
  t.ok(ids[0] !== undefined && ids[1] !== undefined && ids[0] !== ids[1], 'each replica names itself')

  // Summaries are published every 2 s: wait until B has one of A's from after the traffic.
  const trafficEnd = Date.now()
  const overview = await eventually('both replicas\' summaries after the traffic', async () => {
    const o = (await admin<Overview>(b.url, '/overview')).body
    return o.replicas.length === 2 && o.replicas.every(r => r.seenAt > trafficEnd) ? o : undefined
  }, 15_000, 250)
  t.same(overview.replicas.map(r => r.id).sort(), [...ids].sort(), 'the two replicas')
  t.ok(overview.replicas.every(r => r.version === '0.1.0' && !r.draining))
  t.equal(overview.sessions.total, 6, 'six sessions')
  const full = overview.servers.find(s => s.name === 'full')
  const pooled = overview.servers.find(s => s.name === 'pooled')
  t.equal(full?.mode, 'dedicated')
  t.equal(pooled?.mode, 'pooled')
  t.equal(full?.sessions, 5, 'five dedicated sessions owned across the replicas')
  t.equal(full?.children, 5, 'one child each')
  t.equal(full?.callsPerMinute, 15, 'five initialize and ten tool calls through `full`, counted where they ran')
  t.equal(pooled?.callsPerMinute, 4, 'two tool calls on the pool, and the initialize of each replica\'s pooled connection')
  t.equal(full?.errorsPerMinute, 0)
  t.ok((pooled?.pool.warm ?? 0) + (pooled?.pool.inUse ?? 0) >= 1, 'the pooled server\'s pool has a connection')
  t.same(overview.tenants.map(x => [x.name, x.sessions, x.callsPerMinute]), [['acme', 4, 13], ['beta', 2, 6]], 'per tenant: sessions and calls')

  // Sessions: filtered, paged, never the id.
  const acmeFull = await admin<SessionPage>(a.url, '/sessions?tenant=acme&server=full')
  t.equal(acmeFull.body.total, 3)
  t.same(acmeFull.body.sessions.map(s => s.session).sort(), made.filter(s => s.tenant === 'acme' && s.server === 'full').map(s => shortHash(s.sid)).sort(), 'digests of the sessions made')
  for (const s of made) t.notOk(acmeFull.text.includes(s.sid), 'no session id in the answer')
  t.ok(acmeFull.body.sessions.every(s => ids.includes(s.owner ?? '') && s.client === 'raw' && s.subject.length > 0), 'owner, client name and subject digest')
  const page = await admin<SessionPage>(b.url, '/sessions?limit=2&offset=4')
  t.equal(page.body.total, 6)
  t.equal(page.body.sessions.length, 2, 'the last page')
  const pooledPage = await admin<SessionPage>(b.url, '/sessions?server=pooled')
  t.match(pooledPage.body.sessions, [{ pooled: true, owner: null }], 'a pooled session has no owner')
  t.equal((await admin(a.url, '/sessions?tenant=no%20such')).status, 400, 'a filter that is no name: 400')

  // End, from B, a session owned by A.
  const ownedByA = acmeFull.body.sessions.find(s => s.owner === ids[0])
  t.ok(ownedByA, 'a session owned by A')
  const victim = made.find(s => shortHash(s.sid) === ownedByA?.session)!
  const ended = await admin<{ ended: string, server: string, tenant: string }>(b.url, `/sessions/${ownedByA!.session}`, { method: 'DELETE' })
  t.equal(ended.status, 200)
  t.same(ended.body, { ended: ownedByA!.session, server: 'full', tenant: 'acme' })
  for (const r of replicas) {
    const after = await callTool(r.url, 'full', bearer(victim.key), victim, 'echo', { text: 'gone?' }, 99)
    t.equal(after.status, 404, `the ended session is 404 through ${r.name}`)
  }
  await eventually('A stopped the backend', () => a.logs.find(l => l.audit === 'session.ended' && l.reason === 'ended by an operator') ?? (b.logs.find(l => l.audit === 'session.ended' && l.reason === 'ended by an operator')))
  t.ok(b.logs.some(l => l.audit === 'admin.action' && l.action === 'session.end' && l.session === ownedByA!.session), 'an audit line on B')
  // A read its listing within the last second (it is cached that long): five left once it reads again.
  await eventually('five left, seen from A', async () => (await admin<SessionPage>(a.url, '/sessions')).body.total === 5 ? true : undefined, 5000, 200)
  t.equal((await admin(a.url, `/sessions/${ownedByA!.session}`, { method: 'DELETE' })).status, 404, 'ending it again: 404')
  const stopped = await eventually('A\'s children down to four', async () => {
    const o = (await admin<Overview>(b.url, '/overview')).body
    const f = o.servers.find(s => s.name === 'full')
    return f?.children === 4 ? f : undefined
  }, 15_000, 250)
  t.equal(stopped.sessions, 4, 'and its sessions')
  // No log line of either replica carries a session id or the admin token.
  for (const r of replicas) {
    const text = JSON.stringify(r.logs)
    t.notOk(made.some(s => text.includes(s.sid)) || text.includes(TOKEN), `${r.name}'s logs hold no session id, no token`)
  }

  // Reload on every replica, asked on A.
  const fromA = a.logs.length
  const fromB = b.logs.length
  const reload = await admin<{ local: { ok: boolean }, notified: string[] }>(a.url, '/reload', { method: 'POST' })
  t.equal(reload.status, 200)
  t.same(reload.body, { local: { ok: true }, notified: [ids[1]] })
  await eventually('B reloaded', () => b.logs.slice(fromB).find(l => l.msg === 'config reloaded: no change'))
  await eventually('A reloaded', () => a.logs.slice(fromA).find(l => l.msg === 'config reloaded: no change'))
  // The audit line may be written a turn after the reload's own line.
  t.ok(await eventually('an audit line on A', () => a.logs.slice(fromA).some(l => l.audit === 'admin.action' && l.action === 'config.reload') ? true : undefined), 'an audit line on A')
  const after = await eventually('B\'s summary shows its reload', async () => {
    const o = (await admin<Overview>(a.url, '/overview')).body
    return o.replicas.every(r => r.lastReload?.ok === true) ? o : undefined
  }, 15_000, 250)
  t.equal(after.replicas.length, 2)
})
