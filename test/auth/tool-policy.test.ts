// Pure logic of the tool policy: globs, allow/deny precedence, tools/list filtering.
import t from 'tap'
import { TenantDirectory } from '../../src/auth/tenants.js'
import { compileToolPolicy, filterToolsList, filterToolsListOf, toolNameOf, toolPolicies } from '../../src/auth/tool-policy.js'
import { parseConfig } from '../../src/config/load.js'

t.test('globs: * matches any run, everything else is literal', async t => {
  const p = compileToolPolicy({ allow: ['search_*', 'create_issue', 'a.b', '*_x_*'] })
  t.ok(p.allows('search_code'))
  t.ok(p.allows('search_'), '* may match nothing')
  t.ok(p.allows('create_issue'))
  t.notOk(p.allows('create_issues'), 'anchored at the end')
  t.notOk(p.allows('xcreate_issue'), 'anchored at the start')
  t.ok(p.allows('a.b'))
  t.notOk(p.allows('aXb'), '. is literal, not a regex wildcard')
  t.ok(p.allows('1_x_2'))
  t.notOk(p.allows('delete_repo'))
})

t.test('deny wins over allow; no allow list allows everything not denied', async t => {
  const p = compileToolPolicy({ allow: ['*'], deny: ['delete_*'] })
  t.ok(p.allows('search'))
  t.notOk(p.allows('delete_repo'))
  const q = compileToolPolicy({ deny: ['danger'] })
  t.ok(q.allows('anything'))
  t.notOk(q.allows('danger'))
  const none = compileToolPolicy({ allow: [] })
  t.notOk(none.allows('echo'), 'an empty allow list allows nothing')
})

t.test('regex metacharacters in names stay literal', async t => {
  const p = compileToolPolicy({ allow: ['(x)+[y]?$'] })
  t.ok(p.allows('(x)+[y]?$'))
  t.notOk(p.allows('xy'))
})

t.test('toolPolicies: only tenants with a tools entry on that server have a policy; a replaced table applies', async t => {
  const settings = (allow: string[]): ReturnType<typeof parseConfig> => parseConfig({
    auth: { publicUrl: 'https://gw.example.com' },
    tenants: { acme: { servers: { github: { tools: { allow } }, everything: {} } } },
    servers: { github: { transport: 'streamable-http', url: 'https://h.example.com/mcp' }, everything: { transport: 'stdio', command: 'x' } }
  })
  const tenants = new TenantDirectory(settings(['search_*']))
  const policyOf = toolPolicies(tenants)
  t.equal(policyOf(null, 'github'), null, 'anonymous')
  t.equal(policyOf('acme', 'everything'), null, 'no tools key')
  t.equal(policyOf('other', 'github'), null, 'unknown tenant')
  const policy = policyOf('acme', 'github')
  t.ok(policy?.allows('search_code'))
  t.notOk(policy?.allows('delete_repo'))
  t.equal(policyOf('acme', 'github'), policy, 'compiled once')
  tenants.replace(settings(['delete_*']))
  t.ok(policyOf('acme', 'github')?.allows('delete_repo'), 'the new table\'s policy')
  t.notOk(policyOf('acme', 'github')?.allows('search_code'))
})

t.test('filterToolsList keeps only allowed tools and every other field', async t => {
  const p = compileToolPolicy({ allow: ['echo', 'add'], deny: ['add'] })
  const result = { tools: [{ name: 'echo', inputSchema: {} }, { name: 'add' }, { name: 'sampleLLM' }, 'junk', null], nextCursor: 'c2' }
  t.same(filterToolsList(result, p), { tools: [{ name: 'echo', inputSchema: {} }], nextCursor: 'c2' })
  t.same(filterToolsList({ other: 1 }, p), { other: 1 }, 'not a tools list: unchanged')
  t.equal(filterToolsList(null, p), null)
})

t.test('toolNameOf reads a string name only', async t => {
  t.equal(toolNameOf({ name: 'echo', arguments: {} }), 'echo')
  t.equal(toolNameOf({ name: 3 }), undefined)
  t.equal(toolNameOf(undefined), undefined)
  t.equal(toolNameOf([]), undefined)
})

t.test('filterToolsListOf filters tools/list answers only, and only under a policy', async t => {
  const p = compileToolPolicy({ allow: ['echo'] })
  const result = { tools: [{ name: 'echo' }, { name: 'add' }] }
  t.same(filterToolsListOf('tools/list', result, p), { tools: [{ name: 'echo' }] })
  t.equal(filterToolsListOf('tools/list', result, null), result)
  t.equal(filterToolsListOf('prompts/list', result, p), result)
})
