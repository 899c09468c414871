// The idle figure: 10,000 idle pooled sessions on one replica (memory mode), each with its
// GET stream open, in front of the full-server stdio fixture with `sessions: pooled`. Goals: the
// gateway's children stay at most poolSize, and the gateway's RSS plus its children's stays under
// 1 GiB. Figures only; nothing is asserted.
//
//   npm run bench:pooled-idle      (builds, then node dist/bench/pooled-idle.js)
//
// Each session is raw HTTP (bench/raw-client.ts): initialize POST, notifications/initialized, then
// a GET with Accept: text/event-stream kept open. Every held stream is a socket, so a file
// descriptor, in this process and in the gateway (a pooled session holds no child, so nothing
// more): RLIMIT_NOFILE must exceed BENCH_STREAMS plus a margin in both. Raise the soft limit
// before running where it is lower (`ulimit -n 20000`); the run caps the count and says which
// limit decided when it would not fit.
//
// Knobs (env, defaults in brackets): BENCH_STREAMS [10000], BENCH_STREAMS_CONCURRENCY [16],
// BENCH_STREAMS_HOLD_S [20], BENCH_POOL_SIZE [4] (the shipped default), BENCH_OUT (default
// bench/results/<date>-pooled-idle.json).
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { mkdtemp, rm } from 'node:fs/promises'
import { cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { openMany } from './idle.js'
import { childrenOf, Cleanup, log, pssKiB, rssKiB, startGatewayProcess, type GatewayProcess, streamsThatFit } from './procs.js'
import { closeRawSession, type RawSession } from './raw-client.js'
import { fmt, intEnv, mapLimit, round } from './stats.js'
import { baseGatewayConfig, GATEWAY_PATH, mergeConfig, stdioServer } from './targets.js'

const REPO = fileURLToPath(new URL('../../', import.meta.url))
const GIB_KIB = 1024 * 1024
/** Descriptors kept spare in each process beyond one per stream (pipes to children, listeners, slack). */
const FD_MARGIN = 200
/** Sessions opened and closed before measuring: the code paths they take are compiled by then. */
const WARMUP_SESSIONS = 200

const knobs = {
  streams: intEnv('BENCH_STREAMS', 10_000),
  concurrency: intEnv('BENCH_STREAMS_CONCURRENCY', 16),
  holdS: intEnv('BENCH_STREAMS_HOLD_S', 20),
  poolSize: intEnv('BENCH_POOL_SIZE', 4)
}

interface Snapshot {
  gatewayRssKiB: number
  gatewayPssKiB: number | null
  /** After a forced full GC in the gateway (bench/gc-probe.ts). */
  gatewayHeapUsedKiB: number
  children: number
  childrenRssKiB: number
  childrenPssKiB: number
  /** The gateway's own view (/metrics): pool connections and children by mode. */
  metrics: string[]
}

async function metricsLines (gateway: GatewayProcess): Promise<string[]> {
  try {
    const text = await (await fetch(`${gateway.url}/metrics`)).text()
    return text.split('\n').filter(line => /^mcpgw_(pool_connections|backend_children_by_mode)\{/.test(line))
  } catch {
    return []
  }
}

async function snapshot (gateway: GatewayProcess): Promise<Snapshot> {
  const probed = await gateway.probeMemory?.()
  // V8 hands freed pages back some seconds after a GC (bench/idle.ts, sampleMemory).
  await sleep(5000)
  const pids = childrenOf(gateway.pid)
  return {
    gatewayRssKiB: rssKiB(gateway.pid) ?? NaN,
    gatewayPssKiB: pssKiB(gateway.pid),
    gatewayHeapUsedKiB: probed === undefined ? NaN : probed.heapUsed / 1024,
    children: pids.length,
    childrenRssKiB: pids.reduce((a, pid) => a + (rssKiB(pid) ?? 0), 0),
    childrenPssKiB: pids.reduce((a, pid) => a + (pssKiB(pid) ?? 0), 0),
    metrics: await metricsLines(gateway)
  }
}

const mib = (kib: number): string => fmt(kib / 1024, 1)

async function main (): Promise<void> {
  const cleanup = new Cleanup()
  const open = new Set<RawSession>()
  process.on('SIGINT', () => {
    log('SIGINT: stopping everything started')
    void cleanup.runAll().finally(() => process.exit(130))
  })
  const dir = await mkdtemp(join(tmpdir(), 'bench-pooled-idle-'))
  cleanup.add('temp dir', async () => { await rm(dir, { recursive: true, force: true }) })
  try {
    const config = mergeConfig(baseGatewayConfig(undefined, stdioServer()), { servers: { bench: { sessions: 'pooled', poolSize: knobs.poolSize } } })
    const gateway = await startGatewayProcess(cleanup, dir, 'gateway-pooled', config, { gcProbe: true })
    const url = `${gateway.url}${GATEWAY_PATH}`
    const started = new Date()

    log(`warm-up: ${WARMUP_SESSIONS} sessions opened and closed`)
    const warm = new Set<RawSession>()
    await openMany(url, WARMUP_SESSIONS, knobs.concurrency, () => {}, warm)
    await mapLimit([...warm], knobs.concurrency, closeRawSession)
    const before = await snapshot(gateway)
    const fits = streamsThatFit(knobs.streams, gateway.pid, FD_MARGIN)
    if (fits.limitedBy !== null) log(`only ${fits.count} streams fit: ${fits.limitedBy}`)
    log(`gateway RSS ${mib(before.gatewayRssKiB)} MiB, ${before.children} children; opening ${fits.count} idle sessions, ${knobs.concurrency} at a time`)

    let dropped = 0
    const rampStart = Date.now()
    const progress = setInterval(() => {
      log(`${open.size} sessions open, gateway RSS ${mib(rssKiB(gateway.pid) ?? NaN)} MiB, ${childrenOf(gateway.pid).length} children`)
    }, 10_000)
    let opened: Awaited<ReturnType<typeof openMany>>
    try {
      opened = await openMany(url, fits.count, knobs.concurrency, () => { dropped++ }, open)
    } finally {
      clearInterval(progress)
    }
    const rampS = (Date.now() - rampStart) / 1000
    log(`${open.size} sessions open after ${rampS.toFixed(0)} s; holding ${knobs.holdS} s`)
    // The most children and the highest RSS seen while the sessions are held.
    let maxChildren = 0
    let maxTotalRssKiB = 0
    const holdEnd = Date.now() + knobs.holdS * 1000
    while (Date.now() < holdEnd) {
      const pids = childrenOf(gateway.pid)
      maxChildren = Math.max(maxChildren, pids.length)
      maxTotalRssKiB = Math.max(maxTotalRssKiB, (rssKiB(gateway.pid) ?? 0) + pids.reduce((a, pid) => a + (rssKiB(pid) ?? 0), 0))
      await sleep(1000)
    }
    const held = await snapshot(gateway)
    const sessions = open.size
    log(`closing ${sessions} sessions`)
    await mapLimit([...open], knobs.concurrency * 2, closeRawSession)
    open.clear()
    const afterClose = await snapshot(gateway)

    const totalKiB = held.gatewayRssKiB + held.childrenRssKiB
    const figures = {
      sessions,
      children: held.children,
      maxChildrenDuringHold: Math.max(maxChildren, held.children),
      poolSize: knobs.poolSize,
      childrenOverPoolSize: round(Math.max(maxChildren, held.children) / knobs.poolSize),
      gatewayRssMiB: round(held.gatewayRssKiB / 1024, 1),
      childrenRssMiB: round(held.childrenRssKiB / 1024, 1),
      totalRssMiB: round(totalKiB / 1024, 1),
      maxTotalRssDuringHoldMiB: round(Math.max(maxTotalRssKiB, totalKiB) / 1024, 1),
      totalRssOverOneGiB: round(Math.max(maxTotalRssKiB, totalKiB) / GIB_KIB),
      perSessionKiB: {
        gatewayRss: round((held.gatewayRssKiB - before.gatewayRssKiB) / sessions, 2),
        gatewayHeapUsed: round((held.gatewayHeapUsedKiB - before.gatewayHeapUsedKiB) / sessions, 2),
        totalRss: round(totalKiB / sessions, 2)
      },
      goals: { children: `<= poolSize (${knobs.poolSize})`, totalRss: '< 1 GiB (ratio < 1.0)' }
    }
    process.stdout.write([
      `idle pooled sessions        ${sessions} of ${knobs.streams} requested (${opened.failed} failed${opened.firstError === null ? '' : `: ${opened.firstError}`}, ${dropped} streams dropped), ramp ${rampS.toFixed(0)} s`,
      `children                    ${held.children} now, ${figures.maxChildrenDuringHold} at most during the hold; poolSize ${knobs.poolSize} (ratio ${fmt(figures.childrenOverPoolSize)}; goal <= 1)`,
      `gateway RSS                 ${mib(before.gatewayRssKiB)} MiB before, ${mib(held.gatewayRssKiB)} MiB held, ${mib(afterClose.gatewayRssKiB)} MiB after closing`,
      `children RSS                ${mib(held.childrenRssKiB)} MiB (PSS ${mib(held.childrenPssKiB)} MiB)`,
      `gateway + children RSS      ${mib(totalKiB)} MiB held, ${fmt(figures.maxTotalRssDuringHoldMiB, 1)} MiB at most: ${fmt(figures.totalRssOverOneGiB, 3)} of 1 GiB (goal < 1)`,
      `per session                 ${fmt(figures.perSessionKiB.gatewayRss)} KiB gateway RSS, ${fmt(figures.perSessionKiB.gatewayHeapUsed)} KiB gateway heap, ${fmt(figures.perSessionKiB.totalRss)} KiB of the total`,
      `gateway metrics (held)      ${held.metrics.join('; ')}`,
      ''
    ].join('\n'))

    const date = started.toISOString().slice(0, 10)
    const out = process.env.BENCH_OUT ?? join(REPO, 'bench', 'results', `${date}-pooled-idle.json`)
    mkdirSync(dirname(out), { recursive: true })
    writeFileSync(out, `${JSON.stringify({
      started: started.toISOString(),
      machine: { cpus: cpus().length, memTotalKiB: Number(/^MemTotal:\s+(\d+)/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? NaN) },
      knobs,
      fit: fits,
      figures,
      ramp: { seconds: round(rampS, 1), failed: opened.failed, firstError: opened.firstError, dropped },
      before,
      held,
      afterClose
    }, (_key, value: unknown) => typeof value === 'number' ? round(value) : value, 2)}\n`)
    log(`results in ${out}`)
  } finally {
    await mapLimit([...open], knobs.concurrency * 2, closeRawSession)
    await cleanup.runAll()
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`)
  process.exitCode = 1
})
