// `mcp-gateway key <tenant> <id>`: a new key and the config line for it; the line pasted into a
// config lets exactly that key in.
import { execFile } from 'node:child_process'
import { createHash } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t from 'tap'
import { parse } from 'yaml'
import { keyCommand } from '../../src/auth/key-command.js'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, openSession, PUBLIC_URL } from '../helpers/auth.js'

const MAIN = fileURLToPath(new URL('../../src/main.js', import.meta.url))
const run = promisify(execFile)

function parseOutput (out: string): { key: string, line: string } {
  const lines = out.trimEnd().split('\n')
  if (lines.length !== 4) throw new Error(`expected 4 lines, got: ${out}`)
  return { key: lines[1] ?? '', line: lines[3] ?? '' }
}

t.test('the output: a prefixed 256-bit key and its config line', async t => {
  const { key, line } = parseOutput(keyCommand(['acme', 'ci-bot']))
  t.match(key, /^mcpgw_[A-Za-z0-9_-]{43}$/)
  t.equal(line, `- { id: ci-bot, sha256: "${createHash('sha256').update(key).digest('hex')}" }`)
  t.not(parseOutput(keyCommand(['acme', 'ci-bot'])).key, key, 'a new key every time')
})

t.test('bad arguments are refused with the usage', async t => {
  for (const args of [[], ['acme'], ['acme', 'id', 'extra'], ['a b', 'id'], ['acme', '-x'], ['acme', 'a/b']]) {
    t.throws(() => keyCommand(args), { code: 'GW_ERR_CONFIG_INVALID', message: /Usage: mcp-gateway key TENANT ID/ }, JSON.stringify(args))
  }
})

t.test('node dist/src/main.js key: the pasted line lets the key in', async t => {
  const { stdout } = await run(process.execPath, [MAIN, 'key', 'acme', 'ci-bot'])
  const { key, line } = parseOutput(stdout)
  const apiKeys = parse(line) as unknown[]
  const gw = await startGateway(t, {
    auth: { publicUrl: PUBLIC_URL },
    tenants: { acme: { apiKeys, servers: { full: {} } } },
    servers: { full: stdioFixture('full-server') }
  })
  t.ok((await openSession(gw.url, 'full', bearer(key))).sid)
  const other = parseOutput((await run(process.execPath, [MAIN, 'key', 'acme', 'ci-bot'])).stdout).key
  const res = await fetch(`${gw.url}/mcp/full`, { method: 'POST', headers: { ...bearer(other), 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: '{}' })
  t.equal(res.status, 401, 'another key with the same id is not in')

  const bad = await run(process.execPath, [MAIN, 'key', 'acme']).then(() => null, (err: { code: number, stderr: string }) => err)
  t.equal(bad?.code, 2)
  t.match(bad?.stderr, /key needs exactly a tenant and a key id/)
})
