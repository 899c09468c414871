// Live reload (docs/configuration.md): re-reads the config file the process started with, on SIGHUP
// (main.ts) or, opt-in (`reload.watch`), when the file changes on disk, and hands a valid result to
// the LiveConfig (live.ts), which applies its routing settings. A bad file is refused with every
// problem logged, and the running config stays.
//
// The watch is on the file's folder, not on the file: an editor that saves by writing a new file
// and renaming it over the old one (vim, most IDEs) replaces the inode a file watch would be
// attached to, and a Kubernetes ConfigMap volume swaps a symlinked folder. Any event in the
// folder starts the debounce; the file is then read and reloaded only if its bytes changed.
import { createHash } from 'node:crypto'
import { watch, type FSWatcher } from 'node:fs'
import { readFile } from 'node:fs/promises'
import { dirname, resolve } from 'node:path'
import type { Logger } from 'pino'
import { loadConfig } from './load.js'
import { isEmptyChange, type ConfigChange, type LiveConfig } from './live.js'
import type { Config } from './schema.js'

export interface ReloaderOptions {
  /** The config file (the same path as at start). */
  path: string
  live: LiveConfig
  log: Logger
  /** Reads and validates a file; loadConfig by default (the same loader as at boot). */
  load?: (path: string) => Promise<Readonly<Config>>
}

export type ReloadOutcome =
  | { ok: true, change: ConfigChange }
  | { ok: false, errors: string[] }

export class ConfigReloader {
  readonly #options: ReloaderOptions
  readonly #path: string
  /** Reloads run one after another, never interleaved. */
  #queue: Promise<unknown> = Promise.resolve()
  /** Digest of the bytes last read, so a watch event with no content change does nothing. */
  #lastDigest: string | null = null
  #watcher: FSWatcher | undefined
  #debounce: NodeJS.Timeout | undefined
  #closed = false

  constructor (options: ReloaderOptions) {
    this.#options = options
    this.#path = resolve(options.path)
  }

  /** Re-reads the file and applies it when valid; logs the outcome either way. */
  async reload (trigger: string): Promise<ReloadOutcome> {
    const run = this.#queue.then(async () => await this.#reload(trigger))
    this.#queue = run.catch(() => {})
    return await run
  }

  /**
   * Starts watching the file (opt-in): a change is reloaded `debounceMs` after the last event.
   * The bytes at this moment are the baseline, so starting the watch reloads nothing.
   */
  async watch (debounceMs: number): Promise<void> {
    if (this.#watcher !== undefined || this.#closed) return
    this.#lastDigest = await this.#digest()
    const log = this.#options.log
    const folder = dirname(this.#path)
    this.#watcher = watch(folder, { persistent: false }, () => {
      clearTimeout(this.#debounce)
      this.#debounce = setTimeout(() => { void this.#onSettled() }, debounceMs)
      this.#debounce.unref()
    })
    this.#watcher.on('error', err => {
      // The folder itself went away: nothing to watch any more; SIGHUP still works.
      log.error({ err, path: this.#path }, 'config watch failed; reload with SIGHUP')
      this.#stopWatching()
    })
    log.info({ path: this.#path, debounceMs }, 'watching the config file')
  }

  close (): void {
    this.#closed = true
    this.#stopWatching()
  }

  #stopWatching (): void {
    clearTimeout(this.#debounce)
    this.#watcher?.close()
    this.#watcher = undefined
  }

  async #onSettled (): Promise<void> {
    if (this.#closed) return
    const digest = await this.#digest()
    // Gone for now (an editor between unlink and rename), or unchanged: wait for the next event.
    if (digest === null || digest === this.#lastDigest) return
    await this.reload('watch')
  }

  async #digest (): Promise<string | null> {
    try {
      return createHash('sha256').update(await readFile(this.#path)).digest('hex')
    } catch {
      return null
    }
  }

  async #reload (trigger: string): Promise<ReloadOutcome> {
    const log = this.#options.log
    const path = this.#path
    if (this.#closed) {
      log.warn({ trigger }, 'config reload ignored: shutting down')
      return { ok: false, errors: ['shutting down'] }
    }
    this.#lastDigest = await this.#digest()
    let next: Readonly<Config>
    try {
      next = await (this.#options.load ?? loadConfig)(path)
    } catch (err) {
      const errors = problemsOf(err)
      log.error({ trigger, path, errors }, 'config reload refused; the running config stays')
      return { ok: false, errors }
    }
    const { change, failures } = await this.#options.live.apply(next)
    for (const err of failures) log.error({ err, trigger }, 'config reload: a listener failed')
    if (change.restartNeeded.length > 0) {
      log.warn({ trigger, keys: change.restartNeeded }, 'config reload: these settings need a restart and were not applied')
    }
    if (isEmptyChange(change)) {
      log.info({ trigger, path }, 'config reloaded: no change')
    } else {
      log.info({ trigger, path, servers: change.servers, tenants: change.tenants, auth: change.auth }, 'config reloaded')
    }
    return { ok: true, change }
  }
}

/** The loader's problems, one per line ("N problems" heading dropped). */
function problemsOf (err: unknown): string[] {
  const message = err instanceof Error ? err.message : String(err)
  const lines = message.split('\n').map(line => line.trim()).filter(line => line !== '')
  if (lines.length > 1 && /^Invalid configuration: (?:\d+ problems?|not valid YAML)$/.test(lines[0] ?? '')) lines.shift()
  return lines
}
