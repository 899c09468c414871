// stdio backends (docs/spec-rules.md §7): one child process per client session, newline-delimited JSON-RPC
// on stdin/stdout, stderr into the logs.
//
// - Environment: an allow-list, never the gateway's whole env (IO-9, A-UP-1): the SDK's safe
//   base set, the names in `inheritEnv`, then `env` from the config.
// - Framing (IO-1, IO-2, IO-4): compact JSON + '\n' out; in, a byte-level line splitter that never
//   holds more than `maxLineBytes` of one line (the SDK keeps a 10 MB buffer and throws away the
//   connection when it overflows; we drop the one line and carry on). Non-JSON and non-JSON-RPC
//   lines are logged and dropped; a JSON array line (2025-03-26 batch) is demultiplexed.
// - stderr (IO-3) is logged line by line, never treated as an error signal.
// - Stop ladder (IO-5): end stdin, wait, SIGTERM, wait, SIGKILL.
// - No orphans (docs/architecture.md): every live child sits in a module registry that
//   `stopAllChildren()` drains and a last-resort 'exit' hook SIGKILLs synchronously.
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises'
import type { Logger } from 'pino'
import { lazyChild, newBindings } from '../telemetry/logger.js'
import type { BackendConnection, BackendExit, BackendFactory, BackendOpenOptions } from './backend.js'
import type { ServerConfig, StdioServerConfig } from '../config/schema.js'
import { GW_ERR_BACKEND_UNAVAILABLE, GW_ERR_INTERNAL } from '../core/errors.js'
import { classify, type JsonRpcMessage } from '../core/jsonrpc.js'
import { childCredential } from './stdio-credential.js'

/**
 * Variables a child inherits from the gateway without being listed: the SDK's
 * `DEFAULT_INHERITED_ENV_VARS` (sudo's list on POSIX), copied so src/ needs no SDK dependency.
 */
export const SAFE_ENV_NAMES: readonly string[] = process.platform === 'win32'
  ? ['APPDATA', 'HOMEDRIVE', 'HOMEPATH', 'LOCALAPPDATA', 'PATH', 'PROCESSOR_ARCHITECTURE', 'SYSTEMDRIVE',
      'SYSTEMROOT', 'TEMP', 'USERNAME', 'USERPROFILE', 'PROGRAMFILES']
  : ['HOME', 'LOGNAME', 'PATH', 'SHELL', 'TERM', 'USER']

/**
 * The child's environment: safe base names and `inheritEnv` names taken from `baseEnv` (the
 * gateway's environment), then `config.env` (already ${ENV}-expanded by config loading) on top.
 * Pure: the caller decides where `baseEnv` comes from.
 */
export function childEnvironment (baseEnv: NodeJS.ProcessEnv, config: Pick<StdioServerConfig, 'env' | 'inheritEnv'>): Record<string, string> {
  const env: Record<string, string> = {}
  for (const name of [...SAFE_ENV_NAMES, ...(config.inheritEnv ?? [])]) {
    const value = baseEnv[name]
    // Bash exported functions ('() { …') are code, not data: the SDK skips them for the same reason.
    if (value === undefined || value.startsWith('()')) continue
    env[name] = value
  }
  return Object.assign(env, config.env ?? {})
}

/** Splits a byte stream into lines without ever buffering more than `maxLineBytes` of one line. */
export class LineSplitter {
  readonly #max: number
  readonly #onLine: (line: Buffer) => void
  readonly #onOversize: (bytes: number) => void
  #parts: Buffer[] = []
  #buffered = 0
  /** Bytes of the current over-long line seen so far; -1 while not discarding. */
  #discarded = -1

  constructor (maxLineBytes: number, onLine: (line: Buffer) => void, onOversize: (bytes: number) => void) {
    this.#max = maxLineBytes
    this.#onLine = onLine
    this.#onOversize = onOversize
  }

  /** Bytes currently held for an unfinished line (never more than maxLineBytes). */
  get buffered (): number {
    return this.#buffered
  }

  push (chunk: Buffer): void {
    let start = 0
    while (start < chunk.length) {
      const nl = chunk.indexOf(0x0a, start)
      const end = nl === -1 ? chunk.length : nl
      this.#take(chunk.subarray(start, end))
      if (nl === -1) return
      this.#endLine()
      start = nl + 1
    }
  }

  /** The stream ended: a final line without '\n' still counts (as the SDK's reader does not; harmless). */
  end (): void {
    if (this.#buffered > 0 || this.#discarded >= 0) this.#endLine()
  }

  #take (piece: Buffer): void {
    if (piece.length === 0) return
    if (this.#discarded >= 0) {
      this.#discarded += piece.length
      return
    }
    if (this.#buffered + piece.length > this.#max) {
      this.#discarded = this.#buffered + piece.length
      this.#parts = []
      this.#buffered = 0
      return
    }
    this.#parts.push(piece)
    this.#buffered += piece.length
  }

  #endLine (): void {
    if (this.#discarded >= 0) {
      const bytes = this.#discarded
      this.#discarded = -1
      this.#onOversize(bytes)
      return
    }
    const line = this.#parts.length === 1 ? this.#parts[0]! : Buffer.concat(this.#parts, this.#buffered)
    this.#parts = []
    this.#buffered = 0
    let length = line.length
    if (length > 0 && line[length - 1] === 0x0d) length-- // CRLF from Windows-minded servers (IO-1)
    this.#onLine(line.subarray(0, length))
  }
}

/** Longest stderr line written to the logs; the rest is cut so a chatty child cannot flood them. */
const STDERR_LOG_CHARS = 8192
const PREFIX_CHARS = 80

/** Decodes one stdout line into JSON-RPC messages, logging and dropping what is not one (IO-2, IO-4). */
export function decodeLine (line: Buffer, log: Logger): JsonRpcMessage[] {
  const text = line.toString('utf8')
  if (text.trim() === '') return []
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (err) {
    log.warn({ stream: 'stdout', bytes: line.length, reason: (err as Error).message }, 'backend wrote a non-JSON line to stdout; dropped')
    log.debug({ stream: 'stdout', prefix: text.slice(0, PREFIX_CHARS) }, 'dropped stdout line')
    return []
  }
  const values = Array.isArray(value) ? value : [value]
  if (values.length === 0) {
    log.warn({ stream: 'stdout', bytes: line.length }, 'backend wrote an empty batch; dropped')
    return []
  }
  const messages: JsonRpcMessage[] = []
  for (const item of values) {
    const c = classify(item)
    if (c.kind === 'invalid') {
      log.warn({ stream: 'stdout', bytes: line.length, reason: c.reason, batch: values.length > 1 || undefined }, 'backend wrote JSON that is not a JSON-RPC message; dropped')
      log.debug({ stream: 'stdout', prefix: text.slice(0, PREFIX_CHARS) }, 'dropped stdout line')
    } else {
      messages.push(c.message)
    }
  }
  return messages
}

/**
 * Ends a child: close stdin (servers SHOULD exit on EOF), wait `graceMs`, SIGTERM, wait, SIGKILL
 * (IO-5; the SDK's StdioClientTransport.close uses the same ladder with 2 s steps).
 * Resolves with the last signal sent (null: EOF was enough) once the child is gone.
 */
export async function stopChild (child: ChildProcess, graceMs: number): Promise<NodeJS.Signals | null> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return null
  const exited = once(child, 'exit').then(() => true, () => true)
  child.stdin?.end()
  let sent: NodeJS.Signals | null = null
  for (const signal of [null, 'SIGTERM', 'SIGKILL'] as const) {
    if (signal !== null) {
      sent = signal
      child.kill(signal)
    }
    // After SIGKILL, wait at least a second more: the kernel may need a moment to reap.
    const wait = signal === 'SIGKILL' ? Math.max(graceMs, 1000) : graceMs
    if (await Promise.race([exited, sleep(wait, false, { ref: false })])) return sent
  }
  return sent
}

// The registry of live children: what stopAllChildren() drains and the 'exit' hook kills.
const liveChildren = new Map<ChildProcess, BackendConnection>()
let exitHookInstalled = false

function registerChild (child: ChildProcess, connection: BackendConnection): void {
  liveChildren.set(child, connection)
  if (exitHookInstalled) return
  exitHookInstalled = true
  // Last resort (an uncaught exception, process.exit somewhere): 'exit' handlers must be
  // synchronous, so there is no ladder, only SIGKILL. The normal path is stopAllChildren().
  process.on('exit', () => {
    for (const c of liveChildren.keys()) {
      try { c.kill('SIGKILL') } catch {}
    }
  })
}

/** Children started by this module that have not exited yet (their pids). */
export function liveChildPids (): number[] {
  return [...liveChildren.keys()].map(c => c.pid).filter((pid): pid is number => pid !== undefined)
}

/**
 * Closes every connection this module started, each child with its own ladder, in parallel.
 * A safety net for shutdown after the supervisor's stopAll(): closing (rather than only killing)
 * means no onExit fires, so nothing tries to restart what is being stopped.
 */
export async function stopAllChildren (): Promise<void> {
  await Promise.all([...liveChildren.values()].map(async connection => await connection.close()))
}

function exitReason (code: number | null, signal: NodeJS.Signals | null): string {
  if (signal !== null) return `process killed by ${signal}`
  return `process exited with code ${String(code)}`
}

/** Senders allowed to wait on a full stdin pipe; beyond it send() fails at once. */
export const MAX_WAITING_WRITERS = 1000

class StdioBackend implements BackendConnection {
  readonly #server: string
  readonly #config: StdioServerConfig
  readonly #child: ChildProcess
  readonly #log: Logger
  readonly #handlers: BackendOpenOptions['handlers']
  /**
   * Aborted when the child is gone or close() was called: wakes every waiter. Made by the first
   * wait for a full pipe (most children never have one): an AbortController held per child for
   * nothing cost an idle session some hundreds of bytes.
   */
  #gone: AbortController | undefined
  #exited = false
  #closing: Promise<void> | null = null
  #reported = false
  #drained: Promise<void> | null = null
  /** Senders waiting for the pipe to drain (capped by MAX_WAITING_WRITERS). */
  #waitingWriters = 0
  /** When the credential in the child's environment lapses (stdio-credential.ts). */
  credentialExpiresAt: number | null = null

  constructor (server: string, config: StdioServerConfig, child: ChildProcess, log: Logger, handlers: BackendOpenOptions['handlers']) {
    this.#server = server
    this.#config = config
    this.#child = child
    this.#log = log
    this.#handlers = handlers
    this.#wire()
    registerChild(child, this)
  }

  get pid (): number | undefined {
    return this.#child.pid
  }

  #wire (): void {
    const child = this.#child
    const stdin = child.stdin!
    const stdout = child.stdout!
    const stderr = child.stderr!
    // EPIPE and friends: the child went away under us; 'exit' tells the story, so log quietly.
    stdin.on('error', err => this.#log.debug({ err, stream: 'stdin' }, 'stdin error'))
    stdout.on('error', err => this.#log.debug({ err, stream: 'stdout' }, 'stdout error'))
    stderr.on('error', err => this.#log.debug({ err, stream: 'stderr' }, 'stderr error'))

    const out = new LineSplitter(this.#config.maxLineBytes, line => this.#onLine(line), bytes => {
      this.#log.error({ stream: 'stdout', bytes, maxLineBytes: this.#config.maxLineBytes }, 'backend wrote a line longer than maxLineBytes; dropped')
    })
    stdout.on('data', (chunk: Buffer) => out.push(chunk))
    stdout.on('end', () => out.end())

    const err = new LineSplitter(this.#config.maxLineBytes, line => this.#onStderr(line), bytes => {
      this.#log.warn({ stream: 'stderr', bytes }, 'stderr line longer than maxLineBytes; dropped')
    })
    stderr.on('data', (chunk: Buffer) => err.push(chunk))
    stderr.on('end', () => err.end())

    // Report the exit once stdout is drained ('close'), so a response written just before exiting
    // still reaches the router before the in-flight requests are failed. A grandchild holding the
    // pipes open must not delay it for ever, hence the fallback after 'exit'.
    let fallback: NodeJS.Timeout | undefined
    child.once('exit', (code, signal) => {
      this.#exited = true
      liveChildren.delete(child)
      this.#gone?.abort()
      fallback = setTimeout(() => {
        stdout.destroy()
        stderr.destroy()
        this.#report(code, signal)
      }, 500).unref()
    })
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
      clearTimeout(fallback)
      this.#report(code, signal)
    })
    // After a successful spawn 'error' means a failed kill or write; the process may still run.
    child.on('error', err => this.#log.warn({ err }, 'child process error'))
  }

  #report (code: number | null, signal: NodeJS.Signals | null): void {
    if (this.#reported) return
    this.#reported = true
    if (this.#closing !== null) return
    const exit: BackendExit = { reason: exitReason(code, signal), code, signal }
    this.#log.warn(exit, 'backend exited unexpectedly')
    try {
      this.#handlers.onExit(exit)
    } catch (err) {
      this.#log.error({ err }, 'onExit handler threw')
    }
  }

  #onLine (line: Buffer): void {
    if (this.#closing !== null) return
    for (const message of decodeLine(line, this.#log)) {
      try {
        this.#handlers.onMessage(message)
      } catch (err) {
        this.#log.error({ err }, 'onMessage handler threw')
      }
    }
  }

  #onStderr (line: Buffer): void {
    if (line.length === 0) return
    let text = line.toString('utf8')
    const truncated = text.length > STDERR_LOG_CHARS
    if (truncated) text = text.slice(0, STDERR_LOG_CHARS)
    // stderr is the child's log, not an error signal (IO-3): words that look like trouble get
    // warn so they stand out, everything else is info.
    const level = /\b(error|fatal|panic|exception|traceback)\b/i.test(text) ? 'warn' : 'info'
    this.#log[level](truncated ? { stream: 'stderr', truncated } : { stream: 'stderr' }, text)
  }

  #unavailable (): Error {
    return new GW_ERR_BACKEND_UNAVAILABLE(this.#server, this.#closing !== null ? 'connection closed' : 'process exited')
  }

  #writable (): boolean {
    const stdin = this.#child.stdin
    return !this.#exited && this.#closing === null && stdin !== null && !stdin.destroyed && stdin.writable
  }

  /** One 'drain' wait shared by every writer held back, however many there are. */
  async #drain (): Promise<void> {
    if (this.#gone === undefined) {
      this.#gone = new AbortController()
      // Gone before the first wait: the abort that would have woken it has happened already.
      if (this.#exited || this.#closing !== null) this.#gone.abort()
    }
    this.#drained ??= once(this.#child.stdin!, 'drain', { signal: this.#gone.signal }).then(() => {
      this.#drained = null
    }, () => {
      this.#drained = null
      throw this.#unavailable()
    })
    await this.#drained
  }

  async send (message: JsonRpcMessage): Promise<void> {
    if (!this.#writable()) throw this.#unavailable()
    const stdin = this.#child.stdin!
    // Wait behind earlier writers while the pipe is full. The wait is capped: a child that stops
    // reading its stdin must not make the gateway hold every later message in memory.
    if (stdin.writableNeedDrain) {
      if (this.#waitingWriters >= MAX_WAITING_WRITERS) {
        throw new GW_ERR_BACKEND_UNAVAILABLE(this.#server, 'the backend is not reading its stdin')
      }
      this.#waitingWriters++
      try {
        while (stdin.writableNeedDrain) {
          await this.#drain()
          if (!this.#writable()) throw this.#unavailable()
        }
      } finally {
        this.#waitingWriters--
      }
    }
    // JSON.stringify escapes control characters inside strings, so the line never holds a raw
    // newline (IO-1). A message that cannot be serialised is the caller's bug.
    let line: string
    try {
      line = JSON.stringify(message) + '\n'
    } catch (err) {
      throw new GW_ERR_INTERNAL('message cannot be serialised', { cause: err })
    }
    if (!stdin.write(line)) await this.#drain()
  }

  async close (): Promise<void> {
    this.#closing ??= this.#stop()
    return await this.#closing
  }

  async #stop (): Promise<void> {
    this.#gone?.abort()
    const signal = await stopChild(this.#child, this.#config.stopGraceMs)
    liveChildren.delete(this.#child)
    this.#child.stdout?.destroy()
    this.#child.stderr?.destroy()
    const stillRunning = this.#child.exitCode === null && this.#child.signalCode === null
    this.#log[stillRunning ? 'error' : 'info']({
      code: this.#child.exitCode,
      signal: this.#child.signalCode,
      escalatedTo: signal
    }, stillRunning ? 'backend did not exit after SIGKILL' : 'backend stopped')
  }
}

export interface StdioFactoryOptions {
  /**
   * The gateway's environment, from which the allow-listed names are copied. Defaults to
   * process.env: this is the one place outside config.ts that reads it,
   * and it only ever copies names the allow-list names.
   */
  baseEnv?: NodeJS.ProcessEnv
}

function isStdio (config: ServerConfig): config is StdioServerConfig {
  return config.transport === 'stdio'
}

/**
 * Spawning blocks the event loop until the child has exec'd: 10-150 ms per child on a loaded
 * 2-core machine, more as the children started before it compete for the CPUs. A burst of new
 * sessions (50 initializes read in one poll phase) spawned back to back in one turn, which blocked
 * every other session's calls and the timers for seconds (10 s once: past the owner lease). Each
 * spawn waits for an event-loop turn of its own, after the one before it, so I/O and timers run
 * between two spawns. An idle gateway's spawn waits one turn (microseconds).
 */
let spawnTurn: Promise<void> = Promise.resolve()
async function nextSpawnTurn (): Promise<void> {
  const turn = spawnTurn.then(async () => { await nextTurn() })
  spawnTurn = turn
  await turn
}

/** Builds the stdio factory; `openStdioBackend` is the one built on process.env. */
export function createStdioBackendFactory (factoryOptions: StdioFactoryOptions = {}): BackendFactory {
  return async function openStdio (options) {
    const { server, config, handlers } = options
    if (!isStdio(config)) throw new GW_ERR_INTERNAL(`server '${server}' is not a stdio server`)
    // The tenant's variables last: they are the most specific. Nothing comes from the client (IO-9).
    // The owner's credential over everything: no configured value can stand in for it.
    const credential = await childCredential(server, options.credential)
    const env = { ...childEnvironment(factoryOptions.baseEnv ?? process.env, config), ...options.upstream?.env, ...credential.env }
    await nextSpawnTurn()
    let child: ChildProcess
    try {
      // The command line comes from configuration only, never from a request (IO-10); no shell.
      child = spawn(config.command, config.args, {
        cwd: config.cwd,
        env,
        stdio: ['pipe', 'pipe', 'pipe'],
        detached: false,
        shell: false,
        windowsHide: true
      })
    } catch (err) {
      throw new GW_ERR_BACKEND_UNAVAILABLE(server, (err as Error).message, { cause: err })
    }
    // Spawn failures (ENOENT, EACCES) arrive as an 'error' event instead of 'spawn': the caller
    // never had a connection, so the factory rejects instead of calling onExit.
    try {
      await new Promise<void>((resolve, reject) => {
        // Each takes the other's listener off: one left behind would keep this promise (and its
        // closure) alive with the child for the life of the session (heap per idle session).
        const onSpawn = (): void => { child.off('error', onError); resolve() }
        const onError = (err: Error): void => { child.off('spawn', onSpawn); reject(err) }
        child.once('spawn', onSpawn)
        child.once('error', onError)
      })
    } catch (err) {
      // Not the error object itself: Node puts the (${ENV}-expanded) arguments in err.spawnargs.
      const { code, message } = err as NodeJS.ErrnoException
      options.log.warn({ code, reason: message, backend: server, command: config.command }, 'backend failed to start')
      throw new GW_ERR_BACKEND_UNAVAILABLE(server, (err as Error).message, { cause: err })
    }
    // Its lines carry backend and pid; a child that is quiet on stderr never makes the logger.
    const bindings = newBindings(options.log, { backend: server, pid: child.pid })
    options.log.info({ ...bindings, command: config.command }, 'backend started')
    const backend = new StdioBackend(server, config, child, lazyChild(options.log, bindings), handlers)
    backend.credentialExpiresAt = credential.expiresAt
    return backend
  }
}

/** The factory for `transport: 'stdio'` servers. */
export const openStdioBackend: BackendFactory = createStdioBackendFactory()
