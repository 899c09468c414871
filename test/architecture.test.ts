// The code's shape, as docs/architecture.md draws it: import rules and no import circle
// (dependency-cruiser, .dependency-cruiser.cjs), and no module outside routing/kinds/ (and the
// config's one mapping) asking what kind a session is.
import t from 'tap'
import { readFile, readdir } from 'node:fs/promises'
import { join, relative } from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { cruise, type IConfiguration, type ICruiseResult } from 'dependency-cruiser'

const root = fileURLToPath(new URL('../..', import.meta.url)).replace(/dist\/?$/, '')
const require = createRequire(import.meta.url)

t.test('the import rules hold and src/ has no import circle', async t => {
  const config = require(join(root, '.dependency-cruiser.cjs')) as IConfiguration
  const result = await cruise(['src'], { ruleSet: { forbidden: config.forbidden ?? [] }, ...config.options, baseDir: root, validate: true })
  const output = result.output as ICruiseResult
  const violations = output.summary.violations.map(v => `${v.rule.name}: ${v.from} -> ${v.to}${v.cycle !== undefined ? ` (${v.cycle.map(c => c.name).join(' -> ')})` : ''}`)
  t.ok(output.summary.totalCruised > 100, `the whole of src/ was read (${output.summary.totalCruised} modules)`)
  t.same(violations, [], 'no violation of .dependency-cruiser.cjs')
})

/**
 * The asks left outside routing/kinds/, each with its reason. A new one means a kind-wide feature
 * is being written outside the kinds' modules: put it in each kind instead. None is left: what an
 * owner lease means is the kind's (ownership.ts RelayLease), and whether a server's sessions count
 * toward maxSessions is the config's (config/server-kind.ts).
 */
const ALLOWED: string[] = []

// `.isAggregate(`: the 2026-07-28 face once asked it of every request (routing/kinds/stateless.ts answers now).
const KIND_ASKS = /isPooled|isDirect|\.isAggregate\(|instanceof (PoolReservations|AggregateRelay)|relay\.direct|transport === 'aggregate'|sessions === 'pooled'/

async function sources (dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true })
  const nested = await Promise.all(entries.map(async e => e.isDirectory() ? await sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []))
  return nested.flat()
}

t.test('outside routing/kinds/ and config/, no module asks which kind a session is', async t => {
  const asks: string[] = []
  for (const file of await sources(join(root, 'src'))) {
    const path = relative(root, file)
    if (path.startsWith('src/routing/kinds/') || path.startsWith('src/config/')) continue
    const lines = (await readFile(file, 'utf8')).split('\n')
    for (const line of lines) if (KIND_ASKS.test(line)) asks.push(`${path}: ${line.trim()}`)
  }
  t.same(asks.sort(), [...ALLOWED].sort(), 'only the asks listed here, each with its reason')
})
