// The configuration's JSON Schema as published in config/gateway.schema.json, for editors that
// complete and validate the YAML (yaml-language-server, VS Code, JetBrains). Generated from the one
// schema (schema.ts), never edited by hand: `npm run schema` rewrites the file, and a test fails
// when the checked-in file is not current.
//
//   node dist/src/config/published-schema.js [FILE]   writes FILE (default config/gateway.schema.json)
import { writeFile } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { configSchema } from './schema.js'

export const SCHEMA_FILE = 'config/gateway.schema.json'

/** A value an editor sees before `${NAME}` placeholders are expanded at load time. */
const PLACEHOLDER = { type: 'string', pattern: '\\$\\{' } as const

type Node = Record<string, unknown>

/**
 * The file holds the YAML as written, placeholders unexpanded (`port: ${PORT:-8080}`,
 * `url: "${REDIS_URL}"`, `level: ${LOG_LEVEL:-info}`): wherever a value is typed other than string,
 * is an enum or a patterned string, a placeholder is accepted too. The loader checks the expanded
 * value against the strict schema.
 */
function allowPlaceholders (node: unknown): unknown {
  if (Array.isArray(node)) return node.map(allowPlaceholders)
  if (typeof node !== 'object' || node === null) return node
  const out: Node = {}
  for (const [key, value] of Object.entries(node as Node)) {
    // `properties` maps names to schemas: recurse into each, never treat the map as a schema.
    out[key] = key === 'properties'
      ? Object.fromEntries(Object.entries(value as Node).map(([name, child]) => [name, allowPlaceholders(child)]))
      : allowPlaceholders(value)
  }
  const type = out.type
  const scalar = type === 'integer' || type === 'number' || type === 'boolean' || 'enum' in out || (type === 'string' && 'pattern' in out)
  if (!scalar) return out
  const { default: fallback, ...strict } = out
  return fallback === undefined ? { anyOf: [strict, PLACEHOLDER] } : { anyOf: [strict, PLACEHOLDER], default: fallback }
}

/** The schema with the metadata an editor wants; ajv validates draft-07 by default, as declared. */
export function publishedSchema (): Record<string, unknown> {
  return {
    $schema: 'http://json-schema.org/draft-07/schema#',
    title: 'mcp-gateway configuration',
    description: 'Generated from src/config/schema.ts by `npm run schema`; every option with its default is in config/gateway.example.yaml. ${NAME} placeholders are accepted where a value may come from the environment.',
    ...(allowPlaceholders(configSchema) as Node)
  }
}

export function publishedSchemaText (): string {
  return `${JSON.stringify(publishedSchema(), null, 2)}\n`
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  await writeFile(process.argv[2] ?? SCHEMA_FILE, publishedSchemaText())
}
