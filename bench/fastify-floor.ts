// For reference next to the floor: the floor's own logic (floor-sessions.ts) behind
// Fastify instead of plain node:http, with Fastify's defaults otherwise (no logger, no hooks, no
// plugins). Its ratio to the floor is what the framework the gateway is built on costs by itself.
//
//   node dist/bench/fastify-floor.js <command> [args...]   (same life as minimal-proxy.js)
import Fastify from 'fastify'
import { serveAsChild } from './child-lifecycle.js'
import { floorCommand, FloorSessions } from './floor-sessions.js'

const { command, args } = floorCommand('fastify-floor')
const sessions = new FloorSessions(command, args)

const app = Fastify({ logger: false })
app.removeAllContentTypeParsers()
app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => { done(null, body) })
app.post('/mcp', (req, reply) => {
  sessions.post(req.body as string, req.headers['mcp-session-id'], (status, headers, body) => {
    void reply.code(status).headers(headers).send(body)
  })
})
app.get('/mcp', (_req, reply) => { void reply.code(405).header('allow', 'POST, DELETE').send() })
app.delete('/mcp', (req, reply) => {
  void reply.code(sessions.delete(req.headers['mcp-session-id']) ? 200 : 404).send()
})

const address = await app.listen({ host: '127.0.0.1', port: 0 })
serveAsChild(`${address}/mcp`, async () => {
  sessions.killAll()
  await app.close()
})
