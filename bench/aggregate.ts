// sequential p50 of a call through an aggregate of two members, against the
// same call on the member's own endpoint, in one run on one gateway process (memory mode). Both
// sessions are open all along; each round runs a block of calls on each, in a shuffled order, so
// the machine's swings hit both alike. Prints the ratio; writes bench/results/<date>-aggregate.json.
//   npm run build && node dist/bench/aggregate.js        (BENCH_ROUNDS, BENCH_BLOCK to change)
import { mkdtemp, mkdir, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Cleanup, log, startGatewayProcess } from './procs.js'
import { fmt, round, shuffled, stats } from './stats.js'

const FIXTURE = fileURLToPath(new URL('../test/fixtures/full-server.js', import.meta.url))
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 30)
const BLOCK = Number(process.env.BENCH_BLOCK ?? 40)
const WARMUP = 100

async function main (): Promise<void> {
  const cleanup = new Cleanup()
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-bench-agg-'))
  try {
    const member = { transport: 'stdio', command: process.execPath, args: [FIXTURE] }
    const gateway = await startGatewayProcess(cleanup, dir, 'aggregate', {
      log: { level: 'warn' },
      servers: { full: member, other: member, agg: { transport: 'aggregate', members: [{ server: 'full', prefix: '' }, { server: 'other' }] } }
    })
    const connect = async (path: string): Promise<Client> => {
      const client = new Client({ name: 'bench-aggregate', version: '1' })
      await client.connect(new StreamableHTTPClientTransport(new URL(`${gateway.url}${path}`)))
      cleanup.add(`client ${path}`, async () => { await client.close() })
      return client
    }
    const targets = [
      { name: 'member', client: await connect('/mcp/full'), tool: 'echo' },
      { name: 'aggregate', client: await connect('/mcp/agg'), tool: 'echo' },
      { name: 'aggregate-prefixed', client: await connect('/mcp/agg'), tool: 'other__echo' }
    ]
    const samples = new Map<string, number[]>(targets.map(t => [t.name, []]))
    const call = async (target: typeof targets[number], i: number): Promise<number> => {
      const started = performance.now()
      const result = await target.client.callTool({ name: target.tool, arguments: { text: `ping-${i}` } }) as { content: Array<{ text?: string }> }
      if (result.content[0]?.text !== `ping-${i}`) throw new Error(`${target.name}: unexpected answer`)
      return performance.now() - started
    }
    log(`warm-up: ${WARMUP} calls each`)
    for (const target of targets) for (let i = 0; i < WARMUP; i++) await call(target, i)
    log(`${ROUNDS} rounds of ${BLOCK} calls per target, shuffled`)
    for (let r = 0; r < ROUNDS; r++) {
      for (const target of shuffled(targets)) {
        for (let i = 0; i < BLOCK; i++) samples.get(target.name)?.push(await call(target, i))
      }
    }
    const figures = Object.fromEntries(targets.map(t => [t.name, stats(samples.get(t.name) ?? [])]))
    const base = figures.member?.p50 ?? NaN
    const rows = targets.map(t => {
      const s = figures[t.name]
      return `${t.name.padEnd(20)} p50 ${fmt(s?.p50, 3)} ms  p99 ${fmt(s?.p99, 3)} ms  p50 ratio ${fmt((s?.p50 ?? NaN) / base, 3)}x`
    })
    process.stdout.write(`${rows.join('\n')}\n`)
    const out = join(fileURLToPath(new URL('../../bench/results/', import.meta.url)))
    await mkdir(out, { recursive: true })
    const file = join(out, `${new Date().toISOString().slice(0, 10)}-aggregate.json`)
    await writeFile(file, JSON.stringify({
      what: 'sequential tools/call p50: through an aggregate of two members vs the member\'s own endpoint',
      rounds: ROUNDS,
      block: BLOCK,
      figures,
      ratios: Object.fromEntries(targets.map(t => [t.name, round((figures[t.name]?.p50 ?? NaN) / base)]))
    }, null, 2))
    log(`results in ${file}`)
  } finally {
    await cleanup.runAll()
  }
}

main().catch(err => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
