// LiveConfig (live reload, docs/configuration.md): the diff of servers and tenants, process
// settings kept and reported, the listeners' hook. Pure logic over configs from the real loader.
import t from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { diffNames, isEmptyChange, LiveConfig, sameValue, type ConfigChange } from '../../src/config/live.js'

const stdio = (args: string[] = []): Record<string, unknown> => ({ transport: 'stdio', command: 'node', args })
const tenant = (keys: string[]): Record<string, unknown> => ({ apiKeys: keys.map((k, i) => ({ id: `k${i}`, sha256: k.repeat(64) })), servers: { keep: {} } })
/** Tenants need the public origin their resource URLs derive from. */
const AUTH = { publicUrl: 'https://mcp.example.com' }

t.test('sameValue: deep, key order does not matter, arrays in order', async t => {
  t.ok(sameValue({ a: 1, b: [1, { c: 'x' }] }, { b: [1, { c: 'x' }], a: 1 }))
  t.notOk(sameValue({ a: [1, 2] }, { a: [2, 1] }))
  t.notOk(sameValue({ a: 1 }, { a: 1, b: undefined }))
  t.notOk(sameValue([], {}))
  t.notOk(sameValue(null, {}))
  t.notOk(sameValue('1', 1))
})

t.test('diffNames: added, changed and removed, in file order', async t => {
  t.same(diffNames({ a: 1, b: { x: 1 }, c: 3 }, { b: { x: 2 }, a: 1, d: 4 }), { added: ['d'], changed: ['b'], removed: ['c'] })
  t.same(diffNames({}, {}), { added: [], changed: [], removed: [] })
})

t.test('apply: routing settings replaced, process settings kept and reported, listeners told', async t => {
  const before = parseConfig({ log: { level: 'info' }, servers: { keep: stdio(), change: stdio(['1']), gone: stdio() } })
  const live = new LiveConfig(before)
  const seen: ConfigChange[] = []
  live.onChange(change => { seen.push(change) })
  const failing = live.onChange(() => { throw new Error('listener broke') })
  const servers = live.servers
  const next = parseConfig({ log: { level: 'debug' }, listen: { port: 9 }, servers: { keep: stdio(), change: stdio(['2']), fresh: stdio() }, auth: AUTH, tenants: { acme: tenant(['a']) } })
  const { change, failures } = await live.apply(next)

  t.same(change.servers, { added: ['fresh'], changed: ['change'], removed: ['gone'] })
  t.same(change.tenants, { added: ['acme'], changed: [], removed: [] })
  t.equal(change.auth, true, 'auth gained its publicUrl')
  t.same(change.restartNeeded, ['listen', 'log'])
  t.equal(live.current.log.level, 'info', 'the process setting stays')
  t.equal(live.current.listen.port, 8080)
  t.equal(live.servers, next.servers, 'the new servers object is served as it is (no copy)')
  t.not(live.servers, servers)
  t.same(Object.keys(live.current.tenants ?? {}), ['acme'])
  t.ok(Object.isFrozen(live.current), 'the served config is frozen')
  t.equal(seen.length, 1, 'the listener heard the change')
  t.equal(seen[0], change)
  t.equal(failures.length, 1, 'a failing listener is reported, not thrown')
  t.match(failures[0], { message: 'listener broke' })

  failing()
  const again = await live.apply(parseConfig({ servers: { keep: stdio(), change: stdio(['2']), fresh: stdio() }, log: { level: 'info' } }))
  t.same(again.change.tenants, { added: [], changed: [], removed: ['acme'] }, 'tenants removed')
  t.equal(live.current.tenants, undefined, 'no tenants key once they are all gone')
  t.equal(again.failures.length, 0, 'an unregistered listener is not called')
  t.ok(isEmptyChange((await live.apply(live.current)).change), 'the same config again changes nothing')
})

t.test('apply: a tenant whose key is revoked is changed; auth changes are seen', async t => {
  const live = new LiveConfig(parseConfig({ servers: { keep: stdio() }, auth: AUTH, tenants: { acme: tenant(['a', 'b']), other: tenant(['c']) } }))
  const { change } = await live.apply(parseConfig({ servers: { keep: stdio() }, auth: { publicUrl: 'https://other.example.com' }, tenants: { acme: tenant(['a']), other: tenant(['c']) } }))
  t.same(change.tenants, { added: [], changed: ['acme'], removed: [] })
  t.equal(change.auth, true)
  t.same(change.restartNeeded, [])
  t.equal(live.current.auth.publicUrl, 'https://other.example.com')
})
