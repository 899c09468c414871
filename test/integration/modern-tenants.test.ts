// 2026-07-28 requests under tenants: the same credentials, isolation and policy as
// sessions. No credential is 401 with the challenge; a tenant's pool is its own (its upstream env
// reaches only its children); a parked call's requestState is refused to any other principal; the
// tool policy hides and refuses tools; the rate limit counts modern requests too.
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, newKey, PUBLIC_URL } from '../helpers/auth.js'
import { textOf } from '../helpers/wait.js'
import { envelope, last, modernPost } from '../helpers/modern.js'

const acme = newKey('acme-bot')
const acmeOther = newKey('acme-other')
const globex = newKey('globex-bot')

/** The envelope without clientInfo (optional, SPEC M-2). */
const meta = (capabilities: Record<string, unknown> = {}): Record<string, unknown> => {
  const { 'io.modelcontextprotocol/clientInfo': _, ...rest } = envelope(capabilities)
  return rest
}

async function modern (base: string, key: string | null, method: string, params: Record<string, unknown>, id = 1): Promise<{ status: number, headers: Headers, body: Record<string, unknown> }> {
  const answer = await modernPost(`${base}/mcp/full`, method, params, id, key !== null ? bearer(key) : {})
  return { status: answer.status, headers: answer.headers, body: last(answer) }
}

t.test('modern requests are authenticated, isolated per principal and held to the tenant policy', async t => {
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: {
        apiKeys: [acme.entry, acmeOther.entry],
        servers: { full: { tools: { deny: ['env', 'add*'] }, upstream: { env: { ACME_MARK: 'acme' } } } },
        limits: { requestsPerSecond: 1, burst: 30 }
      },
      globex: { apiKeys: [globex.entry], servers: { full: { upstream: { env: { GLOBEX_MARK: 'globex' } } } } }
    },
    servers: { full: stdioFixture('full-server', [], { inheritEnv: [] }) }
  })
  const base = gw.url

  const anonymous = await modern(base, null, 'tools/list', { _meta: meta() })
  t.equal(anonymous.status, 401, 'no credential: 401')
  t.equal(anonymous.headers.get('www-authenticate'), `Bearer resource_metadata="${PUBLIC_URL}/.well-known/oauth-protected-resource/mcp/full"`)

  const listed = await modern(base, acme.key, 'tools/list', { _meta: meta() })
  const names = ((listed.body.result as { tools: Array<{ name: string }> }).tools).map(tool => tool.name)
  t.ok(names.includes('echo'), 'allowed tools are listed')
  t.notOk(names.some(n => n === 'env' || n.startsWith('add')), 'denied tools are not listed')
  const denied = await modern(base, acme.key, 'tools/call', { name: 'env', arguments: {}, _meta: meta() })
  t.match(denied.body, { error: { code: -32602 } }, 'a denied tool is refused as unknown')

  // Each tenant's pool is its own: its children get its upstream env, never the other's.
  const globexEnv = await modern(base, globex.key, 'tools/call', { name: 'env', arguments: {}, _meta: meta() })
  const globexText = textOf(globexEnv.body.result)
  t.match(globexText, /GLOBEX_MARK/, "globex's child has globex's env")
  t.notMatch(globexText, /ACME_MARK/, "and not acme's")

  // A parked call belongs to the principal that started it.
  const round = await modern(base, acme.key, 'tools/call', { name: 'sample', arguments: { prompt: 'mine' }, _meta: meta({ sampling: {} }) }, 5)
  const result = round.body.result as { resultType: string, requestState: string, inputRequests: Record<string, unknown> }
  t.equal(result.resultType, 'input_required')
  const key = Object.keys(result.inputRequests)[0] as string
  const answer = { [key]: { role: 'assistant', model: 'm', content: { type: 'text', text: 'stolen' } } }
  const otherTenant = await modern(base, globex.key, 'tools/call', { name: 'sample', arguments: { prompt: 'mine' }, _meta: meta({ sampling: {} }), requestState: result.requestState, inputResponses: answer }, 6)
  t.equal(otherTenant.status, 400, "another tenant's retry is refused")
  t.match(otherTenant.body, { error: { code: -32602 } })
  const otherSubject = await modern(base, acmeOther.key, 'tools/call', { name: 'sample', arguments: { prompt: 'mine' }, _meta: meta({ sampling: {} }), requestState: result.requestState, inputResponses: answer }, 7)
  t.equal(otherSubject.status, 400, "another subject of the same tenant is refused too")
  const own = await modern(base, acme.key, 'tools/call', { name: 'sample', arguments: { prompt: 'mine' }, _meta: meta({ sampling: {} }), requestState: result.requestState, inputResponses: { [key]: { role: 'assistant', model: 'm', content: { type: 'text', text: 'mine indeed' } } } }, 8)
  t.equal(textOf(own.body.result), 'mine indeed', 'the owner still completes it: the refusals did not consume the state')

  // The tenant's request budget counts modern requests like any other.
  let limited: { status: number, headers: Headers } | undefined
  for (let i = 0; i < 40 && limited === undefined; i++) {
    const r = await modern(base, acme.key, 'tools/list', { _meta: meta() }, 100 + i)
    if (r.status === 429) limited = r
  }
  t.ok(limited !== undefined, 'the rate limit is reached')
  t.ok(Number(limited?.headers.get('retry-after')) >= 1, 'with Retry-After')
})
