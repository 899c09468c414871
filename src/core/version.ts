// The gateway's version, from its package.json (the admin API's replica list shows it). Found by
// walking up from this module: dist/src/core in a build and the image, src/core under a loader.
import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

function readVersion (): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (let i = 0; i < 5; i++) {
    const file = join(dir, 'package.json')
    if (existsSync(file)) {
      try {
        const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: unknown, version?: unknown }
        if (pkg.name === 'mcp-gateway' && typeof pkg.version === 'string') return pkg.version
      } catch { /* not ours: keep walking */ }
    }
    dir = dirname(dir)
  }
  return 'unknown'
}

export const GATEWAY_VERSION = readVersion()
