// The per-request logger (telemetry/logger.ts requestChildLogger): made only when a line is
// logged, and writing exactly the lines a pino child with the same bindings writes.
// Pure logic over real pino loggers writing to memory.
import { Writable } from 'node:stream'
import t from 'tap'
import type { FastifyBaseLogger } from 'fastify'
import { childLogger, createLogger, lazyChild, requestChildLogger } from '../../src/telemetry/logger.js'

function memoryLogger (level: string): { log: ReturnType<typeof createLogger>, lines: () => Array<Record<string, unknown>> } {
  const chunks: string[] = []
  const dest = new Writable({ write (chunk, _encoding, done) { chunks.push(String(chunk)); done() } })
  const log = createLogger(level, 'r1', dest)
  return { log, lines: () => chunks.map(c => JSON.parse(c) as Record<string, unknown>).map(({ time: _time, ...rest }) => rest) }
}

function logSome (l: FastifyBaseLogger): void {
  l.debug('not at info')
  l.info('hello %s', 'x')
  l.info({ a: 1 }, 'with an object')
  l.warn('plain')
  l.info({ b: 2 })
  l.error({ err: new Error('boom') }, 'failed')
  l.child({ sid: 's' }).info('from a child')
}

t.test('a lazy request logger writes what a real child writes', async t => {
  const lazy = memoryLogger('info')
  const real = memoryLogger('info')
  logSome(requestChildLogger().call(null as never, lazy.log, { reqId: 'req-1' }, {}, undefined as never))
  logSome(real.log.child({ reqId: 'req-1' }))
  await new Promise(resolve => setImmediate(resolve))
  t.equal(lazy.lines().length, 6, 'six lines at info')
  t.same(lazy.lines().map(l => { if (typeof l.err === 'object' && l.err !== null) delete (l.err as Record<string, unknown>).stack; return l }),
    real.lines().map(l => { if (typeof l.err === 'object' && l.err !== null) delete (l.err as Record<string, unknown>).stack; return l }), 'the same lines, bindings included')
  t.match(lazy.lines()[0], { replica: 'r1', reqId: 'req-1', msg: 'hello x' })
})

t.test('level, bindings and level changes behave as a child\'s', async t => {
  const { log, lines } = memoryLogger('info')
  const lazy = requestChildLogger().call(null as never, log, { reqId: 'req-2' }, {}, undefined as never)
  t.equal(lazy.level, 'info')
  t.same((lazy as unknown as { bindings: () => unknown }).bindings(), { replica: 'r1', reqId: 'req-2' })
  lazy.debug('dropped')
  lazy.level = 'debug'
  t.equal(log.level, 'info', 'the parent keeps its level')
  lazy.debug('kept')
  await new Promise(resolve => setImmediate(resolve))
  t.same(lines().map(l => l.msg), ['kept'], 'only the line after the level change')
})

t.test('route options get a real child', async t => {
  const { log } = memoryLogger('info')
  const child = requestChildLogger().call(null as never, log, { reqId: 'req-3' }, { level: 'warn' }, undefined as never)
  t.equal(child.level, 'warn')
  t.equal(log.level, 'info')
})

t.test('childLogger adds only the bindings its parent lacks, and writes a child\'s lines', async t => {
  const { log, lines } = memoryLogger('info')
  const session = lazyChild(log, { sid: 'abc', backend: 'full' })
  const backend = childLogger(session, { backend: 'full', pid: 42 })
  t.same(backend.bindings(), { replica: 'r1', sid: 'abc', backend: 'full', pid: 42 }, 'backend is not bound twice')
  backend.warn({ stream: 'stderr' }, 'a line')
  session.info('session line')
  backend.debug('not at info')
  await new Promise(resolve => setImmediate(resolve))
  t.same(lines(), [
    { level: 40, replica: 'r1', sid: 'abc', backend: 'full', pid: 42, stream: 'stderr', msg: 'a line' },
    { level: 30, replica: 'r1', sid: 'abc', backend: 'full', msg: 'session line' }
  ])
})

t.test('a lazy child writes its first lines through its parent and makes a pino child only when it keeps logging', async t => {
  const chunks: string[] = []
  let children = 0
  const { pino } = await import('pino')
  const parent = pino({ base: { replica: 'r1' }, timestamp: false, onChild: () => { children++ } }, new Writable({ write (chunk, _e, done) { chunks.push(String(chunk)); done() } }))
  const lazy = lazyChild(parent, { sid: 's1' })
  lazy.info('one')
  lazy.info({ n: 2 }, 'two')
  lazy.info({ sid: 'given' }, 'three: a key the line gives itself appears once, with its own value')
  t.equal(children, 0, 'three lines, no child made')
  lazy.warn(new Error('an Error alone needs the real child (pino serialises it as err)'))
  t.equal(children, 1, 'made for the Error')
  lazy.info('after')
  await new Promise(resolve => setImmediate(resolve))
  const lines = chunks.map(c => JSON.parse(c) as Record<string, unknown>)
  t.match(lines, [
    { replica: 'r1', sid: 's1', msg: 'one' },
    { replica: 'r1', sid: 's1', n: 2, msg: 'two' },
    { replica: 'r1', sid: 'given' },
    { replica: 'r1', sid: 's1', err: { message: /an Error alone/ } },
    { replica: 'r1', sid: 's1', msg: 'after' }
  ])
  t.equal(chunks[2]?.match(/"sid"/g)?.length, 1, 'sid once in the third line')
  const quiet = lazyChild(parent, { sid: 's2' })
  for (let i = 0; i < 10; i++) quiet.debug('below the level')
  t.equal(children, 1, 'lines below the level make nothing')
  const chatty = lazyChild(parent, { sid: 's3' })
  for (let i = 0; i < 6; i++) chatty.info(`line ${i}`)
  t.equal(children, 2, 'a logger that keeps logging gets its child after a few lines')
})
