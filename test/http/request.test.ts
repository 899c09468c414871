// The body parser and the Accept check that every POST passes through (http/request.ts). Both
// skip work on the hot path: a short body is not walked for its depth, and an Accept
// value already allowed is not parsed again. These tests hold the rules those shortcuts keep.
import Fastify, { type FastifyError, type FastifyInstance, type FastifyRequest } from 'fastify'
import t, { type Test } from 'tap'
import { checkAccept, GET_ACCEPTS, MAX_JSON_DEPTH, POST_ACCEPTS, registerJsonParser } from '../../src/http/request.js'
import { isGatewayError } from '../../src/core/errors.js'

async function parserApp (t: Test): Promise<FastifyInstance> {
  const app = Fastify()
  registerJsonParser(app)
  app.setErrorHandler((err: FastifyError, _req, reply) => {
    void reply.code(isGatewayError(err) ? err.statusCode ?? 500 : 500).send({ code: err.code, message: err.message })
  })
  app.post('/', async req => ({ parsed: req.body }))
  await app.ready()
  t.teardown(() => app.close())
  return app
}

const nested = (depth: number): string => '['.repeat(depth) + ']'.repeat(depth)

t.test('JSON nesting: accepted up to the limit, refused one level deeper, short or long', async t => {
  const app = await parserApp(t)
  const post = async (payload: string | Buffer): Promise<{ status: number, body: Record<string, unknown> }> => {
    const res = await app.inject({ method: 'POST', url: '/', headers: { 'content-type': 'application/json' }, payload })
    return { status: res.statusCode, body: res.json() }
  }
  t.equal((await post(nested(MAX_JSON_DEPTH))).status, 200, `${MAX_JSON_DEPTH} levels: parsed`)
  const deep = await post(nested(MAX_JSON_DEPTH + 1))
  t.equal(deep.status, 400, `${MAX_JSON_DEPTH + 1} levels, the shortest body that deep: refused`)
  t.match(deep.body.message, /nested deeper than 256/)
  // Padding after the nesting makes the body long without making it deeper.
  const padded = `{"a":${nested(MAX_JSON_DEPTH)},"pad":"${'x'.repeat(2000)}"}`
  t.equal((await post(padded)).status, 400, 'an object around the limit: one level deeper, refused')
  t.equal((await post(`{"a":${nested(MAX_JSON_DEPTH - 1)},"pad":"${'x'.repeat(2000)}"}`)).status, 200, 'and exactly at the limit: parsed')
  t.equal((await post(JSON.stringify({ text: '['.repeat(3000) }))).status, 200, 'brackets inside a string are not nesting')
  const invalid = await post(Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]))
  t.equal(invalid.status, 400, 'a body that is not UTF-8: refused')
  t.match(invalid.body.message, /not valid UTF-8/)
  t.same((await post('{"text":"héllo ✓"}')).body, { parsed: { text: 'héllo ✓' } }, 'UTF-8 text decoded as sent')
})

t.test('Accept: an allowed value is remembered, and a different one is checked again', async t => {
  const req = (accept: string | undefined): FastifyRequest => ({ headers: accept === undefined ? {} : { accept } }) as unknown as FastifyRequest
  const refused = (accept: string | undefined, types: readonly string[]): boolean => {
    try {
      checkAccept(req(accept), types)
      return false
    } catch (err) {
      return isGatewayError(err) && err.statusCode === 406
    }
  }
  t.notOk(refused('application/json, text/event-stream', POST_ACCEPTS), 'both listed: allowed')
  t.notOk(refused('application/json, text/event-stream', POST_ACCEPTS), 'again, from the memory')
  t.ok(refused('application/json', POST_ACCEPTS), 'then one missing: refused')
  t.ok(refused(undefined, POST_ACCEPTS), 'no Accept: refused')
  t.notOk(refused('*/*', POST_ACCEPTS), '*/* allowed')
  t.ok(refused('application/json', GET_ACCEPTS), 'the GET list is remembered apart: its first value checked')
  t.notOk(refused('text/*;q=0.9', GET_ACCEPTS), 'type/* with parameters: allowed')
  t.ok(refused('application/json', POST_ACCEPTS), 'a POST refused after a GET value was allowed')
})
