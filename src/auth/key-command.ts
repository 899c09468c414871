// `mcp-gateway key <tenant> <id>`: prints a new random API key and the config line that holds
// its digest. The key is shown once and stored nowhere; the config only ever holds the digest.
import { apiKeyConfigLine, generateApiKey } from './api-keys.js'
import { GW_ERR_CONFIG_INVALID } from '../core/errors.js'

export const KEY_USAGE = `Usage: mcp-gateway key TENANT ID
  Prints a new API key for TENANT (a key id ID, e.g. ci-bot) and the line to paste under
  tenants.TENANT.apiKeys in the config. The key is shown only now.
`

// The schema's patterns for tenant names and key ids (src/config/schema.ts).
const TENANT = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/
const KEY_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/

/** The command's output for `key <tenant> <id>`; throws GW_ERR_CONFIG_INVALID on bad arguments. */
export function keyCommand (args: string[]): string {
  const [tenant, id, ...rest] = args
  if (tenant === undefined || id === undefined || rest.length > 0) throw new GW_ERR_CONFIG_INVALID(`key needs exactly a tenant and a key id\n${KEY_USAGE}`)
  if (!TENANT.test(tenant)) throw new GW_ERR_CONFIG_INVALID(`'${tenant.slice(0, 64)}' is not a valid tenant name (letters, digits, _ and -)\n${KEY_USAGE}`)
  if (!KEY_ID.test(id)) throw new GW_ERR_CONFIG_INVALID(`'${id.slice(0, 64)}' is not a valid key id (letters, digits, _, . and -)\n${KEY_USAGE}`)
  const key = generateApiKey()
  return [
    `# New API key for tenant ${tenant}, id ${id}. Shown only now: give it to the client as a secret.`,
    key,
    `# Paste under tenants.${tenant}.apiKeys in the gateway config:`,
    apiKeyConfigLine(id, key),
    ''
  ].join('\n')
}
