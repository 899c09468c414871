// Processes the benchmark starts (redis-server, gateway processes, the HTTP upstream) and what it
// reads about them from /proc. Everything started here registers its stop with a Cleanup, so a
// failed or interrupted run leaves nothing behind.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs'
import { writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { freePort } from '../test/helpers/wait.js'
import { pings } from '../test/helpers/redis-server.js'
export { freePort }

/** This build's gateway entry; BENCH_COMPARE_MAIN may name another build's. */
export const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url))
const UPSTREAM = fileURLToPath(new URL('./http-upstream.js', import.meta.url))
const IDLE_UPSTREAM = fileURLToPath(new URL('./idle-upstream.js', import.meta.url))
const MINIMAL_PROXY = fileURLToPath(new URL('./minimal-proxy.js', import.meta.url))
const FASTIFY_FLOOR = fileURLToPath(new URL('./fastify-floor.js', import.meta.url))
const GC_PROBE = fileURLToPath(new URL('./gc-probe.js', import.meta.url))
const LOOP_PROBE = fileURLToPath(new URL('./loop-probe.js', import.meta.url))

export const log = (message: string): void => { process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`) }

/** Stops registered in start order, run in reverse; each runs once, failures are logged, not thrown. */
export class Cleanup {
  readonly #stops: Array<{ what: string, stop: () => Promise<void> }> = []

  /** Registers a stop; the returned function runs it now (and unregisters it). */
  add (what: string, stop: () => Promise<void>): () => Promise<void> {
    const entry = { what, stop }
    this.#stops.push(entry)
    return async () => {
      const i = this.#stops.indexOf(entry)
      if (i < 0) return
      this.#stops.splice(i, 1)
      await stop().catch(err => { log(`stopping ${what} failed: ${String(err)}`) })
    }
  }

  async runAll (): Promise<void> {
    while (this.#stops.length > 0) {
      const entry = this.#stops.pop()!
      await entry.stop().catch(err => { log(`stopping ${entry.what} failed: ${String(err)}`) })
    }
  }
}


const exited = (child: ChildProcess): boolean => child.exitCode !== null || child.signalCode !== null

/** SIGTERM, then SIGKILL after graceMs. */
export async function stopProcess (child: ChildProcess, graceMs: number): Promise<void> {
  if (exited(child)) return
  const done = once(child, 'exit')
  child.kill('SIGTERM')
  const timer = setTimeout(() => child.kill('SIGKILL'), graceMs)
  await done
  clearTimeout(timer)
}

export interface RunningProcess {
  pid: number
  url: string
  stop: () => Promise<void>
}

/** A throwaway redis-server on a free loopback port (never 6379), no persistence. */
export async function startRedisServer (cleanup: Cleanup): Promise<RunningProcess> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    if (port === 6379) continue
    const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--loglevel', 'warning'], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    child.stderr?.on('data', chunk => { stderr += String(chunk) })
    const stop = cleanup.add(`redis-server :${port}`, async () => { await stopProcess(child, 2000) })
    for (let i = 0; i < 200 && !exited(child); i++) {
      if (await pings(port)) {
        log(`redis-server pid ${String(child.pid)} on port ${port}`)
        return { pid: child.pid!, url: `redis://127.0.0.1:${port}`, stop }
      }
      await sleep(25)
    }
    await stop()
    // Another process may have taken the port between the probe and the bind.
    if (attempt >= 2) throw new Error(`redis-server did not start: ${stderr}`)
  }
}

export interface GatewayProcess extends RunningProcess {
  name: string
  logFile: string
  /** Set when started with { gcProbe: true }: full GC, then the process's memoryUsage(). */
  probeMemory?: () => Promise<ProbedMemory>
  /** Set when started with { loopProbe: true }: the lines bench/loop-probe.js wrote so far. */
  loopSamples?: () => LoopSample[]
}

export interface LoopControl { pid: number, stop: () => Promise<void>, samples: () => LoopSample[] }

/** One window of bench/loop-probe.ts. */
export interface LoopSample { t: number, maxStallMs: number, maxGcMs: number, rssKiB: number, heapUsedKiB: number }

export interface GatewayOptions {
  /** --expose-gc and bench/gc-probe.js preloaded (see probeMemory). */
  gcProbe?: boolean
  /** bench/loop-probe.js preloaded (see loopSamples). */
  loopProbe?: boolean
  /** Another build's dist/src/main.js (BENCH_COMPARE_MAIN); default this build's. */
  main?: string
}

export interface ProbedMemory {
  gc: boolean
  rss: number
  heapTotal: number
  heapUsed: number
  external: number
  arrayBuffers: number
}

async function probe (child: ChildProcess, file: string, seq: number): Promise<ProbedMemory> {
  child.kill('SIGUSR2')
  for (let i = 0; i < 200; i++) {
    await sleep(25)
    try {
      const read = JSON.parse(readFileSync(file, 'utf8')) as ProbedMemory & { seq: number }
      if (read.seq >= seq) return read
    } catch { /* not written yet, or half written */ }
  }
  throw new Error('the gateway did not answer the memory probe')
}

function readLoopSamples (file: string): LoopSample[] {
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch {
    return []
  }
  // The last line may be half written.
  return text.split('\n').flatMap(line => {
    try {
      return line === '' ? [] : [JSON.parse(line) as LoopSample]
    } catch {
      return []
    }
  })
}

/**
 * One gateway process (dist/src/main.js, or options.main) with the given config, its logs in a
 * file under dir (a pipe would make this process parse every log line). Ready when /readyz
 * answers 200.
 */
export async function startGatewayProcess (cleanup: Cleanup, dir: string, name: string, config: Record<string, unknown>, options: GatewayOptions = {}): Promise<GatewayProcess> {
  const safe = name.replace(/[^\w.-]/g, '_')
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const configFile = join(dir, `gateway-${safe}.json`)
    const logFile = join(dir, `gateway-${safe}.log`)
    const memFile = join(dir, `gateway-${safe}.mem.json`)
    const loopFile = join(dir, `gateway-${safe}.loop.jsonl`)
    await writeFile(configFile, JSON.stringify({ ...config, listen: { host: '127.0.0.1', port } }))
    const fd = openSync(logFile, 'a')
    // BENCH_GATEWAY_NODE_ARGS: extra node flags for every gateway, e.g. `--cpu-prof --cpu-prof-dir=/tmp/prof`
    // (node refuses --cpu-prof in NODE_OPTIONS).
    const nodeArgs: string[] = (process.env.BENCH_GATEWAY_NODE_ARGS ?? '').split(' ').filter(arg => arg !== '')
    const env: NodeJS.ProcessEnv = { ...process.env }
    if (options.gcProbe === true) {
      nodeArgs.push('--expose-gc', '--import', pathToFileURL(GC_PROBE).href)
      env.BENCH_MEM_FILE = memFile
    }
    if (options.loopProbe === true) {
      nodeArgs.push('--import', pathToFileURL(LOOP_PROBE).href)
      env.BENCH_LOOP_FILE = loopFile
    }
    const child = spawn(process.execPath, [...nodeArgs, options.main ?? MAIN, '--config', configFile], { stdio: ['ignore', fd, fd], env })
    closeSync(fd)
    let probes = 0
    // The gateway stops its stdio children on SIGTERM; its own deadline is 15 s.
    const stop = cleanup.add(`gateway ${name}`, async () => { await stopProcess(child, 20_000) })
    const url = `http://127.0.0.1:${port}`
    const deadline = Date.now() + 20_000
    while (!exited(child) && Date.now() < deadline) {
      const ready = await fetch(`${url}/readyz`).then(res => res.ok, () => false)
      if (ready) {
        const running: GatewayProcess = { name, pid: child.pid!, url, stop, logFile }
        if (options.gcProbe === true) running.probeMemory = async () => await probe(child, memFile, ++probes)
        if (options.loopProbe === true) running.loopSamples = () => readLoopSamples(loopFile)
        log(`gateway ${name} pid ${String(child.pid)} at ${url}`)
        return running
      }
      await sleep(50)
    }
    await stop()
    if (attempt >= 2) throw new Error(`gateway ${name} did not become ready; see ${logFile}`)
    log(`gateway ${name} did not start (port ${port} taken?); retrying`)
  }
}

/**
 * An idle node process with bench/loop-probe.js preloaded: its stalls are the machine's (other
 * processes taking the CPUs), the control for a gateway's.
 */
export function startLoopControl (cleanup: Cleanup, dir: string, name: string): LoopControl {
  const file = join(dir, `control-${name}.loop.jsonl`)
  // stdin stays open: the script exits when it closes, so it cannot outlive this process.
  const child = spawn(process.execPath, ['--import', pathToFileURL(LOOP_PROBE).href, '-e', 'process.stdin.resume(); process.stdin.on("end", () => process.exit(0))'], {
    stdio: ['pipe', 'ignore', 'inherit'],
    env: { ...process.env, BENCH_LOOP_FILE: file }
  })
  const stop = cleanup.add(`loop control ${name}`, async () => { await stopProcess(child, 2000) })
  return { pid: child.pid!, stop, samples: () => readLoopSamples(file) }
}

/**
 * A node script of bench/ that prints {"url": ...} on its first stdout line once listening and
 * exits when its stdin closes, so it cannot outlive this process (http-upstream, idle-upstream,
 * minimal-proxy).
 */
async function startUrlProcess (cleanup: Cleanup, what: string, script: string, args: string[] = []): Promise<RunningProcess> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ['pipe', 'pipe', 'inherit'] })
  const stop = cleanup.add(what, async () => { await stopProcess(child, 5000) })
  const lines = createInterface({ input: child.stdout! })
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${what} did not start`)), 20_000)
      lines.once('line', line => {
        clearTimeout(timer)
        const parsed = JSON.parse(line) as { url?: string }
        if (typeof parsed.url === 'string') resolve(parsed.url)
        else reject(new Error(`${what} said ${line}`))
      })
      child.once('exit', code => { clearTimeout(timer); reject(new Error(`${what} exited with ${String(code)}`)) })
    })
    log(`${what} pid ${String(child.pid)} at ${url}`)
    return { pid: child.pid!, url, stop }
  } catch (err) {
    await stop()
    throw err
  }
}

/** The SDK Streamable HTTP upstream (bench/http-upstream.ts) in its own process. */
export const startHttpUpstream = async (cleanup: Cleanup): Promise<RunningProcess> =>
  await startUrlProcess(cleanup, 'http upstream', UPSTREAM)

/** The bare upstream of the idle-streams phase (bench/idle-upstream.ts); offerGet false: GET is 405. */
export const startIdleUpstream = async (cleanup: Cleanup, offerGet: boolean): Promise<RunningProcess> =>
  await startUrlProcess(cleanup, `idle upstream${offerGet ? '' : ' (no GET)'}`, IDLE_UPSTREAM, offerGet ? [] : ['--no-get'])

/** The floor (bench/minimal-proxy.ts) in front of the given stdio command. */
export const startMinimalProxy = async (cleanup: Cleanup, command: string, args: string[]): Promise<RunningProcess> =>
  await startUrlProcess(cleanup, 'minimal proxy', MINIMAL_PROXY, [command, ...args])
/** The floor's logic behind Fastify (fastify-floor.ts): what the framework alone costs. */
export const startFastifyFloor = async (cleanup: Cleanup, command: string, args: string[]): Promise<RunningProcess> =>
  await startUrlProcess(cleanup, 'fastify floor', FASTIFY_FLOOR, [command, ...args])

// ---- /proc ---------------------------------------------------------------------------------

function procField (pid: number, file: string, field: string): number | null {
  try {
    const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/${file}`, 'utf8'))
    return match === null ? null : Number(match[1])
  } catch {
    return null
  }
}

/** Resident set size in KiB (null if the process is gone). */
export const rssKiB = (pid: number): number | null => procField(pid, 'status', 'VmRSS')
/** Proportional set size in KiB: shared pages (the node binary) split between their users. */
export const pssKiB = (pid: number): number | null => procField(pid, 'smaps_rollup', 'Pss')

function statFields (pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  } catch {
    return null
  }
}

/** Direct children of a process. */
export function childrenOf (pid: number): number[] {
  const found: number[] = []
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    const fields = statFields(Number(entry))
    if (fields !== null && Number(fields[1]) === pid) found.push(Number(entry))
  }
  return found
}

let clockTicks = 0
/** CPU time (user + system) a process has used, in ms. */
export function cpuMs (pid: number): number | null {
  if (clockTicks === 0) {
    try {
      clockTicks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100
    } catch {
      clockTicks = 100
    }
  }
  const fields = statFields(pid)
  // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 after the command name.
  if (fields === null) return null
  return (Number(fields[11]) + Number(fields[12])) * 1000 / clockTicks
}

/** MemAvailable in KiB. */
export function memAvailableKiB (): number {
  const match = /^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))
  return match === null ? 0 : Number(match[1])
}

/** The soft limit on open files of a process (null if unreadable). */
export function fdLimit (pid: number): number | null {
  try {
    const match = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))
    if (match === null) return null
    return match[1] === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(match[1])
  } catch {
    return null
  }
}

/** Open file descriptors of a process (null if unreadable). */
export function fdCount (pid: number): number | null {
  try {
    return readdirSync(`/proc/${pid}/fd`).length
  } catch {
    return null
  }
}

/**
 * How many streams fit the descriptors of this process and of the gateway (`margin` kept spare),
 * and which limit decided; `hint` says how the bench raises it, where it does.
 */
export function streamsThatFit (requested: number, gatewayPid: number, margin: number, hint?: string): { count: number, limitedBy: string | null } {
  let count = requested
  let limitedBy: string | null = null
  for (const [pid, who] of [[gatewayPid, 'the gateway'], [process.pid, 'the bench client']] as const) {
    const limit = fdLimit(pid)
    const used = fdCount(pid)
    if (limit === null || used === null) continue
    const room = limit - used - margin
    if (room < count) {
      count = Math.max(0, room)
      limitedBy = `${who} may open ${limit} files (RLIMIT_NOFILE; raise it with ulimit -n${hint !== undefined ? `; ${hint}` : ''}), ${used} open already, ${margin} kept spare`
    }
  }
  return { count, limitedBy }
}

/** The short commit of the checkout at `cwd` (`+dirty` with uncommitted changes), or null outside git. */
export function gitCommit (cwd: string): string | null {
  try {
    const commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim() !== ''
    return dirty ? `${commit}+dirty` : commit
  } catch {
    return null
  }
}
