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

const MAIN = fileURLToPath(new URL('../src/main.js', import.meta.url))
const UPSTREAM = fileURLToPath(new URL('./http-upstream.js', import.meta.url))
const GC_PROBE = fileURLToPath(new URL('./gc-probe.js', import.meta.url))

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

/**
 * One gateway process (dist/src/main.js) with the given config, its logs in a file under dir (a
 * pipe would make this process parse every log line). Ready when /readyz answers 200.
 * gcProbe: started with --expose-gc and bench/gc-probe.js preloaded (see probeMemory).
 */
export async function startGatewayProcess (cleanup: Cleanup, dir: string, name: string, config: Record<string, unknown>, options: { gcProbe?: boolean } = {}): Promise<GatewayProcess> {
  for (let attempt = 0; ; attempt++) {
    const port = await freePort()
    const configFile = join(dir, `gateway-${name}.json`)
    const logFile = join(dir, `gateway-${name}.log`)
    const memFile = join(dir, `gateway-${name}.mem.json`)
    await writeFile(configFile, JSON.stringify({ ...config, listen: { host: '127.0.0.1', port } }))
    const fd = openSync(logFile, 'a')
    const nodeArgs = options.gcProbe === true ? ['--expose-gc', '--import', pathToFileURL(GC_PROBE).href] : []
    const env = options.gcProbe === true ? { ...process.env, BENCH_MEM_FILE: memFile } : process.env
    const child = spawn(process.execPath, [...nodeArgs, MAIN, '--config', configFile], { stdio: ['ignore', fd, fd], env })
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
        return running
      }
      await sleep(50)
    }
    await stop()
    if (attempt >= 2) throw new Error(`gateway ${name} did not become ready; see ${logFile}`)
    log(`gateway ${name} did not start (port ${port} taken?); retrying`)
  }
}

/** The SDK Streamable HTTP upstream (bench/http-upstream.ts) in its own process. */
export async function startHttpUpstream (cleanup: Cleanup): Promise<RunningProcess> {
  // stdin stays open: the upstream exits when it closes, so it cannot outlive this process.
  const child = spawn(process.execPath, [UPSTREAM], { stdio: ['pipe', 'pipe', 'inherit'] })
  const stop = cleanup.add('http upstream', async () => { await stopProcess(child, 5000) })
  const lines = createInterface({ input: child.stdout! })
  try {
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('http upstream did not start')), 20_000)
      lines.once('line', line => {
        clearTimeout(timer)
        const parsed = JSON.parse(line) as { url?: string }
        if (typeof parsed.url === 'string') resolve(parsed.url)
        else reject(new Error(`http upstream said ${line}`))
      })
      child.once('exit', code => { clearTimeout(timer); reject(new Error(`http upstream exited with ${String(code)}`)) })
    })
    return { pid: child.pid!, url, stop }
  } catch (err) {
    await stop()
    throw err
  }
}

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
