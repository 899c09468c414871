// The 2026-07-28 rules of the client face as pure functions (docs/spec-rules.md §4 and §5.7):
// classification (M-14), the validation ladder and its order, header decoding, log filtering and
// the shape of a bridged result. The wire is tested in test/integration/modern.test.ts.
import t from 'tap'
import { isGatewayError, jsonRpcCodeOf, toJsonRpcError, type GatewayError } from '../../src/core/errors.js'
import type { JsonRpcRequest } from '../../src/core/jsonrpc.js'
import {
  checkModernNotification, checkModernRequest, classifyPost, completeResult, decodeHeaderValue, legacyParams, logPasses,
  META_CLIENT_CAPABILITIES, META_LOG_LEVEL, META_PROTOCOL_VERSION, META_SERVER_INFO, type ModernHeaders
} from '../../src/http/modern-rules.js'

const V = '2026-07-28'
const envelope = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ [META_PROTOCOL_VERSION]: V, [META_CLIENT_CAPABILITIES]: {}, ...extra })
const request = (method: string, params: Record<string, unknown> = {}, meta: Record<string, unknown> | null = envelope()): JsonRpcRequest =>
  ({ jsonrpc: '2.0', id: 7, method, params: meta === null ? params : { ...params, _meta: meta } })
const headersFor = (req: JsonRpcRequest, extra: ModernHeaders = {}): ModernHeaders => ({ protocolVersion: V, method: req.method, ...extra })

function refusal (fn: () => unknown): { code: number, status: number | undefined, err: GatewayError } {
  try {
    fn()
  } catch (err) {
    if (!isGatewayError(err)) throw err
    return { code: jsonRpcCodeOf(err), status: err.statusCode, err }
  }
  throw new Error('expected a refusal')
}

t.test('classification: the envelope claim or a modern version header makes a POST modern; everything else stays legacy', async t => {
  t.equal(classifyPost(request('tools/list'), {}).era, 'modern', 'claim without headers')
  t.equal(classifyPost(request('tools/list', {}, null), { protocolVersion: V }).era, 'modern', 'modern header without claim (answered -32602 later)')
  t.equal(classifyPost(request('tools/list', {}, null), {}).era, 'legacy', 'no claim, no header')
  t.equal(classifyPost(request('tools/list', {}, null), { protocolVersion: '2025-11-25' }).era, 'legacy', 'legacy header')
  t.equal(classifyPost(request('initialize', { protocolVersion: '2025-11-25', capabilities: {} }, null), {}).era, 'legacy', 'initialize')
  t.equal(classifyPost({ jsonrpc: '2.0', id: 's.1', result: {} }, { protocolVersion: V }).era, 'legacy', 'a posted response')
  t.equal(classifyPost([request('tools/list', {}, null)], {}).era, 'legacy', 'all-legacy batch')
  t.equal(classifyPost({ jsonrpc: '2.0', method: 'notifications/cancelled' }, { protocolVersion: V }).era, 'modern', 'modern notification by header')
  t.equal(classifyPost('garbage', {}).era, 'legacy', 'not an object: the legacy path refuses it')
  const batch = refusal(() => classifyPost([request('tools/list')], {}))
  t.equal(batch.code, -32600, 'a batch holding a modern request is an invalid request')
  const init = refusal(() => classifyPost(request('initialize', { protocolVersion: '2025-11-25' }, null), { protocolVersion: V }))
  t.equal(init.code, -32020, 'initialize under a modern header is a header mismatch')
  t.equal(classifyPost(request('initialize'), {}).era, 'modern', 'initialize with a valid modern envelope is a modern request (then 404)')
})

t.test('the validation ladder: each rule, its code and status, and which wins when several break', async t => {
  const ok = request('tools/call', { name: 'echo' })
  const env = checkModernRequest(ok, headersFor(ok, { name: 'echo' }))
  t.same(env, { protocolVersion: V, clientCapabilities: {} }, 'a valid request yields its envelope')

  const noMeta = request('tools/list', {}, null)
  t.match(refusal(() => checkModernRequest(noMeta, headersFor(noMeta))), { code: -32602, status: 400 }, 'no _meta: -32602, 400')
  const noCaps = request('tools/list', {}, { [META_PROTOCOL_VERSION]: V })
  t.match(refusal(() => checkModernRequest(noCaps, headersFor(noCaps))), { code: -32602, status: 400 }, 'no clientCapabilities')
  const badLevel = request('tools/list', {}, envelope({ [META_LOG_LEVEL]: 'loud' }))
  t.match(refusal(() => checkModernRequest(badLevel, headersFor(badLevel))), { code: -32602 }, 'unknown log level')
  const badInfo = request('tools/list', {}, envelope({ 'io.modelcontextprotocol/clientInfo': 'me' }))
  t.match(refusal(() => checkModernRequest(badInfo, headersFor(badInfo))), { code: -32602 }, 'clientInfo not an object')

  const future = request('tools/list', {}, envelope({ [META_PROTOCOL_VERSION]: '2099-01-01' }))
  const unsupported = refusal(() => checkModernRequest(future, headersFor(future, { protocolVersion: '2099-01-01' })))
  t.match(unsupported, { code: -32022, status: 400 }, 'unsupported version: -32022, 400')
  t.same(toJsonRpcError(unsupported.err, 7).error.data, { supported: [V], requested: '2099-01-01', source: 'gateway', code: 'GW_ERR_VERSION_UNSUPPORTED' }, 'data names supported and requested')

  t.match(refusal(() => checkModernRequest(future, headersFor(future))), { code: -32020 }, 'header/body version mismatch wins over the unsupported version')
  t.match(refusal(() => checkModernRequest(ok, headersFor(ok, { method: 'tools/list', name: 'echo' }))), { code: -32020, status: 400 }, 'Mcp-Method mismatch')
  t.match(refusal(() => checkModernRequest(ok, { method: 'tools/call', name: 'echo' })), { code: -32020 }, 'MCP-Protocol-Version absent')
  t.match(refusal(() => checkModernRequest(ok, { protocolVersion: V, name: 'echo' })), { code: -32020 }, 'Mcp-Method absent')
  t.match(refusal(() => checkModernRequest(ok, headersFor(ok))), { code: -32020 }, 'Mcp-Name absent while the body names a tool')
  t.match(refusal(() => checkModernRequest(ok, headersFor(ok, { name: 'other' }))), { code: -32020 }, 'Mcp-Name mismatch')
  t.match(refusal(() => checkModernRequest(ok, headersFor(ok, { name: '=?base64?!!!?=' }))), { code: -32020 }, 'malformed Base64 sentinel')
  t.ok(checkModernRequest(ok, headersFor(ok, { name: `=?base64?${Buffer.from('echo').toString('base64')}?=` })), 'a Base64 sentinel that decodes to the body value passes')
  const read = request('resources/read', { uri: 'test://x' })
  t.ok(checkModernRequest(read, headersFor(read, { name: 'test://x' })), 'resources/read mirrors params.uri')

  for (const method of ['initialize', 'ping', 'logging/setLevel', 'resources/subscribe', 'resources/unsubscribe']) {
    const removed = request(method)
    t.match(refusal(() => checkModernRequest(removed, headersFor(removed))), { code: -32601, status: 404 }, `${method} was removed: 404, -32601`)
  }
  const removedNoHeaders = request('ping')
  t.match(refusal(() => checkModernRequest(removedNoHeaders, { protocolVersion: V })), { code: -32020 }, 'missing headers are found before the removed method')
})

t.test('notifications: only a readable claim that matches the headers', async t => {
  t.doesNotThrow(() => { checkModernNotification({ jsonrpc: '2.0', method: 'notifications/cancelled' }, { protocolVersion: V }) })
  t.match(refusal(() => { checkModernNotification({ jsonrpc: '2.0', method: 'notifications/x', params: { _meta: { [META_PROTOCOL_VERSION]: 5 } } }, {}) }), { code: -32602 })
  t.match(refusal(() => { checkModernNotification({ jsonrpc: '2.0', method: 'notifications/x' }, { method: 'notifications/y' }) }), { code: -32020 })
})

t.test('header values: Base64 sentinel decoding', async t => {
  t.equal(decodeHeaderValue('plain'), 'plain')
  t.equal(decodeHeaderValue(`=?base64?${Buffer.from('héllo wörld').toString('base64')}?=`), 'héllo wörld')
  t.equal(decodeHeaderValue('=?base64?abc?='), undefined, 'not canonical Base64')
  t.equal(decodeHeaderValue(`=?base64?${Buffer.from([0xff, 0xfe]).toString('base64')}?=`), undefined, 'not UTF-8')
})

t.test('log lines reach a request only at or above the level it asked for', async t => {
  t.notOk(logPasses('error', undefined), 'no logLevel: nothing')
  t.ok(logPasses('error', 'warning'))
  t.ok(logPasses('warning', 'warning'))
  t.notOk(logPasses('info', 'warning'))
  t.notOk(logPasses('bogus', 'debug'), 'an unknown level is not passed')
})

t.test('legacy params: the envelope keys are taken out, other _meta kept', async t => {
  t.same(legacyParams({ name: 'x', _meta: { ...envelope(), progressToken: 3 } }), { name: 'x', _meta: { progressToken: 3 } })
  t.same(legacyParams({ name: 'x', _meta: envelope() }), { name: 'x' })
  t.same(legacyParams(undefined), undefined)
})

t.test('a legacy result made modern: resultType, caching hints on cacheable results only, serverInfo', async t => {
  const info = { name: 'backend', version: '1' }
  const listed = completeResult('tools/list', { tools: [], _meta: { mine: 1 } }, info)
  t.same(listed, { tools: [], resultType: 'complete', ttlMs: 0, cacheScope: 'private', _meta: { mine: 1, [META_SERVER_INFO]: info } })
  t.same(completeResult('resources/read', { contents: [], ttlMs: 5000, cacheScope: 'public' }, undefined), { contents: [], ttlMs: 5000, cacheScope: 'public', resultType: 'complete' }, "the backend's own valid hints are kept")
  t.same(completeResult('resources/read', { contents: [], ttlMs: -1, cacheScope: 'world' }, undefined), { contents: [], ttlMs: 0, cacheScope: 'private', resultType: 'complete' }, 'invalid hints replaced')
  const called = completeResult('tools/call', { content: [] }, undefined)
  t.same(called, { content: [], resultType: 'complete' }, 'no caching hints on a tool result')
  t.same(completeResult('tools/call', null, undefined), { resultType: 'complete' }, 'a non-object result becomes an empty complete result')
})
