// The configuration a running gateway serves from, replaceable at run time (live reload:
// docs/configuration.md; docs/architecture.md).
//
// - Routing settings (`servers`, `auth`, `tenants`) are reloadable: a new config replaces them at
//   once, and every listener registered with onChange() hears what changed.
// - Every other top-level key is a process setting (listen, redis, log, http, sessions, shutdown,
//   reload, metrics, tracing, ...). A reload never applies one: the running value stays, and the
//   change lists the key in `restartNeeded` so it can be reported.
//   Refusing the whole reload instead would hold back a server change behind an unrelated edit.
//
// Readers on the hot path read `live.servers` (a getter over one frozen object): no copy per
// request. A session keeps the ServerConfig object it was opened with, so a changed server's
// existing sessions go on with their old settings while its new sessions get the new ones.
import type { Config, ServerConfig } from './schema.js'
import { deepFreeze } from '../core/freeze.js'

/** The top-level keys a reload applies; every other key needs a restart. */
export const RELOADABLE_KEYS = ['servers', 'auth', 'tenants'] as const

/** Anything that can say which servers exist now: a LiveConfig, or a plain Config (tests). */
export interface ServerSource {
  readonly servers: Readonly<Record<string, ServerConfig>>
}

/** Names added, changed (settings differ) and removed between two configs. */
export interface NameDiff {
  added: string[]
  changed: string[]
  removed: string[]
}

export interface ConfigChange {
  previous: Readonly<Config>
  /** The config now served: the new routing settings on the running process settings. */
  current: Readonly<Config>
  servers: NameDiff
  tenants: NameDiff
  /** Whether `auth` differs. */
  auth: boolean
  /** Process settings that differ in the new file: not applied, they need a restart. */
  restartNeeded: string[]
}

export type ChangeListener = (change: ConfigChange) => void | Promise<void>

export class LiveConfig implements ServerSource {
  #current: Readonly<Config>
  readonly #listeners: ChangeListener[] = []

  constructor (config: Readonly<Config>) {
    this.#current = config
  }

  get current (): Readonly<Config> { return this.#current }
  get servers (): Readonly<Record<string, ServerConfig>> { return this.#current.servers }

  /**
   * Registers a listener, called after each applied change, in registration order (e.g. the
   * router ends the sessions of removed servers; the tenant directory replaces its tenants).
   * Returns the function that unregisters it.
   */
  onChange (listener: ChangeListener): () => void {
    this.#listeners.push(listener)
    return () => {
      const i = this.#listeners.indexOf(listener)
      if (i >= 0) this.#listeners.splice(i, 1)
    }
  }

  /**
   * Serves the routing settings of `next` (already validated by the loader) from now on and
   * awaits every listener. A listener that throws does not stop the others; its error is
   * returned in `failures` for the caller to log.
   */
  async apply (next: Readonly<Config>): Promise<{ change: ConfigChange, failures: unknown[] }> {
    const previous = this.#current
    const merged: Record<string, unknown> = { ...previous }
    for (const key of RELOADABLE_KEYS) {
      if (next[key] === undefined) delete merged[key]
      else merged[key] = next[key]
    }
    const current = deepFreeze(merged as unknown as Config)
    const change: ConfigChange = {
      previous,
      current,
      servers: diffNames(previous.servers, next.servers),
      tenants: diffNames(previous.tenants ?? {}, next.tenants ?? {}),
      auth: !sameValue(previous.auth, next.auth),
      restartNeeded: processSettingsChanged(previous, next)
    }
    this.#current = current
    const failures: unknown[] = []
    for (const listener of [...this.#listeners]) {
      try {
        await listener(change)
      } catch (err) {
        failures.push(err)
      }
    }
    return { change, failures }
  }
}

/** Whether a change touches nothing at all (a reload of an unchanged file). */
export function isEmptyChange (change: ConfigChange): boolean {
  const empty = (d: NameDiff): boolean => d.added.length + d.changed.length + d.removed.length === 0
  return empty(change.servers) && empty(change.tenants) && !change.auth && change.restartNeeded.length === 0
}

export function diffNames (before: Readonly<Record<string, unknown>>, after: Readonly<Record<string, unknown>>): NameDiff {
  const diff: NameDiff = { added: [], changed: [], removed: [] }
  for (const name of Object.keys(after)) {
    if (!Object.hasOwn(before, name)) diff.added.push(name)
    else if (!sameValue(before[name], after[name])) diff.changed.push(name)
  }
  for (const name of Object.keys(before)) if (!Object.hasOwn(after, name)) diff.removed.push(name)
  return diff
}

function processSettingsChanged (before: Readonly<Config>, after: Readonly<Config>): string[] {
  const reloadable = new Set<string>(RELOADABLE_KEYS)
  const keys = new Set([...Object.keys(before), ...Object.keys(after)])
  return [...keys].filter(key => !reloadable.has(key) &&
    !sameValue((before as Record<string, unknown>)[key], (after as Record<string, unknown>)[key])).sort()
}

/** Deep equality of JSON values; key order does not matter (a reordered file is no change). */
export function sameValue (a: unknown, b: unknown): boolean {
  if (a === b) return true
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false
  if (Array.isArray(a) !== Array.isArray(b)) return false
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((item, i) => sameValue(item, b[i]))
  const ak = Object.keys(a)
  const bk = Object.keys(b)
  return ak.length === bk.length && ak.every(key => Object.hasOwn(b, key) &&
    sameValue((a as Record<string, unknown>)[key], (b as Record<string, unknown>)[key]))
}
