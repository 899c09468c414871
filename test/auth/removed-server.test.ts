// With tenants, a server removed by a reload answers its sessions' next request, and a
// new initialize, with 404 as without tenants (the client's cue that the session is gone; the
// example config promises it), not the 403 of a server the tenant may not use. A server that
// exists but belongs to another tenant stays 403.
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { callTool, initMessage, newKey, openSession, post, PUBLIC_URL } from '../helpers/auth.js'

t.test('a server removed by a reload: 404 for its sessions and for a new initialize; another tenant\'s server: 403', async t => {
  const acme = newKey('acme-bot')
  const beta = newKey('beta-bot')
  const config = (servers: string[]): Record<string, unknown> => ({
    auth: { publicUrl: PUBLIC_URL },
    tenants: {
      acme: { apiKeys: [acme.entry], servers: Object.fromEntries(servers.map(s => [s, {}])) },
      beta: { apiKeys: [beta.entry], servers: { other: {} } }
    },
    servers: { ...Object.fromEntries(servers.map(s => [s, stdioFixture('full-server')])), other: stdioFixture('full-server') }
  })
  const gw = await startGateway(t, config(['keep', 'gone']))
  const credential = { 'x-api-key': acme.key }
  const session = await openSession(gw.url, 'gone', credential)
  t.equal((await callTool(gw.url, 'gone', credential, session, 'echo', { text: 'x' })).status, 200, 'served before the reload')

  const applied = await gw.gateway.live.apply(parseConfig({ listen: { host: '127.0.0.1', port: 0 }, log: { level: 'silent' }, ...config(['keep']) }))
  t.same(applied.change.servers.removed, ['gone'])
  const after = await callTool(gw.url, 'gone', credential, session, 'echo', { text: 'x' })
  t.equal(after.status, 404, 'the removed server\'s session: 404')
  t.match(after.message, { error: { message: /gone/ } })
  const init = await post(gw.url, '/mcp/gone', initMessage(), credential)
  t.equal(init.status, 404, 'a new initialize: 404')
  t.equal((await post(gw.url, '/mcp/never-was', initMessage(), credential)).status, 404, 'a server never configured: 404')
  t.equal((await post(gw.url, '/mcp/other', initMessage(), credential)).status, 403, 'another tenant\'s server: 403')
  t.equal((await post(gw.url, '/mcp/gone', initMessage())).status, 401, 'no credential: still 401 first')
})
