// No credential passthrough, and each tenant's upstream values for its own sessions only
// (A-UP-1): a stdio child that reports its environment and an HTTP backend that records
// every request's headers. The client sends its API key as Authorization and X-API-Key, and a
// Cookie; none of them reaches a backend. One process, and two replicas on one Redis (every
// replica opens its own connection to a Streamable HTTP backend session: each must add the same
// tenant's headers, from the session record).
import t, { type Test } from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, newKey, openSession, PUBLIC_URL, type TestKey } from '../helpers/auth.js'
import { startStreamableUpstream, type StreamableUpstream } from '../fixtures/http-upstreams.js'
import { randomPrefix, startRedis } from '../helpers/redis-server.js'
import { startReplica, startRoundRobinProxy } from '../helpers/replicas.js'

const keys: Record<string, TestKey> = { acme: newKey('a-bot'), beta: newKey('b-bot'), gamma: newKey('c-bot') }

function config (upstreamUrl: string): Record<string, unknown> {
  return {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: {
        apiKeys: [keys.acme?.entry],
        servers: {
          env: { upstream: { env: { TENANT_SECRET: 'acme-secret' } } },
          remote: { upstream: { headers: { 'X-Tenant-Token': 'acme-token' } } }
        }
      },
      beta: {
        apiKeys: [keys.beta?.entry],
        servers: {
          env: { upstream: { env: { TENANT_SECRET: 'beta-secret', BETA_ONLY: 'yes' } } },
          remote: { upstream: { headers: { 'X-Tenant-Token': 'beta-token', 'X-Beta-Only': 'yes' } } }
        }
      },
      gamma: { apiKeys: [keys.gamma?.entry], servers: { env: {}, remote: {} } }
    },
    servers: {
      env: stdioFixture('env-server'),
      // The server's own header, which a tenant's value of the same name would override.
      remote: { transport: 'streamable-http', url: upstreamUrl, headers: { 'X-Server-Static': 'static' }, forwardHeaders: ['X-Trace'] }
    }
  }
}

/** Everything a client sends: its key three ways, a cookie, a traced header. */
function clientHeaders (tenant: string): Record<string, string> {
  const key = keys[tenant]?.key ?? ''
  return { ...bearer(key), 'x-api-key': key, cookie: `session=${tenant}-cookie`, 'x-trace': `trace-${tenant}` }
}

const secrets = (): string[] => [...Object.values(keys).map(k => k.key), ...Object.keys(keys).map(k => `${k}-cookie`)]

async function check (t: Test, entry: string, up: StreamableUpstream, rounds: number): Promise<void> {
  const expectedEnv: Record<string, Record<string, string | undefined>> = {
    acme: { TENANT_SECRET: 'acme-secret', BETA_ONLY: undefined },
    beta: { TENANT_SECRET: 'beta-secret', BETA_ONLY: 'yes' },
    gamma: { TENANT_SECRET: undefined, BETA_ONLY: undefined }
  }
  const backendSessions = new Map<string, string>()
  for (const tenant of ['acme', 'beta', 'gamma']) {
    const headers = clientHeaders(tenant)
    // stdio: the child's environment.
    const envSession = await openSession(entry, 'env', headers)
    for (let i = 0; i < rounds; i++) {
      const { message } = await callTool(entry, 'env', headers, envSession, 'environment', {}, 10 + i)
      const text = (message?.result as { content: Array<{ text: string }> } | undefined)?.content[0]?.text ?? '{}'
      const env = JSON.parse(text) as Record<string, string>
      t.match(env, expectedEnv[tenant] ?? {}, `${tenant}: its own variables only`)
      if (tenant !== 'beta') t.notOk('BETA_ONLY' in env, `${tenant}: no BETA_ONLY at all`)
      for (const secret of secrets()) t.notMatch(text, secret, `${tenant}: no client credential in the child's environment`)
    }
    // HTTP: the backend session this tenant's gateway session opened.
    const before = up.requests.length
    const remoteSession = await openSession(entry, 'remote', headers)
    for (let i = 0; i < rounds; i++) {
      const { message } = await callTool(entry, 'remote', headers, remoteSession, 'echo', { message: `${tenant}-${i}` }, 20 + i)
      t.match(message, { result: { content: [{ text: `echo: ${tenant}-${i}` }] } })
    }
    const sids = new Set(up.requests.slice(before).map(r => r.headers['mcp-session-id']).filter((s): s is string => typeof s === 'string'))
    t.equal(sids.size, 1, `${tenant}: one backend session`)
    for (const sid of sids) backendSessions.set(sid, tenant)
  }
  t.ok(up.requests.length > 0)
  for (const r of up.requests) {
    const sid = r.headers['mcp-session-id']
    const tenant = typeof sid === 'string' ? backendSessions.get(sid) : undefined
    const where = `${r.method} ${(r.body as { method?: string } | undefined)?.method ?? ''} (${tenant ?? 'initialize'})`
    t.notOk('authorization' in r.headers, `${where}: no Authorization`)
    t.notOk('x-api-key' in r.headers, `${where}: no X-API-Key`)
    t.notOk('cookie' in r.headers, `${where}: no Cookie`)
    for (const secret of secrets()) t.notMatch(JSON.stringify(r.headers), secret, `${where}: no client credential in any header`)
    t.equal(r.headers['x-server-static'], 'static', `${where}: the server's own header`)
    if (tenant === undefined) continue
    t.equal(r.headers['x-tenant-token'], tenant === 'gamma' ? undefined : `${tenant}-token`, `${where}: the tenant's header`)
    t.equal(r.headers['x-beta-only'], tenant === 'beta' ? 'yes' : undefined, `${where}: no other tenant's header`)
  }
  // The initialize of each backend session carried its own tenant's header and the forwarded trace.
  const inits = up.requests.filter(r => (r.body as { method?: string } | undefined)?.method === 'initialize')
  t.equal(inits.length, 3)
  t.same(inits.map(r => [r.headers['x-tenant-token'], r.headers['x-trace']]), [['acme-token', 'trace-acme'], ['beta-token', 'trace-beta'], [undefined, 'trace-gamma']])
}

t.test('one process', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const gw = await startGateway(t, config(up.url))
  await check(t, gw.url, up, 1)
})

t.test('two replicas on one Redis behind a non-sticky balancer', async t => {
  const up = await startStreamableUpstream()
  t.teardown(up.close)
  const redis = await startRedis(t)
  const cfg = { ...config(up.url), redis: { url: redis.url, keyPrefix: randomPrefix(), leaseMs: 1500, connectTimeoutMs: 2000 } }
  const replicas = await Promise.all(['A', 'B'].map(async name => await startReplica(t, name, cfg)))
  const proxy = await startRoundRobinProxy(t, replicas.map(r => r.url))
  await check(t, proxy.url, up, 3)
  t.ok(proxy.counts.every(c => c > 0), `both replicas served: ${proxy.counts.join(',')}`)
})
