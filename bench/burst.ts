// A burst of new sessions against a gateway with a stdio backend, while one session already open
// keeps calling: what the others see while many clients connect at once. Each new session spawns
// a child, and a spawn blocks the event loop until the child has exec'd (10-150 ms each on a
// loaded 2-core machine). Reported per round: the time to open the burst, the longest event-loop
// stall inside the gateway (bench/loop-probe.js, timer drift), and the bystander's calls during it
// (p50, max). With BENCH_COMPARE_MAIN, the other build runs the same rounds, alternating which
// goes first.
//
//   node dist/bench/burst.js                       BENCH_BURST (50) sessions, BENCH_BURST_ROUNDS (3)
//   BENCH_COMPARE_MAIN=/tmp/base/dist/src/main.js node dist/bench/burst.js
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { performance } from 'node:perf_hooks'
import { Cleanup, log, startGatewayProcess, type GatewayProcess } from './procs.js'
import { baseGatewayConfig, GATEWAY_PATH, stdioServer } from './targets.js'
import { callEcho, connectHttp, STDIO_ECHO } from './sessions.js'
import { median } from './stats.js'

const BURST = Number(process.env.BENCH_BURST ?? 50)
const ROUNDS = Number(process.env.BENCH_BURST_ROUNDS ?? 3)
const COMPARE_MAIN = process.env.BENCH_COMPARE_MAIN

interface Round { openMs: number, maxStallMs: number, bystanderP50Ms: number, bystanderMaxMs: number, bystanderCalls: number }

async function burstRound (gw: GatewayProcess): Promise<Round> {
  const url = `${gw.url}${GATEWAY_PATH}`
  const bystander = await connectHttp(url)
  try {
    for (let i = 0; i < 200; i++) await callEcho(bystander, STDIO_ECHO, i)
    const t0 = Date.now()
    let opening = true
    const latencies: number[] = []
    const calling = (async () => {
      for (let i = 0; opening; i++) {
        const c0 = performance.now()
        const err = await callEcho(bystander, STDIO_ECHO, i)
        if (err !== null) throw new Error(`bystander call failed: ${err}`)
        latencies.push(performance.now() - c0)
      }
    })()
    const sessions = await Promise.all(Array.from({ length: BURST }, async () => await connectHttp(url)))
    const openMs = Date.now() - t0
    opening = false
    await calling
    const t1 = Date.now()
    await Promise.all(sessions.map(async s => { await s.close() }))
    // The probe writes a line every 250 ms: the window holding t1 may land a little later.
    await new Promise(resolve => setTimeout(resolve, 600))
    const stalls = (gw.loopSamples?.() ?? []).filter(s => s.t >= t0 && s.t <= t1 + 300).map(s => s.maxStallMs)
    latencies.sort((a, b) => a - b)
    return {
      openMs,
      maxStallMs: Math.max(0, ...stalls),
      bystanderP50Ms: latencies[latencies.length >> 1] ?? NaN,
      bystanderMaxMs: latencies[latencies.length - 1] ?? NaN,
      bystanderCalls: latencies.length
    }
  } finally {
    await bystander.close()
  }
}

const cleanup = new Cleanup()
process.once('SIGINT', () => { void cleanup.runAll().finally(() => process.exit(130)) })
try {
  const dir = mkdtempSync(join(tmpdir(), 'bench-burst-'))
  const config = baseGatewayConfig(undefined, stdioServer())
  const builds: Array<[string, string | undefined]> = [['this build', undefined], ...(COMPARE_MAIN === undefined ? [] : [['compare', COMPARE_MAIN] as [string, string]])]
  const gateways = new Map<string, GatewayProcess>()
  for (const [name, main] of builds) {
    gateways.set(name, await startGatewayProcess(cleanup, dir, name, config, { loopProbe: true, ...(main === undefined ? {} : { main }) }))
  }
  const rounds = new Map<string, Round[]>(builds.map(([name]) => [name, []]))
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 === 0 ? builds : [...builds].reverse()
    for (const [name] of order) {
      const round = await burstRound(gateways.get(name)!)
      rounds.get(name)!.push(round)
      log(`burst ${r + 1}/${ROUNDS} ${name}: ${JSON.stringify(round)}`)
      await new Promise(resolve => setTimeout(resolve, 1000))
    }
  }
  const lines = [`${BURST} sessions opened at once, ${ROUNDS} rounds; medians over rounds (each round's figures in the JSON)`,
    'build          open ms  max stall ms  bystander p50 ms  bystander max ms']
  for (const [name, list] of rounds) {
    const m = (pick: (x: Round) => number): string => median(list.map(pick)).toFixed(1)
    lines.push(`${name.padEnd(13)} ${m(x => x.openMs).padStart(8)} ${m(x => x.maxStallMs).padStart(13)} ${m(x => x.bystanderP50Ms).padStart(17)} ${m(x => x.bystanderMaxMs).padStart(17)}`)
  }
  console.log(lines.join('\n'))
  const out = process.env.BENCH_OUT
  if (out !== undefined) writeFileSync(out, JSON.stringify({ burst: BURST, compareMain: COMPARE_MAIN ?? null, rounds: Object.fromEntries(rounds) }, null, 2))
} finally {
  await cleanup.runAll()
}
