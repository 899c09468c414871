// Runs the official MCP conformance suite (docs/spec-rules.md §11.2) against the gateway, with our
// conformance fixture as the only backend, reached over stdio or over Streamable HTTP:
// `npm run test:conformance` runs each backend (stdio, http, modern) at the 2025-11-25
// requirements (sessions) and at the 2026-07-28 ones (stateless requests), one after the other,
// and stdio-pooled at the 2025-11-25 ones (a pooled session must score what a dedicated one
// does; 2026-07-28 requests take the pool whichever mode the server has).
// Exit status follows the suite's: only scored scenarios count (tasks-* and the pending header
// scenarios run but are not scored at 2026-07-28).
//
//   node dist/test/conformance/run-conformance.js [--backend stdio|stdio-pooled|http|modern]
//
// 1. backend stdio (default): the config fronts `node dist/test/fixtures/conformance-server.js`
//    as stdio server `conformance`; backend stdio-pooled: the same with `sessions: pooled` (each
//    session borrows a pooled child per request); backend http: starts dist/test/fixtures/conformance-http.js,
//    reads the URL it prints and fronts it as streamable-http server `conformance`; backend
//    modern: the same with dist/test/fixtures/conformance-modern.js, a 2026-07-28 server (v2 SDK),
//    fronted with `protocol: modern`; backend aggregate: the stdio fixture as the first
//    member of aggregate `workspace` with `prefix: ""`, the full-server fixture as the second
//    (its names prefixed `other__`), and the suite pointed at /mcp/workspace. Either way
//    the gateway listens on 127.0.0.1 and a free port (loopback, no auth: C-1, C-2);
// 2. starts the gateway and waits for GET /readyz to answer 200;
// 3. runs `npx conformance server --url …/mcp/conformance --requirements 2025-11-25` from
//    tools/conformance, whose pinned node@22 binary comes first on npx's PATH (the suite needs
//    Node >= 22; the gateway stays on Node 20);
// 4. prints a summary of failing checks, stops the gateway (and the HTTP fixture), exits with
//    the suite's exit code.
//
// Expected failures: tools/conformance/expected-failures.<backend>.yml when it exists (a
// limitation of one backend transport only), else tools/conformance/expected-failures.yml.
//
// Knobs (environment; --backend wins over CONFORMANCE_BACKEND):
//   CONFORMANCE_BACKEND       stdio (default), stdio-pooled, http or modern: how the gateway reaches the fixture
//   CONFORMANCE_REQUIREMENTS  revision whose frozen requirement set runs (default 2025-11-25)
//   CONFORMANCE_SCENARIO      run one scenario instead (at the requirements' wire version)
//   CONFORMANCE_URL           test an already running endpoint; no gateway is started
//   CONFORMANCE_RESULTS_DIR   where checks.json files go (default tools/conformance/results/<time>-<backend>);
//                             gateway.log (and fixture.log for http) land there too
//   CONFORMANCE_TIMEOUT_MS    per-scenario timeout passed to the suite
//   CONFORMANCE_SUITE         0.2.0-alpha.12 (default) or 0.1.16 (its active and pending scenarios)
import { spawn } from 'node:child_process'
import type { ChildProcess } from 'node:child_process'
import { existsSync, createWriteStream } from 'node:fs'
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises'
import { once } from 'node:events'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { freePort } from '../helpers/wait.js'

// dist/test/conformance/run-conformance.js -> repository root
const ROOT = resolve(fileURLToPath(import.meta.url), '../../../..')
const TOOLS = join(ROOT, 'tools/conformance')
const GATEWAY = join(ROOT, 'dist/src/main.js')
const FIXTURE_STDIO = join(ROOT, 'dist/test/fixtures/conformance-server.js')
const FIXTURE_HTTP = join(ROOT, 'dist/test/fixtures/conformance-http.js')
const FIXTURE_MODERN = join(ROOT, 'dist/test/fixtures/conformance-modern.js')
const BACKENDS = ['stdio', 'stdio-pooled', 'http', 'modern', 'aggregate'] as const
/** Backend aggregate: the fixture as the first member (names unchanged) of this aggregate, beside the full-server fixture. */
const AGGREGATE_NAME = 'workspace'
const FIXTURE_OTHER = join(ROOT, 'dist/test/fixtures/full-server.js')
type Backend = typeof BACKENDS[number]
const SERVER_NAME = 'conformance'
const READY_TIMEOUT_MS = 30_000
const STOP_GRACE_MS = 10_000
const GATEWAY_LOG_TAIL = 40

const env = process.env
const requirements = env.CONFORMANCE_REQUIREMENTS ?? '2025-11-25'
/** The suite versions tools/conformance pins, by the path of each one's CLI (relative to tools/conformance). */
const SUITES: Record<string, string> = {
  '0.2.0-alpha.12': 'node_modules/@modelcontextprotocol/conformance/dist/index.js',
  '0.1.16': 'node_modules/conformance-0.1.16/dist/index.js'
}
const suiteVersion = env.CONFORMANCE_SUITE ?? '0.2.0-alpha.12'
const suiteCli: string = SUITES[suiteVersion] ?? ''
if (suiteCli === '') throw new Error(`CONFORMANCE_SUITE: use one of ${Object.keys(SUITES).join(', ')}`)
const { values: flags } = parseArgs({ options: { backend: { type: 'string' } } })
const backendName = flags.backend ?? env.CONFORMANCE_BACKEND ?? 'stdio'

interface Check {
  id: string
  status: string
  errorMessage?: string
}

function say (line: string): void {
  process.stdout.write(`[run-conformance] ${line}\n`)
}


// Commands run() is waiting on. Each runs in its own process group (npx does not pass SIGTERM on
// to the suite it starts), so a signal to this runner ends the whole group instead of leaving
// the suite to fail against a stopped gateway.
const running = new Set<ChildProcess>()

function stopGroup (child: ChildProcess): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return
  try {
    process.kill(-child.pid, 'SIGTERM')
  } catch {
    // the group is gone already
  }
}

/** Runs a command to completion with inherited output; resolves to its exit code. */
async function run (command: string, args: string[], cwd: string): Promise<number> {
  const child = spawn(command, args, { cwd, stdio: 'inherit', detached: true })
  running.add(child)
  try {
    const [code, signal] = await once(child, 'exit') as [number | null, NodeJS.Signals | null]
    return code ?? (signal === null ? 1 : 128)
  } finally {
    running.delete(child)
  }
}

async function waitReady (url: string, gateway: ChildProcess): Promise<void> {
  const deadline = Date.now() + READY_TIMEOUT_MS
  while (Date.now() < deadline) {
    if (gateway.exitCode !== null || gateway.signalCode !== null) {
      throw new Error(`gateway exited early (code ${String(gateway.exitCode)}, signal ${String(gateway.signalCode)})`)
    }
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
      await res.body?.cancel()
      if (res.status === 200) return
    } catch {
      // not listening yet
    }
    await sleep(200)
  }
  throw new Error(`${url} did not answer 200 within ${READY_TIMEOUT_MS} ms`)
}

async function stopChild (name: string, child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = once(child, 'exit')
  child.kill('SIGTERM')
  const stopped = await Promise.race([exited.then(() => true), sleep(STOP_GRACE_MS, false)])
  if (!stopped) {
    say(`${name} ignored SIGTERM for ${STOP_GRACE_MS} ms; sending SIGKILL`)
    child.kill('SIGKILL')
    await exited
  }
}

/**
 * Starts the Streamable HTTP fixture on a free port and resolves to the URL it prints as its
 * first stdout line. Its stdin stays open as a lifeline (--exit-with-stdin): should this runner
 * die without stopping it, the fixture sees stdin close and exits. Its output goes to logPath.
 */
async function startHttpFixture (file: string, logPath: string): Promise<{ child: ChildProcess, url: string }> {
  const child = spawn(process.execPath, [file, '--port', '0', '--exit-with-stdin', '--log-requests'], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] })
  const log = createWriteStream(logPath)
  child.stderr?.pipe(log)
  const lines = createInterface({ input: child.stdout! })
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the HTTP fixture printed no URL within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS)
      const onExit = (code: number | null, signal: NodeJS.Signals | null): void => {
        clearTimeout(timer)
        reject(new Error(`the HTTP fixture exited early (code ${String(code)}, signal ${String(signal)}); see ${logPath}`))
      }
      child.once('exit', onExit)
      child.once('error', reject)
      lines.once('line', line => {
        clearTimeout(timer)
        child.off('exit', onExit)
        try {
          const parsed = JSON.parse(line) as { url?: unknown }
          if (typeof parsed.url !== 'string') throw new Error('no url member')
          resolve(parsed.url)
        } catch (err) {
          reject(new Error(`the HTTP fixture's first line is not {"url": …}: ${line} (${String(err)})`))
        }
      })
    })
    // Anything it prints later is log material too.
    lines.on('line', line => log.write(`${line}\n`))
    return { child, url }
  } catch (err) {
    await stopChild('HTTP fixture', child)
    throw err
  }
}

/** Reads every <dir>/<scenario dir>/checks.json the suite wrote. */
async function readResults (dir: string): Promise<Map<string, Check[]>> {
  const results = new Map<string, Check[]>()
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => [])
  for (const entry of entries) {
    if (!entry.isDirectory()) continue
    const file = join(dir, entry.name, 'checks.json')
    if (!existsSync(file)) continue
    // Directory names are server-<scenario>-<ISO timestamp with dashes>.
    const scenario = entry.name.replace(/^server-/, '').replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, '')
    try {
      results.set(scenario, JSON.parse(await readFile(file, 'utf8')) as Check[])
    } catch (err) {
      results.set(scenario, [{ id: 'unreadable-checks-json', status: 'FAILURE', errorMessage: String(err) }])
    }
  }
  return results
}

function summarize (results: Map<string, Check[]>): void {
  let passed = 0
  let failed = 0
  let warnings = 0
  const lines: string[] = []
  for (const [scenario, checks] of [...results].sort(([a], [b]) => a.localeCompare(b))) {
    for (const check of checks) {
      if (check.status === 'SUCCESS') passed++
      if (check.status === 'FAILURE') failed++
      if (check.status === 'WARNING') warnings++
      if (check.status === 'FAILURE' || check.status === 'WARNING') {
        lines.push(`  ${check.status === 'FAILURE' ? 'FAIL' : 'WARN'} ${scenario}:${check.id} ${check.errorMessage ?? ''}`.trimEnd())
      }
    }
  }
  say(`${results.size} scenarios, ${passed} checks passed, ${failed} failed, ${warnings} warnings (all scenarios, scored or not)`)
  for (const line of lines) process.stdout.write(`${line}\n`)
}

async function main (): Promise<number> {
  if (!existsSync(join(TOOLS, 'node_modules/.bin/conformance'))) {
    say('installing tools/conformance (npm ci)')
    const code = await run('npm', ['ci', '--no-audit', '--no-fund'], TOOLS)
    if (code !== 0) return code
  }
  if (!(BACKENDS as readonly string[]).includes(backendName)) {
    say(`unknown backend ${JSON.stringify(backendName)}: use ${BACKENDS.join(' or ')}`)
    return 2
  }
  const backend = backendName as Backend
  const resultsDir = resolve(env.CONFORMANCE_RESULTS_DIR ?? join(TOOLS, 'results', `${new Date().toISOString().replace(/[:.]/g, '-')}-${backend}`))
  await mkdir(resultsDir, { recursive: true })

  let gateway: ChildProcess | undefined
  let fixture: ChildProcess | undefined
  let tmp: string | undefined
  let logPath: string | undefined
  let code = 1
  let url = env.CONFORMANCE_URL
  const onSignal = (signal: NodeJS.Signals): void => {
    say(`${signal}: stopping`)
    for (const child of running) stopGroup(child)
    const done = Promise.allSettled([
      gateway === undefined ? undefined : stopChild('gateway', gateway),
      fixture === undefined ? undefined : stopChild('HTTP fixture', fixture)
    ]).then(async () => { if (tmp !== undefined) await rm(tmp, { recursive: true, force: true }) })
    void done.finally(() => process.exit(130))
  }
  process.once('SIGINT', onSignal)
  process.once('SIGTERM', onSignal)

  try {
    if (url === undefined) {
      const fixtureFile = backend === 'http' ? FIXTURE_HTTP : backend === 'modern' ? FIXTURE_MODERN : FIXTURE_STDIO
      for (const file of [GATEWAY, fixtureFile]) {
        if (!existsSync(file)) throw new Error(`${file} is missing: run \`npm run build\` first`)
      }
      let server: Record<string, unknown>
      if (backend === 'http' || backend === 'modern') {
        const started = await startHttpFixture(fixtureFile, join(resultsDir, 'fixture.log'))
        fixture = started.child
        // modern: a 2026-07-28 server (v2 SDK); 2026 requests are relayed, 2025 sessions bridged.
        server = { transport: 'streamable-http', url: started.url, ...(backend === 'modern' ? { protocol: 'modern' } : {}) }
        say(`HTTP fixture pid ${String(fixture.pid)} at ${started.url}, log ${join(resultsDir, 'fixture.log')}`)
      } else {
        server = { transport: 'stdio', command: process.execPath, args: [FIXTURE_STDIO], ...(backend === 'stdio-pooled' ? { sessions: 'pooled' } : {}) }
      }
      const servers: Record<string, unknown> = { [SERVER_NAME]: server }
      if (backend === 'aggregate') {
        servers.other = { transport: 'stdio', command: process.execPath, args: [FIXTURE_OTHER] }
        servers[AGGREGATE_NAME] = { transport: 'aggregate', members: [{ server: SERVER_NAME, prefix: '' }, { server: 'other' }] }
      }
      const port = await freePort()
      tmp = await mkdtemp(join(tmpdir(), 'mcp-gw-conformance-'))
      const configPath = join(tmp, 'gateway.yaml')
      // JSON is YAML: no serializer needed. Loopback without tenants means no auth (C-2), and
      // the default allowed hosts/origins are the loopback names dns-rebinding-protection wants.
      const config = {
        listen: { host: '127.0.0.1', port },
        log: { level: 'info' },
        shutdown: { drainMs: 0 },
        servers
      }
      await writeFile(configPath, JSON.stringify(config, null, 2))
      logPath = join(resultsDir, 'gateway.log')
      const logFile = createWriteStream(logPath)
      gateway = spawn(process.execPath, [GATEWAY, '--config', configPath], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] })
      gateway.stdout?.pipe(logFile)
      gateway.stderr?.pipe(logFile)
      say(`gateway pid ${String(gateway.pid)} on 127.0.0.1:${port}, log ${logPath}`)
      await waitReady(`http://127.0.0.1:${port}/readyz`, gateway)
      url = `http://127.0.0.1:${port}/mcp/${backend === 'aggregate' ? AGGREGATE_NAME : SERVER_NAME}`
    }

    // `npx --no-install node …`: npx puts tools/conformance's node_modules/.bin first on PATH, so
    // `node` is its pinned Node 22; each suite is named by path (two versions are installed).
    const args = ['--no-install', 'node', suiteCli, 'server', '--url', url, '-o', resultsDir]
    if (env.CONFORMANCE_SCENARIO !== undefined) {
      args.push('--scenario', env.CONFORMANCE_SCENARIO, '--spec-version', requirements)
    } else if (suiteVersion === '0.1.16') {
      // 0.1.16 knows no requirement sets: its active and pending scenarios, all of them.
      args.push('--suite', 'all')
    } else {
      args.push('--requirements', requirements)
    }
    if (env.CONFORMANCE_TIMEOUT_MS !== undefined) args.push('--timeout', env.CONFORMANCE_TIMEOUT_MS)
    const expectedFailures = [join(TOOLS, `expected-failures.${backend}.yml`), join(TOOLS, 'expected-failures.yml')].find(file => existsSync(file))
    if (expectedFailures !== undefined) args.push('--expected-failures', expectedFailures)
    say(`npx ${args.join(' ')}`)
    code = await run('npx', args, TOOLS)

    summarize(await readResults(resultsDir))
    say(`backend ${backend}: conformance exited with ${code}; results in ${resultsDir}`)
    return code
  } finally {
    if (gateway !== undefined) await stopChild('gateway', gateway)
    // After the gateway, so the gateway's own shutdown can still end its upstream sessions.
    if (fixture !== undefined) await stopChild('HTTP fixture', fixture)
    if (tmp !== undefined) await rm(tmp, { recursive: true, force: true })
    // CI keeps only the console: show the end of the gateway's log when something failed.
    if (code !== 0 && logPath !== undefined) {
      const tail = (await readFile(logPath, 'utf8').catch(() => '')).split('\n').slice(-GATEWAY_LOG_TAIL).join('\n')
      say(`last lines of ${logPath}:\n${tail}`)
    }
  }
}

main().then(code => { process.exitCode = code }, (err: unknown) => {
  say(`error: ${err instanceof Error ? err.message : String(err)}`)
  process.exitCode = 1
})
