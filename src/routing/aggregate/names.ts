// The names an aggregate server exposes for its members' tools and prompts. Pure: the
// same members' lists give the same names on every replica and after every restart.
//
// Rules, in this order (docs/behaviour.md, "Aggregating servers"):
// 1. `<prefix><separator><name>`, or `<name>` for an empty prefix.
// 2. A name longer than MAX_NAME (64: what clients and model APIs accept) keeps its first
//    MAX_NAME - 9 characters, then `-` and 8 hex digits of the SHA-256 of the whole long name.
// 3. A name an earlier entry took (earlier member, or earlier in the same member's list) gets
//    `<separator><member server name>` appended (shortened by rule 2 if need be), then, if that is
//    taken too, `-2`, `-3`, ... before it. Members come in their configured (priority) order, each
//    member's entries in the order it listed them, so the earlier member keeps the plain name.
import { createHash } from 'node:crypto'

/** The longest tool or prompt name clients and model APIs accept. */
export const MAX_NAME = 64

export interface MemberEntries<T> {
  /** The member's server name. */
  server: string
  prefix: string
  entries: readonly T[]
}

export interface Exposed<T> {
  exposed: string
  server: string
  /** The member's own name. */
  name: string
  entry: T
}

/** Shortens a name over MAX_NAME by rule 2. */
export function fitName (name: string): string {
  if (name.length <= MAX_NAME) return name
  const digest = createHash('sha256').update(name).digest('hex').slice(0, 8)
  return `${name.slice(0, MAX_NAME - 9)}-${digest}`
}

/**
 * The exposed names of every member's entries (rules 1-3). `collided` is called for each entry
 * whose plain name another entry already had (a warning: both stay callable).
 */
export function exposeNames<T extends { name: string }> (
  members: ReadonlyArray<MemberEntries<T>>,
  separator: string,
  collided?: (entry: Exposed<T>, plain: string) => void
): Array<Exposed<T>> {
  const taken = new Set<string>()
  const out: Array<Exposed<T>> = []
  for (const member of members) {
    for (const entry of member.entries) {
      const plain = fitName(member.prefix === '' ? entry.name : `${member.prefix}${separator}${entry.name}`)
      let exposed = plain
      if (taken.has(exposed)) {
        const base = member.prefix === '' ? entry.name : `${member.prefix}${separator}${entry.name}`
        exposed = fitName(`${base}${separator}${member.server}`)
        for (let n = 2; taken.has(exposed); n++) exposed = fitName(`${base}${separator}${member.server}-${n}`)
      }
      taken.add(exposed)
      const item: Exposed<T> = { exposed, server: member.server, name: entry.name, entry }
      if (exposed !== plain) collided?.(item, plain)
      out.push(item)
    }
  }
  return out
}

/**
 * Whether a URI matches an RFC 6570 template, in the simple forms MCP servers use: `{var}` is one
 * path segment (no `/`), `{+var}` / `{#var}` anything, `{?a,b}` / `{&a}` a query part.
 */
export function templateMatches (template: string, uri: string): boolean {
  let re = '^'
  let last = 0
  for (const m of template.matchAll(/\{([+#?&/.;]?)[^}]*\}/g)) {
    re += template.slice(last, m.index).replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
    const op = m[1]
    re += op === '+' || op === '#' ? '.*' : op === '?' || op === '&' ? '(?:[?&].*)?' : '[^/?#]*'
    last = (m.index ?? 0) + m[0].length
  }
  re += `${template.slice(last).replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`
  try {
    return new RegExp(re, 's').test(uri)
  } catch {
    return false
  }
}
