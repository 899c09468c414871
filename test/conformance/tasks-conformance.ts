// The conformance suite's Tasks-extension scenarios (tasks-*, io.modelcontextprotocol/tasks) run
// three ways, side by side (docs/behaviour.md "2026-07-28 Tasks"):
//   direct   the 2026-07-28 Tasks fixture (test/fixtures/modern-tasks-server.ts) on its own;
//   relayed  the same fixture behind the gateway as a `protocol: modern` server (its tasks relayed);
//   hosted   a 2025-era stdio server with the same tools and no tasks of its own
//            (test/fixtures/slow-tools-server.ts) behind the gateway with `tasks.hostAfterMs: 500`.
// Prints each scenario's passed and failed checks per way, and the failures. Exits 1 when the
// relayed run scores other than the direct one (a relay must be transparent); the hosted run's
// failures are what time-based hosting cannot do (a tool that answers or asks at once is no task).
//
//   npm run build && node dist/test/conformance/tasks-conformance.js
import { spawn } from 'node:child_process'
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { buildGateway } from '../../src/app.js'
import { parseConfig } from '../../src/config/load.js'
import { createLogger } from '../../src/telemetry/logger.js'
import { startTasksServer } from '../fixtures/modern-tasks-server.js'

const ROOT = resolve(fileURLToPath(import.meta.url), '../../../..')
const TOOLS = join(ROOT, 'tools/conformance')
const SUITE = 'node_modules/@modelcontextprotocol/conformance/dist/index.js'
const SCENARIOS = [
  'tasks-capability-negotiation', 'tasks-dispatch-and-envelope', 'tasks-lifecycle', 'tasks-mrtr-composition', 'tasks-mrtr-input',
  'tasks-request-headers', 'tasks-request-state-removal', 'tasks-required-task-error', 'tasks-status-notifications', 'tasks-wire-fields'
]

interface Check { id: string, status: string, errorMessage?: string }

async function runScenario (url: string, scenario: string): Promise<Check[]> {
  const out = await mkdtemp(join(tmpdir(), 'tasks-conformance-'))
  try {
    await new Promise<void>(done => {
      const child = spawn('npx', ['--no-install', 'node', SUITE, 'server', '--url', url, '--scenario', scenario, '--spec-version', '2026-07-28', '--force', '-o', out], { cwd: TOOLS, stdio: 'ignore' })
      child.on('exit', () => { done() })
      child.on('error', () => { done() })
    })
    const dir = (await readdir(out)).find(d => d.startsWith(`server-${scenario}`))
    if (dir === undefined) return [{ id: 'no-checks-written', status: 'FAILURE' }]
    return JSON.parse(await readFile(join(out, dir, 'checks.json'), 'utf8')) as Check[]
  } finally {
    await rm(out, { recursive: true, force: true })
  }
}

const tally = (checks: Check[]): string => `${checks.filter(c => c.status === 'SUCCESS').length}/${checks.filter(c => c.status === 'FAILURE').length}`

const fixture = await startTasksServer()
const config = parseConfig({
  listen: { host: '127.0.0.1', port: 0 },
  log: { level: 'warn' },
  servers: {
    relayed: { transport: 'streamable-http', url: fixture.url, protocol: 'modern' },
    hosted: { transport: 'stdio', command: process.execPath, args: [join(ROOT, 'dist/test/fixtures/slow-tools-server.js')], sessions: 'pooled', tasks: { hostAfterMs: 500 } }
  }
})
const gateway = await buildGateway(config, { log: createLogger('warn', 'tasks-conformance') })
const base = await gateway.app.listen({ host: '127.0.0.1', port: 0 })
let differs = false
const failures: string[] = []
console.log('scenario                        direct  relayed  hosted   (passed/failed checks)')
try {
  for (const scenario of SCENARIOS) {
    const [direct, relayed, hosted] = [await runScenario(fixture.url, scenario), await runScenario(`${base}/mcp/relayed`, scenario), await runScenario(`${base}/mcp/hosted`, scenario)]
    if (tally(direct) !== tally(relayed)) differs = true
    console.log(`${scenario.padEnd(32)}${tally(direct).padEnd(8)}${tally(relayed).padEnd(9)}${tally(hosted)}`)
    for (const [way, checks] of [['direct', direct], ['relayed', relayed], ['hosted', hosted]] as const) {
      for (const c of checks.filter(c => c.status === 'FAILURE')) failures.push(`  ${way} ${scenario}:${c.id} ${(c.errorMessage ?? '').slice(0, 160)}`)
    }
  }
} finally {
  await gateway.app.close()
  await fixture.close()
}
if (failures.length > 0) console.log(`failures:\n${failures.join('\n')}`)
process.exit(differs ? 1 : 0)
