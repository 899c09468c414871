// Mcp-Param-* headers as pure functions (M-17): which `x-mcp-header` marks are valid, and
// what one tools/call sends. The wire: test/integration/modern-backend.test.ts.
import t from 'tap'
import { encodeHeaderValue, paramHeaders, scanHeaderDeclarations } from '../../src/backends/mcp-param-headers.js'

t.test('valid marks are found along properties, at any depth', async t => {
  const scan = scanHeaderDeclarations({
    type: 'object',
    properties: {
      region: { type: 'string', 'x-mcp-header': 'Region' },
      plain: { type: 'string' },
      nested: { type: 'object', properties: { flag: { type: 'boolean', 'x-mcp-header': 'Flag' } } }
    }
  })
  t.same(scan, { valid: true, declarations: [{ path: ['region'], headerName: 'Region' }, { path: ['nested', 'flag'], headerName: 'Flag' }] })
  t.same(scanHeaderDeclarations({ type: 'object' }), { valid: true, declarations: [] }, 'no marks')
  t.same(scanHeaderDeclarations(undefined), { valid: true, declarations: [] }, 'no schema')
})

t.test('invalid marks make the tool invalid', async t => {
  const cases: Array<[string, unknown]> = [
    ['on the root', { type: 'object', 'x-mcp-header': 'Root' }],
    ['under items', { type: 'object', properties: { list: { type: 'array', items: { type: 'string', 'x-mcp-header': 'Item' } } } }],
    ['under anyOf', { type: 'object', anyOf: [{ properties: { a: { type: 'string', 'x-mcp-header': 'A' } } }] }],
    ['not a token', { type: 'object', properties: { a: { type: 'string', 'x-mcp-header': 'Has Space' } } }],
    ['empty', { type: 'object', properties: { a: { type: 'string', 'x-mcp-header': '' } } }],
    ['on an object', { type: 'object', properties: { a: { type: 'object', 'x-mcp-header': 'Obj' } } }],
    ['on a number', { type: 'object', properties: { a: { type: 'number', 'x-mcp-header': 'Num' } } }],
    ['twice, case-insensitively', { type: 'object', properties: { a: { type: 'string', 'x-mcp-header': 'Dup' }, b: { type: 'string', 'x-mcp-header': 'dup' } } }]
  ]
  for (const [name, schema] of cases) t.equal(scanHeaderDeclarations(schema).valid, false, name)
})

t.test('values: header-safe as they are, anything else as a Base64 sentinel', async t => {
  t.equal(encodeHeaderValue('eu-west-1'), 'eu-west-1')
  t.equal(encodeHeaderValue('Zürich'), `=?base64?${Buffer.from('Zürich').toString('base64')}?=`)
  t.equal(encodeHeaderValue(' padded'), `=?base64?${Buffer.from(' padded').toString('base64')}?=`, 'surrounding whitespace')
  t.equal(encodeHeaderValue(''), '=?base64??=', 'empty')
  t.equal(encodeHeaderValue('=?base64?abc?='), `=?base64?${Buffer.from('=?base64?abc?=').toString('base64')}?=`, 'a literal that looks like a sentinel')
})

t.test('one call: marked arguments become headers; absent or null ones do not', async t => {
  const declarations = [{ path: ['region'], headerName: 'Region' }, { path: ['nested', 'flag'], headerName: 'Flag' }, { path: ['count'], headerName: 'Count' }]
  t.same(paramHeaders(declarations, { region: 'eu', nested: { flag: true }, count: 3 }), { 'mcp-param-region': 'eu', 'mcp-param-flag': 'true', 'mcp-param-count': '3' })
  t.same(paramHeaders(declarations, { region: null, nested: {} }), {}, 'null and absent: no header')
  t.same(paramHeaders(declarations, { region: { not: 'primitive' }, count: 2 ** 60 }), {}, 'not a primitive, or an unsafe integer: no header')
})
