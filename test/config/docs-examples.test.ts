// Every config example in the README and docs/ that is a whole config (it has `servers`) passes the
// same check as `--check-config` (an example with `...` placeholders must not be refused). Its
// `${NAME}` placeholders are the docs' way to say "your secret", so each is given a value.
import { readdir, readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { parse } from 'yaml'
import { parseConfig } from '../../src/config/load.js'

// dist/test/config/docs-examples.test.js -> the repository root
const repo = fileURLToPath(new URL('../../../', import.meta.url))

t.test('the docs\' whole-config YAML examples are valid configs', async t => {
  const files = ['README.md', ...(await readdir(join(repo, 'docs'))).filter(f => f.endsWith('.md')).map(f => join('docs', f))]
  let checked = 0
  for (const file of files) {
    const text = await readFile(join(repo, file), 'utf8')
    for (const block of text.matchAll(/```ya?ml\n([\s\S]*?)```/g)) {
      const where = `${file}:${text.slice(0, block.index).split('\n').length}`
      const source = block[1] ?? ''
      const raw: unknown = parse(source)
      if (typeof raw !== 'object' || raw === null || !('servers' in raw)) continue
      const env = Object.fromEntries([...source.matchAll(/\$\{([A-Za-z_][A-Za-z0-9_]*)/g)].map(m => [m[1], 'x']))
      t.doesNotThrow(() => parseConfig(raw, env), where)
      checked++
    }
  }
  // The README's minimal config, configuration.md's, and behaviour.md's pooled and aggregate ones at least.
  t.ok(checked >= 4, `${checked} examples checked`)
})
