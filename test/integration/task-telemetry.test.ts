// What the gateway observes of Tasks (MCP 2025-11-25, "Tasks") on every session kind, from the
// messages its clients get: mcpgw_tasks_created_total and mcpgw_task_status_transitions_total, the
// audit lines task.created and task.cancel, and the console's view of a session's tasks (admin
// API). A dedicated stdio session, a pooled one and an aggregate member, each server-everything
// over stdio, driven by the SDK v1 client; one observer serves all three, under the ids the client sees.
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js'
import t from 'tap'
import { startGateway } from '../helpers/gateway.js'
import { scrape } from '../helpers/prometheus.js'
import { eventually, textOf } from '../helpers/wait.js'
import { createLogger, shortHash } from '../../src/telemetry/logger.js'

const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const everything = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] }
const TOKEN = 'task-telemetry-admin-token-0123456789'

const CASES = [
  { server: 'dedicated', tool: 'simulate-research-query', id: /^[\w-]+$/ },
  { server: 'pooled', tool: 'simulate-research-query', id: /^[\w-]{24}$/ },
  { server: 'agg', tool: 'ev__simulate-research-query', id: /^dedicated:[\w-]+$/ }
]

t.test('tasks on every kind: metrics, audit lines and the console\'s view, under the ids the client sees', async t => {
  const lines: string[] = []
  const gw = await startGateway(t, {
    admin: { token: TOKEN },
    servers: {
      dedicated: everything,
      pooled: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 2, poolWaitMs: 30_000 },
      agg: { transport: 'aggregate', members: [{ server: 'dedicated', prefix: 'ev' }] }
    }
  }, { log: createLogger('info', 'tasks', { write: (line: string) => { lines.push(line) } }) })
  const audits = (event: string): Array<Record<string, unknown>> =>
    lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => l.audit === event)
  const admin = async (path: string): Promise<{ status: number, body: Record<string, unknown> }> => {
    const res = await fetch(`${gw.url}/admin/api${path}`, { headers: { authorization: `Bearer ${TOKEN}` } })
    return { status: res.status, body: await res.json() as Record<string, unknown> }
  }

  for (const c of CASES) {
    t.test(c.server, async t => {
      const client = new Client({ name: `telemetry-${c.server}`, version: '1' })
      const transport = new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${c.server}`))
      await client.connect(transport)
      t.teardown(async () => { await client.close().catch(() => {}) })
      const digest = shortHash(transport.sessionId ?? '')
      const start = async (topic: string): Promise<string> => (await client.request({
        method: 'tools/call', params: { name: c.tool, arguments: { topic }, task: { ttl: 60_000 } }
      }, CreateTaskResultSchema)).task.taskId

      const done = await start('observed')
      const cancelled = await start('cancelled')
      t.match(done, c.id, 'the id the client sees')
      t.match(await client.experimental.tasks.cancelTask(cancelled), { taskId: cancelled, status: 'cancelled' })
      t.match(textOf(await client.experimental.tasks.getTaskResult(done, CallToolResultSchema)), /Research Report: observed/)
      await client.experimental.tasks.getTask(done)

      // Metrics: two created, each status once per task.
      const m = await eventually('the task metrics', async () => {
        const s = await scrape(gw.url)
        return s.sum('mcpgw_task_status_transitions_total', { server: c.server, status: 'completed' }) >= 1 ? s : undefined
      })
      t.equal(m.sum('mcpgw_tasks_created_total', { server: c.server }), 2, 'two tasks created')
      t.equal(m.sum('mcpgw_task_status_transitions_total', { server: c.server, status: 'cancelled' }), 1, 'one cancelled')
      t.equal(m.sum('mcpgw_task_status_transitions_total', { server: c.server, status: 'completed' }), 1, 'one completed, counted once however often it was polled')
      t.equal(m.sum('mcpgw_task_status_transitions_total', { server: c.server, status: 'working' }), 2, 'both were working')
      t.notOk(m.text.includes(done), 'no task id in any label')

      // Audit lines: who created and who asked to cancel, never a body.
      const created = audits('task.created').filter(a => a.server === c.server)
      t.match(created, [{ session: digest, taskId: done, status: 'working', tenant: null, subject: 'anonymous' }, { session: digest, taskId: cancelled }], 'task.created, in order')
      t.match(audits('task.cancel').filter(a => a.server === c.server), [{ session: digest, taskId: cancelled, tenant: null }], 'task.cancel')
      t.notOk(lines.some(l => l.includes('Research Report')), 'no result text in the log')

      // The console's view: the session's tasks, any replica reads them from the store.
      const view = await eventually('the task view', async () => {
        const got = await admin(`/sessions/${digest}/tasks`)
        const tasks = got.body.tasks as Array<Record<string, unknown>> | undefined
        return tasks?.find(task => task.taskId === done)?.status === 'completed' ? got : undefined
      })
      t.equal(view.status, 200)
      t.match(view.body, { session: digest, server: c.server })
      const tasks = view.body.tasks as Array<Record<string, unknown>>
      t.same(tasks.map(task => task.taskId), [done, cancelled], 'both tasks, oldest first')
      t.match(tasks, [
        { status: 'completed', ttl: Number, createdAt: String, lastUpdatedAt: String, seenAt: Number },
        { status: 'cancelled' }
      ])
    })
  }

  t.test('an unknown session digest is a 404', async t => {
    t.equal((await admin('/sessions/AAAAAAAAAA/tasks')).status, 404)
  })
})
