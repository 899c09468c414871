#!/usr/bin/env node
// Checks the relative links of the repository's Markdown files: the file or folder each names
// exists, and a #anchor matches a heading of the target (GitHub's slugs). External links are not
// fetched. Usage: node tools/check-links.mjs [file.md ...] (default: every .md outside
// node_modules, dist and .git). Exits 1 and lists each broken link.
import { readFileSync, readdirSync, statSync, existsSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'

const root = resolve(dirname(new URL(import.meta.url).pathname), '..')
const skip = new Set(['node_modules', 'dist', '.git', 'coverage', '.tap'])

function markdownFiles (dir) {
  const out = []
  for (const name of readdirSync(dir)) {
    if (skip.has(name)) continue
    const path = join(dir, name)
    if (statSync(path).isDirectory()) out.push(...markdownFiles(path))
    else if (name.endsWith('.md')) out.push(path)
  }
  return out
}

/** The text outside fenced code blocks, line by line. */
function proseLines (text) {
  const lines = []
  let fenced = false
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) { fenced = !fenced; continue }
    if (!fenced) lines.push(line)
  }
  return lines
}

function slug (heading) {
  return heading.trim().toLowerCase()
    .replace(/<[^>]*>/g, '')
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-')
}

const anchorCache = new Map()
function anchors (file) {
  if (!anchorCache.has(file)) {
    const seen = new Map()
    const set = new Set()
    for (const line of proseLines(readFileSync(file, 'utf8'))) {
      const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)
      if (!m) continue
      const base = slug(m[1])
      const n = seen.get(base) ?? 0
      seen.set(base, n + 1)
      set.add(n === 0 ? base : `${base}-${n}`)
    }
    anchorCache.set(file, set)
  }
  return anchorCache.get(file)
}

const files = process.argv.length > 2 ? process.argv.slice(2).map(f => resolve(f)) : markdownFiles(root)
const broken = []
let checked = 0
for (const file of files) {
  const lines = proseLines(readFileSync(file, 'utf8'))
  for (const line of lines) {
    // Inline code may hold brackets that are not links.
    const prose = line.replace(/`[^`]*`/g, m => m.includes('](') ? m : '``')
    for (const m of prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
      const target = m[1].replace(/^<|>$/g, '')
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue
      checked++
      const [pathPart, anchor] = target.split('#')
      const dest = pathPart ? resolve(dirname(file), decodeURIComponent(pathPart)) : file
      const where = `${relative(root, file)}: ${target}`
      if (!existsSync(dest)) { broken.push(`${where} (no such file)`); continue }
      if (anchor !== undefined && anchor !== '') {
        if (!dest.endsWith('.md')) { broken.push(`${where} (anchor on a non-Markdown file)`); continue }
        if (!anchors(dest).has(anchor)) broken.push(`${where} (no heading #${anchor})`)
      }
    }
  }
}
for (const b of broken) console.log(b)
console.log(`${checked} relative links in ${files.length} files, ${broken.length} broken`)
process.exitCode = broken.length ? 1 : 0
