// Tool policy of a tenant on one server (docs/authentication.md): `tools: { allow, deny }`, globs
// where `*` matches any run of characters (none included) and everything else matches itself. A
// tool is callable when it matches an allow pattern (or allow is absent) and no deny pattern; deny
// wins. `tools/list` answers are filtered to callable tools; a `tools/call` of any other tool is
// answered by the gateway as an unknown tool (-32602) without reaching the backend.
import type { ToolPolicyConfig } from '../config/schema.js'
import { GW_ERR_UNKNOWN_TOOL, toJsonRpcError } from '../core/errors.js'
import type { JsonRpcRequest, JsonRpcResponse } from '../core/jsonrpc.js'
import { audit, type AuditLog } from '../telemetry/audit.js'
import type { TenantDirectory } from './tenants.js'

export interface ToolPolicy {
  allows (tool: string): boolean
}

function globToRegExp (glob: string): RegExp {
  const body = glob.split('*').map(part => part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*')
  return new RegExp(`^${body}$`, 's')
}

export function compileToolPolicy (config: Readonly<{ allow?: readonly string[] | undefined, deny?: readonly string[] | undefined }>): ToolPolicy {
  const allow = config.allow?.map(globToRegExp)
  const deny = (config.deny ?? []).map(globToRegExp)
  return {
    allows: tool => (allow === undefined || allow.some(re => re.test(tool))) && !deny.some(re => re.test(tool))
  }
}

/** Compiled once per policy object (the config is frozen, so its objects are stable keys). */
const compiled = new WeakMap<ToolPolicyConfig, ToolPolicy>()

/** The policy of a tenant on a server, or null when every tool is allowed (anonymous, no `tools`). */
export type ToolPolicyLookup = (tenant: string | null | undefined, server: string) => ToolPolicy | null

/** The lookup over the tenant table, so a replaced table (config reload) applies at once. */
export function toolPolicies (tenants: Pick<TenantDirectory, 'server'>): ToolPolicyLookup {
  return (tenant, server) => {
    if (tenant === null || tenant === undefined) return null
    const tools = tenants.server(tenant, server)?.tools
    if (tools === undefined) return null
    let policy = compiled.get(tools)
    if (policy === undefined) compiled.set(tools, policy = compileToolPolicy(tools))
    return policy
  }
}

/** The tool a `tools/call` names, or undefined when its params carry no string name. */
export function toolNameOf (params: unknown): string | undefined {
  if (typeof params !== 'object' || params === null) return undefined
  const name = (params as { name?: unknown }).name
  return typeof name === 'string' ? name : undefined
}

/** A `tools/list` result with only the tools the policy allows; anything else passes unchanged. */
export function filterToolsList (result: unknown, policy: ToolPolicy): unknown {
  if (typeof result !== 'object' || result === null || !Array.isArray((result as { tools?: unknown }).tools)) return result
  const tools = (result as { tools: unknown[] }).tools
  return { ...result, tools: tools.filter(tool => typeof tool === 'object' && tool !== null && policy.allows(String((tool as { name?: unknown }).name))) }
}

/** The relay's result filter: a `tools/list` answer under a policy is filtered; anything else passes. */
export function filterToolsListOf (method: string, result: unknown, policy: ToolPolicy | null): unknown {
  return method === 'tools/list' && policy !== null ? filterToolsList(result, policy) : result
}

/** Who makes a call, as its audit line names them. */
export interface Caller {
  tenant: string | null | undefined
  subject: string | undefined
  server: string
}

/**
 * The answer to a `tools/call` the caller's policy denies (an unknown tool, -32602), with its audit
 * line written; null when the call may go on. One rule for sessions and 2026-07-28 requests.
 */
export function refusedCall (lookup: ToolPolicyLookup | undefined, caller: Caller, request: JsonRpcRequest, log: AuditLog): JsonRpcResponse | null {
  if (request.method !== 'tools/call') return null
  const policy = lookup?.(caller.tenant, caller.server) ?? null
  const tool = toolNameOf(request.params) ?? ''
  if (policy === null || policy.allows(tool)) return null
  audit(log, 'tools.call', { tenant: caller.tenant ?? null, subject: caller.subject, server: caller.server, tool: tool.slice(0, 128), outcome: 'denied', ms: 0 })
  return toJsonRpcError(new GW_ERR_UNKNOWN_TOOL(tool), request.id)
}
