// The package as a user gets it: `npm pack`, the tarball installed into an empty project, and the
// `mcp-gateway` command run through npx (what docs/configuration.md and the README tell). Packs
// the dist that the test run was built from (`--ignore-scripts`: `npm test` has just built it).
// Slow by nature (an npm install, from the local npm cache when it has the dependencies).
import { execFile } from 'node:child_process'
import { mkdtemp, rm, writeFile, readFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t from 'tap'

const run = promisify(execFile)
// dist/test/integration/packed-cli.test.js -> the repository root
const repo = fileURLToPath(new URL('../../../', import.meta.url))

interface Outcome { code: number, stdout: string, stderr: string }

async function exec (cmd: string, args: string[], cwd: string): Promise<Outcome> {
  try {
    const { stdout, stderr } = await run(cmd, args, { cwd, timeout: 120_000, maxBuffer: 16 << 20, env: { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' } })
    return { code: 0, stdout, stderr }
  } catch (err) {
    const e = err as { code?: unknown, stdout?: string, stderr?: string }
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' }
  }
}

t.test('the packed package installs and its mcp-gateway command works through npx', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-pack-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })

  const packed = await exec('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', dir], repo)
  t.equal(packed.code, 0, `npm pack: ${packed.stderr}`)
  const [info] = JSON.parse(packed.stdout) as Array<{ filename: string, files: Array<{ path: string }> }>
  if (info === undefined) throw new Error('npm pack printed no package')
  const files = info.files.map(f => f.path)
  for (const needed of ['dist/src/main.js', 'dist/src/http/admin/console/index.html', 'config/gateway.schema.json', 'config/gateway.example.yaml', 'package.json', 'README.md']) {
    t.ok(files.includes(needed), `the package has ${needed}`)
  }
  t.notOk(files.some(f => f.startsWith('dist/test/') || f.startsWith('dist/bench/') || f.startsWith('src/') || f.startsWith('test/')), 'no tests, benches or TypeScript sources')
  t.notOk(files.some(f => f.endsWith('.map')), 'no source maps (their sources are not shipped)')
  const version = (JSON.parse(await readFile(join(repo, 'package.json'), 'utf8')) as { version: string }).version

  const project = join(dir, 'project')
  await exec('mkdir', [project], dir)
  await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'probe', private: true }))
  const installed = await exec('npm', ['install', '--prefer-offline', '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund', join(dir, info.filename)], project)
  t.equal(installed.code, 0, `npm install of the tarball: ${installed.stderr.slice(-2000)}`)

  // npx once, as the docs tell it; then the same installed command directly (npx adds seconds).
  const viaNpx = await exec('npx', ['--no-install', 'mcp-gateway', '--version'], project)
  t.same([viaNpx.code, viaNpx.stdout], [0, `mcp-gateway ${version}\n`], 'npx mcp-gateway --version')
  const npx = async (...args: string[]): Promise<Outcome> => await exec(join(project, 'node_modules', '.bin', 'mcp-gateway'), args, project)
  const v = await npx('-V')
  t.same([v.code, v.stdout], [0, `mcp-gateway ${version}\n`], '--version')
  const help = await npx('--help')
  t.equal(help.code, 0)
  t.match(help.stdout, /^Usage: mcp-gateway[\s\S]*--check-config FILE[\s\S]*--version/, '--help tells the usage')

  await writeFile(join(project, 'good.yaml'), 'servers:\n  files:\n    transport: stdio\n    command: node\n    args: [server.js]\n')
  const good = await npx('--check-config', 'good.yaml')
  t.same([good.code, good.stdout], [0, 'mcp-gateway: good.yaml is valid (1 server: files)\n'])
  await writeFile(join(project, 'bad.yaml'), 'servers:\n  files:\n    transport: stdio\n    command: node\n    poolSize: 8\n    poolMax: 2\n')
  const bad = await npx('--check-config', 'bad.yaml')
  t.equal(bad.code, 1, 'an invalid config exits 1')
  t.match(bad.stderr, '/servers/files/poolMax: must be at least poolSize', 'and says why')
  const shipped = await npx('--check-config', 'node_modules/mcp-gateway/config/gateway.schema.json')
  t.equal(shipped.code, 1, 'a file that is not a config is refused, not a crash')
})
