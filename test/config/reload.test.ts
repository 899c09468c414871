// ConfigReloader (live reload) over a real file and a real folder watch: a bad file is
// refused with every problem and changes nothing; reloads never interleave; the watch follows an
// editor's rename-over and a delete-then-create, and ignores saves that change no byte.
import { mkdtemp, rename, rm, unlink, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Writable } from 'node:stream'
import { pino } from 'pino'
import t, { type Test } from 'tap'
import { parseConfig } from '../../src/config/load.js'
import { LiveConfig } from '../../src/config/live.js'
import { ConfigReloader } from '../../src/config/reload.js'
import { eventually } from '../helpers/wait.js'

const stdio = { transport: 'stdio', command: 'node' }
const text = (servers: string[]): string => JSON.stringify({ servers: Object.fromEntries(servers.map(s => [s, stdio])) })

async function setup (t: Test, servers: string[]): Promise<{ file: string, live: LiveConfig, reloader: ConfigReloader, logs: Array<Record<string, unknown>> }> {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-reload-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const file = join(dir, 'gateway.json')
  await writeFile(file, text(servers))
  const logs: Array<Record<string, unknown>> = []
  const sink = new Writable({ write (chunk: Buffer, _enc, done) { logs.push(JSON.parse(String(chunk)) as Record<string, unknown>); done() } })
  const live = new LiveConfig(parseConfig(JSON.parse(text(servers))))
  const reloader = new ConfigReloader({ path: file, live, log: pino({ level: 'info' }, sink) })
  t.teardown(() => { reloader.close() })
  return { file, live, reloader, logs }
}

const outcomes = (logs: Array<Record<string, unknown>>): Array<Record<string, unknown>> =>
  logs.filter(e => typeof e.msg === 'string' && /^config reload(ed| refused)/.test(e.msg))

t.test('a bad file is refused with every problem listed, and the running config stays', async t => {
  const { file, live, reloader, logs } = await setup(t, ['a'])
  const before = live.current
  await writeFile(file, JSON.stringify({ listen: { port: 'x' }, servers: { a: { transport: 'stdio' }, 'bad name': stdio } }))
  const outcome = await reloader.reload('test')
  t.equal(outcome.ok, false)
  const errors = outcome.ok ? [] : outcome.errors
  t.equal(errors.length, 3, `three problems: ${errors.join(' | ')}`)
  for (const path of ['/listen/port', '/servers/a/command', '/servers/bad name']) t.ok(errors.some(e => e.startsWith(path)), `names ${path}`)
  t.equal(live.current, before, 'nothing applied')
  t.match(logs.at(-1), { level: 50, msg: 'config reload refused; the running config stays', trigger: 'test', errors })

  await unlink(file)
  const missing = await reloader.reload('test')
  t.match(missing, { ok: false, errors: [/cannot read .*ENOENT/] })
  t.equal(live.current, before)
})

t.test('a reload reads ${file:} placeholders again: a rotated secret file is picked up', async t => {
  const { file, live, reloader } = await setup(t, ['a'])
  const secret = `${file}.key`
  await writeFile(secret, 'first\n')
  const withSecret = JSON.stringify({ servers: { a: { ...stdio, env: { KEY: `\${file:${secret}}` } } } })
  await writeFile(file, withSecret)
  t.match(await reloader.reload('test'), { ok: true, change: { servers: { changed: ['a'] } } })
  t.same((live.servers.a as { env: Record<string, string> }).env, { KEY: 'first' })
  await writeFile(secret, 'second\n')
  t.match(await reloader.reload('test'), { ok: true, change: { servers: { changed: ['a'] } } }, 'the same config bytes, another secret')
  t.same((live.servers.a as { env: Record<string, string> }).env, { KEY: 'second' })
  await unlink(secret)
  t.match(await reloader.reload('test'), { ok: false, errors: [/\/servers\/a\/env\/KEY: cannot read file .*ENOENT/] }, 'a secret gone: refused')
  t.same((live.servers.a as { env: Record<string, string> }).env, { KEY: 'second' }, 'the running config stays')
})

t.test('reloads run one after another; the last read wins', async t => {
  const { file, live, reloader } = await setup(t, ['a'])
  await writeFile(file, text(['a', 'b']))
  const first = reloader.reload('one')
  const second = reloader.reload('two')
  const [one, two] = await Promise.all([first, second])
  t.match(one, { ok: true, change: { servers: { added: ['b'] } } })
  t.match(two, { ok: true, change: { servers: { added: [], changed: [], removed: [] } } }, 'the second saw the first applied')
  t.same(Object.keys(live.servers), ['a', 'b'])
})

t.test('watch: a rename-over, a save with the same bytes, and a delete-then-create', async t => {
  const { file, live, reloader, logs } = await setup(t, ['a'])
  await reloader.watch(50)
  t.equal(outcomes(logs).length, 0, 'starting the watch reloads nothing')

  await writeFile(`${file}.tmp`, text(['a', 'b']))
  await rename(`${file}.tmp`, file)
  await eventually('reload after rename-over', () => outcomes(logs).length === 1 ? true : undefined)
  t.match(outcomes(logs)[0], { msg: 'config reloaded', trigger: 'watch', servers: { added: ['b'] } })
  t.same(Object.keys(live.servers), ['a', 'b'])

  // The same bytes again, then a real change: only the real change is reloaded.
  await writeFile(file, text(['a', 'b']))
  await new Promise(resolve => setTimeout(resolve, 300))
  await writeFile(file, text(['b']))
  await eventually('reload after in-place save', () => outcomes(logs).length >= 2 ? true : undefined)
  t.equal(outcomes(logs).length, 2, 'the save that changed no byte was not reloaded')
  t.match(outcomes(logs)[1], { msg: 'config reloaded', servers: { removed: ['a'] } })

  // Deleted, then written anew (a ConfigMap swap or a careless editor): the new file is read.
  await unlink(file)
  await new Promise(resolve => setTimeout(resolve, 150))
  await writeFile(file, text(['c']))
  await eventually('reload after re-create', () => outcomes(logs).length >= 3 ? true : undefined)
  t.match(outcomes(logs)[2], { msg: 'config reloaded', servers: { added: ['c'], removed: ['b'] } })
  t.same(Object.keys(live.servers), ['c'])
})
