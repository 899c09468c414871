// MCP Tasks (specification 2025-11-25, "Tasks") through an aggregate session: what the aggregate
// says it can do, and the task ids its members mint made unambiguous. Two members may mint the same
// id, and the client sees one server, so every id a member shows is tagged with the member's server
// name (`<server>:<its own id>`: a server name has no `:`, so the first one ends the tag), and a
// tasks/get, tasks/result or tasks/cancel goes to the member its tag names, under the member's own id.
// Pure: the relay (relay.ts) runs the requests. docs/behaviour.md, "Aggregating servers", says
// which members take part (those with a connection of the session's own) and why.
import type { Logger } from 'pino'
import { GW_ERR_BACKEND_TIMEOUT } from '../../core/errors.js'
import { isRecord } from '../../core/jsonrpc.js'
import { META_MEMBER, withTimeout } from './catalogue.js'

/** `_meta` key of a message that relates to a task (specification, "Tasks": related task metadata). */
export const RELATED_TASK = 'io.modelcontextprotocol/related-task'

/** The tasks/* requests that name one task by `params.taskId`. */
export const TASK_ID_METHODS: ReadonlySet<string> = new Set(['tasks/get', 'tasks/result', 'tasks/cancel'])

const TAG_END = ':'

/** A member's task id as the client sees it. */
export function tagTaskId (server: string, taskId: string): string {
  return `${server}${TAG_END}${taskId}`
}

/** The member's server and its own id behind a tagged id; null for an id with no tag. */
export function untagTaskId (tagged: string): { server: string, taskId: string } | null {
  const end = tagged.indexOf(TAG_END)
  if (end <= 0 || end === tagged.length - 1) return null
  return { server: tagged.slice(0, end), taskId: tagged.slice(end + 1) }
}

/**
 * The error of an unknown task, as the SDK's servers answer it (-32602 Invalid params, and the same
 * words): a client cannot tell an id with no member's tag from one its member no longer has.
 */
export function unknownTaskMessage (method: string, taskId: string): string {
  return method === 'tasks/get' ? 'Failed to retrieve task: Task not found' : `Task not found: ${taskId}`
}

/**
 * The aggregate's `tasks` capability: what at least one of `capabilities` (the taking-part members'
 * own) offers, among what the gateway routes (list, cancel, task-augmented tools/call); none when no
 * member has tasks.
 */
export function unitedTasks (capabilities: ReadonlyArray<Record<string, unknown>>): Record<string, unknown> | undefined {
  const tasks = capabilities.map(c => c.tasks).filter(isRecord)
  if (tasks.length === 0) return undefined
  const united: Record<string, unknown> = {}
  if (tasks.some(t => t.list !== undefined)) united.list = {}
  if (tasks.some(t => t.cancel !== undefined)) united.cancel = {}
  if (tasks.some(t => isRecord(t.requests) && isRecord(t.requests.tools) && t.requests.tools.call !== undefined)) united.requests = { tools: { call: {} } }
  return united
}

/** `_meta` with its related task's id tagged; the same object when it names none. */
function tagMeta (server: string, meta: unknown): unknown {
  if (!isRecord(meta) || !isRecord(meta[RELATED_TASK]) || typeof meta[RELATED_TASK].taskId !== 'string') return meta
  return { ...meta, [RELATED_TASK]: { ...meta[RELATED_TASK], taskId: tagTaskId(server, meta[RELATED_TASK].taskId) } }
}

/** A task object (Task: tasks/get and tasks/cancel results, tasks/list entries, status notifications) with its id tagged. */
export function tagTask (server: string, task: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...task }
  if (typeof task.taskId === 'string') out.taskId = tagTaskId(server, task.taskId)
  if (task._meta !== undefined) out._meta = tagMeta(server, task._meta)
  return out
}

/**
 * A member's result of `method` with the task ids it carries tagged: a CreateTaskResult's `task`,
 * the task that tasks/get and tasks/cancel answer, and the related task in `_meta` (tasks/result).
 */
export function tagTaskResult (server: string, method: string, result: Record<string, unknown>): Record<string, unknown> {
  if (method === 'tasks/get' || method === 'tasks/cancel') return tagTask(server, result)
  let out = result
  if (isRecord(result.task) && typeof result.task.taskId === 'string') out = { ...out, task: tagTask(server, result.task) }
  const meta = tagMeta(server, result._meta)
  if (meta !== result._meta) out = { ...out, _meta: meta }
  return out
}

/**
 * A member's notification or request params with the task ids they carry tagged: a status
 * notification's task, and any message's related task in `_meta`.
 */
export function tagTaskParams (server: string, method: string, params: Record<string, unknown>): Record<string, unknown> {
  if (method === 'notifications/tasks/status') return tagTask(server, params)
  const meta = tagMeta(server, params._meta)
  return meta === params._meta ? params : { ...params, _meta: meta }
}

/** Pages of one member's tasks/list read for the aggregate's, at most. */
const MAX_TASK_PAGES = 50

/**
 * An aggregate session's tasks/list: each listing member's whole list (read to its end, within
 * `timeoutMs` and MAX_TASK_PAGES pages) in member order, with tagged ids, in one page: the
 * aggregate gives no cursor, so it takes none. A member that fails to list is left out, as from
 * any merged list.
 */
export async function mergedTasks (
  members: readonly string[],
  list: (member: string, params: Record<string, unknown>) => Promise<Record<string, unknown>>,
  timeoutMs: number,
  log: Logger
): Promise<{ tasks: Array<Record<string, unknown>> }> {
  const lists = await Promise.all(members.map(async member => {
    try {
      return await withTimeout(memberTasks(member, list), timeoutMs, () => new GW_ERR_BACKEND_TIMEOUT(member, timeoutMs))
    } catch (err) {
      log.warn({ member, list: 'tasks', reason: err instanceof Error ? err.message : String(err) }, 'aggregate member left out of a list (slow or failing)')
      return []
    }
  }))
  return { tasks: lists.flat() }
}

/** One member's tasks, every page, with tagged ids. */
async function memberTasks (member: string, list: (member: string, params: Record<string, unknown>) => Promise<Record<string, unknown>>): Promise<Array<Record<string, unknown>>> {
  const out: Array<Record<string, unknown>> = []
  let cursor: string | undefined
  for (let page = 0; page < MAX_TASK_PAGES; page++) {
    const result = await list(member, cursor !== undefined ? { cursor } : {})
    if (Array.isArray(result.tasks)) for (const task of result.tasks) if (isRecord(task)) out.push(tagTask(member, task))
    if (typeof result.nextCursor !== 'string' || result.nextCursor === '') break
    cursor = result.nextCursor
  }
  return out
}

/**
 * A tools/list page whose tools of the `plain` members (pooled ones) say nothing of tasks:
 * through the aggregate those run as plain calls.
 */
export function withoutTaskSupport (page: Record<string, unknown>, plain: ReadonlySet<string>): Record<string, unknown> {
  if (!Array.isArray(page.tools) || plain.size === 0) return page
  return {
    ...page,
    tools: page.tools.map((tool: unknown) => {
      if (!isRecord(tool) || !isRecord(tool._meta) || !plain.has(String(tool._meta[META_MEMBER])) || !isRecord(tool.execution) || tool.execution.taskSupport === undefined) return tool
      const { taskSupport: _dropped, ...execution } = tool.execution
      return { ...tool, execution }
    })
  }
}
