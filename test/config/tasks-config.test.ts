// `servers.<n>.tasks` (tasks the gateway hosts for 2026-07-28 clients): validated like the rest of
// the config (the same check as --check-config), its defaults applied, refused where it means nothing.
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'

const stdio = (extra: Record<string, unknown>): Record<string, unknown> => ({ servers: { s: { transport: 'stdio', command: 'node', ...extra } } })

t.test('servers.<n>.tasks', async t => {
  t.equal(parseConfig(stdio({})).servers.s?.tasks, undefined, 'off unless configured')
  t.same(parseConfig(stdio({ tasks: { hostAfterMs: 5000 } })).servers.s?.tasks, { hostAfterMs: 5000, ttlMs: 3_600_000, pollIntervalMs: 1000 }, 'defaults applied')
  const http = parseConfig({ servers: { h: { transport: 'streamable-http', url: 'http://127.0.0.1:1/mcp', tasks: { hostAfterMs: 0, ttlMs: 60_000 } } } })
  t.same(http.servers.h?.tasks, { hostAfterMs: 0, ttlMs: 60_000, pollIntervalMs: 1000 }, 'HTTP servers too')
  for (const [what, tasks] of [
    ['hostAfterMs is required', {}],
    ['a negative hostAfterMs', { hostAfterMs: -1 }],
    ['a ttl under a second', { hostAfterMs: 1, ttlMs: 10 }],
    ['an unknown key', { hostAfterMs: 1, after: 2 }]
  ] as const) {
    t.throws(() => parseConfig(stdio({ tasks })), { code: 'GW_ERR_CONFIG_INVALID' }, `refused: ${what}`)
  }
  t.throws(() => parseConfig({ servers: { s: { transport: 'stdio', command: 'node' }, a: { transport: 'aggregate', members: [{ server: 's' }], tasks: { hostAfterMs: 1 } } } }),
    { code: 'GW_ERR_CONFIG_INVALID' }, 'refused on an aggregate')
})
