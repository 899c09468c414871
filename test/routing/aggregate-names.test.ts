// The naming rules of aggregate servers (docs/behaviour.md, "Aggregating servers"): pure logic, so
// a unit test.
import t from 'tap'
import { exposeNames, fitName, MAX_NAME, templateMatches } from '../../src/routing/aggregate/names.js'

const tools = (...names: string[]): Array<{ name: string }> => names.map(name => ({ name }))

t.test('prefix and separator; an empty prefix passes names through; order is member then listing', async t => {
  const out = exposeNames([
    { server: 'github', prefix: 'github', entries: tools('create_issue', 'search') },
    { server: 'search', prefix: '', entries: tools('web_search') }
  ], '__')
  t.same(out.map(e => [e.exposed, e.server, e.name]), [
    ['github__create_issue', 'github', 'create_issue'],
    ['github__search', 'github', 'search'],
    ['web_search', 'search', 'web_search']
  ])
})

t.test('a collision keeps both callable under distinct names, the earlier member keeps the plain one, and is reported', async t => {
  const reported: string[] = []
  const members = [
    { server: 'a', prefix: '', entries: tools('search', 'fetch') },
    { server: 'b', prefix: '', entries: tools('search') },
    { server: 'c', prefix: '', entries: tools('search', 'search__c') }
  ]
  const out = exposeNames(members, '__', (e, plain) => { reported.push(`${plain}->${e.exposed}`) })
  const names = out.map(e => e.exposed)
  t.equal(new Set(names).size, names.length, 'every exposed name is unique')
  t.same(names, ['search', 'fetch', 'search__b', 'search__c', 'search__c__c'])
  t.same(reported, ['search->search__b', 'search->search__c', 'search__c->search__c__c'])
  const again = exposeNames([
    { server: 'a', prefix: '', entries: tools('x', 'x__b') },
    { server: 'b', prefix: '', entries: tools('x') }
  ], '__').map(e => e.exposed)
  t.same(again, ['x', 'x__b', 'x__b-2'], 'a numbered suffix when the member-named one is taken too')
  t.same(exposeNames(members, '__').map(e => e.exposed), names, 'the same lists give the same names (every replica, every restart)')
})

t.test('names over 64 characters are shortened deterministically, stay unique and callable', async t => {
  const long = 'x'.repeat(70)
  const longer = `${'x'.repeat(70)}y`
  const out = exposeNames([{ server: 'm', prefix: 'member', entries: tools(long, longer) }], '__')
  for (const e of out) t.ok(e.exposed.length <= MAX_NAME, `${e.exposed.length} <= 64`)
  t.not(out[0]?.exposed, out[1]?.exposed, 'two long names sharing their first 55 characters stay distinct')
  t.equal(out[0]?.name, long, 'the member\'s own name is kept for routing')
  t.equal(fitName(`member__${long}`), out[0]?.exposed, 'the rule is fitName, stable')
  t.match(out[0]?.exposed, /^member__x+-[0-9a-f]{8}$/)
  t.equal(fitName('short'), 'short')
  t.equal(fitName('y'.repeat(64)), 'y'.repeat(64), '64 characters pass unchanged')
})

t.test('resource templates', async t => {
  t.ok(templateMatches('test://items/{id}', 'test://items/42'))
  t.notOk(templateMatches('test://items/{id}', 'test://items/42/more'), '{var} is one segment')
  t.ok(templateMatches('file:///{+path}', 'file:///a/b/c.txt'), '{+var} spans segments')
  t.ok(templateMatches('search://q{?query,limit}', 'search://q?query=x&limit=2'))
  t.notOk(templateMatches('test://items/{id}', 'other://items/1'))
  t.ok(templateMatches('a.b://{x}', 'a.b://y'), 'regular expression characters in the template are literal')
  t.notOk(templateMatches('a.b://{x}', 'aXb://y'))
})
