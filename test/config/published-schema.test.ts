// config/gateway.schema.json is what editors read: it must be the one schema, current.
import { readFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { Ajv } from 'ajv'
import { parse } from 'yaml'
import t from 'tap'
import { publishedSchema, publishedSchemaText, SCHEMA_FILE } from '../../src/config/published-schema.js'

const repo = fileURLToPath(new URL('../../../', import.meta.url))

t.test('config/gateway.schema.json is current (regenerate with `npm run schema`)', async t => {
  const onDisk = await readFile(repo + SCHEMA_FILE, 'utf8')
  t.equal(onDisk, publishedSchemaText(), 'run `npm run schema` and commit the file')
})

t.test('a plain draft-07 validator (what an editor runs) accepts the shipped configs and rejects a broken one', async t => {
  const validate = new Ajv({ allErrors: true, strict: false }).compile(publishedSchema())
  for (const name of ['gateway.yaml', 'gateway.docker.yaml']) {
    const raw = parse(await readFile(`${repo}config/${name}`, 'utf8')) as unknown
    t.ok(validate(raw), `${name}: ${JSON.stringify(validate.errors)}`)
  }
  t.notOk(validate({ servers: { a: { transport: 'stdio' } }, listen: { port: 'eighty' } }))
  t.ok((validate.errors ?? []).some(e => e.instancePath === '/listen/port'), 'names the bad path')
  t.ok(validate({ listen: { port: '${PORT:-8080}' }, redis: { url: '${REDIS_URL}' }, servers: { a: { transport: 'stdio', command: 'node' } } }), 'placeholders pass where values come from the environment')
  t.notOk(validate({ servers: { a: { transport: 'stdio', command: 'node', bogus: 1 } } }), 'unknown options are still refused')
})
