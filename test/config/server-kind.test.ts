// The one mapping from a server's config to the kind of its sessions: pure, so a unit test.
import t from 'tap'
import { backendConfigOf, isAggregateConfig, kindNameOf, serverConfigOf } from '../../src/config/server-kind.js'
import type { ServerConfig } from '../../src/config/schema.js'

const stdio = (sessions?: 'pooled' | 'dedicated'): ServerConfig => ({ transport: 'stdio', command: 'node', ...(sessions !== undefined ? { sessions } : {}) }) as unknown as ServerConfig
const http = (transport: 'streamable-http' | 'sse'): ServerConfig => ({ transport, url: 'http://127.0.0.1:1/mcp' }) as unknown as ServerConfig
const aggregate = { transport: 'aggregate', members: [{ server: 'a' }] } as unknown as ServerConfig

t.test('each config gives one kind', async t => {
  t.equal(kindNameOf(stdio()), 'routed', 'a stdio server is routed (dedicated children)')
  t.equal(kindNameOf(stdio('dedicated')), 'routed')
  t.equal(kindNameOf(stdio('pooled')), 'pooled')
  t.equal(kindNameOf(http('streamable-http')), 'direct', 'a Streamable HTTP backend is reached by every replica')
  t.equal(kindNameOf(http('sse')), 'routed', 'a legacy SSE backend holds one connection: routed')
  t.equal(kindNameOf(aggregate), 'aggregate')
  t.equal(kindNameOf(undefined), 'routed', 'a server a reload removed: routed, whose owner ends it')
})

t.test('guards and look-ups are safe for any name the schema accepts', async t => {
  const live = { servers: { everything: stdio() } }
  t.equal(serverConfigOf(live, 'everything'), live.servers.everything)
  for (const name of ['constructor', 'toString', 'valueOf', 'hasOwnProperty', '__proto__']) {
    t.equal(serverConfigOf(live, name), undefined, `${name} is no server`)
  }
  t.ok(isAggregateConfig(aggregate))
  t.notOk(isAggregateConfig(stdio()))
  t.notOk(isAggregateConfig(undefined))
  t.equal(backendConfigOf(aggregate), undefined, 'an aggregate has no backend of its own')
  const server = http('streamable-http')
  t.equal(backendConfigOf(server), server, 'a backend server is its own backend config')
})
