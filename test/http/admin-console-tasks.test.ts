// The console's session view of tasks (docs/console.md), in headless Chromium: "Tasks" on a session
// row shows the tasks its client was told of (id, status, status message, created, last update,
// ttl), kept current by the console's poll, for a dedicated and a pooled session alike. Without a
// chromium binary the test is skipped, except in CI (CI=true), where that is a failure.
import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js'
import t, { type Test } from 'tap'
import puppeteer, { type Page } from 'puppeteer-core'
import { startGateway, type RunningGateway } from '../helpers/gateway.js'
import { shortHash } from '../../src/telemetry/logger.js'

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'].find(p => existsSync(p))
const TOKEN = randomBytes(24).toString('base64url')
const EVERYTHING = fileURLToPath(new URL('../../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url))
const everything = { transport: 'stdio', command: process.execPath, args: [EVERYTHING, 'stdio'] }

interface Opened { client: Client, digest: string, tasks: (topic: string) => Promise<string> }

async function open (t: Test, gw: RunningGateway, server: string): Promise<Opened> {
  const client = new Client({ name: `console-${server}`, version: '1' })
  const transport = new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp/${server}`))
  await client.connect(transport)
  t.teardown(async () => { await client.close().catch(() => {}) })
  const tasks = async (topic: string): Promise<string> => (await client.request({
    method: 'tools/call', params: { name: 'simulate-research-query', arguments: { topic }, task: { ttl: 120_000 } }
  }, CreateTaskResultSchema)).task.taskId
  return { client, digest: shortHash(transport.sessionId ?? ''), tasks }
}

/** The rows of the tasks table: id, status and the other cells as shown. */
async function taskRows (page: Page): Promise<Array<{ id: string, cells: string[] }>> {
  return await page.$$eval('#tasks tbody tr[data-task]', rows => rows.map(r => ({ id: r.getAttribute('data-task') ?? '', cells: [...r.querySelectorAll('td')].map(c => c.textContent ?? '') })))
}

{
  const skip = CHROMIUM === undefined && process.env.CI !== 'true' ? 'no chromium binary (apt-get install -y chromium); in CI this fails instead' : false
  t.test('the console shows a session\'s live tasks', { skip }, async t => {
    t.ok(CHROMIUM, 'a chromium binary')
    if (CHROMIUM === undefined) return
    const gw = await startGateway(t, {
      admin: { token: TOKEN },
      servers: { dedicated: everything, pooled: { ...everything, sessions: 'pooled', poolSize: 1, poolMax: 2, poolWaitMs: 30_000 } }
    })
    const dedicated = await open(t, gw, 'dedicated')
    const pooled = await open(t, gw, 'pooled')
    const done = await dedicated.tasks('finished')
    const cancelled = await dedicated.tasks('dropped')
    await dedicated.client.experimental.tasks.cancelTask(cancelled)
    await dedicated.client.experimental.tasks.getTaskResult(done, CallToolResultSchema)
    const running = await dedicated.tasks('running')
    const pooledTask = await pooled.tasks('pooled')

    const browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-dev-shm-usage'] })
    t.teardown(async () => { await browser.close() })
    const page = await browser.newPage()
    await page.setViewport({ width: 1440, height: 1100 })
    const problems: string[] = []
    page.on('console', m => { if (m.type() === 'error' || m.type() === 'warn') problems.push(`${m.type()}: ${m.text()}`) })
    page.on('pageerror', err => { problems.push(`pageerror: ${String(err)}`) })
    page.on('requestfailed', r => { problems.push(`requestfailed: ${r.url()}`) })

    await page.goto(`${gw.url}/admin`, { waitUntil: 'load' })
    await page.type('#token', TOKEN)
    await page.click('#signin-form button[type=submit]')
    await page.waitForSelector(`#sessions tbody tr[data-session="${dedicated.digest}"]`)
    t.equal(await page.evaluate("document.getElementById('tasks-card').hidden"), true, 'no task view before a session is picked')

    await page.click(`button[data-tasks="${dedicated.digest}"]`)
    await page.waitForFunction(`document.querySelectorAll('#tasks tbody tr[data-task]').length === 3`)
    t.match(await page.$eval('#tasks-of', e => e.textContent ?? ''), new RegExp(`${dedicated.digest}.*dedicated`), 'the view names the session')
    let rows = await taskRows(page)
    t.same(rows.map(r => r.id), [done, cancelled, running], 'its tasks, oldest first, under the ids its client sees')
    t.match(rows[0]!.cells, [done, 'completed', String, /ago$/, /ago$/, /^\d+m \d+s$/], 'id, status, message, created, last update, ttl (the server\'s own)')
    t.match(rows[1]!.cells, [cancelled, 'cancelled', /cancel/i])
    t.match(rows[2]!.cells[1], /working|completed/)
    t.equal(await page.$eval(`#sessions tbody tr[data-session="${dedicated.digest}"]`, e => e.className), 'selected', 'the session row is marked')

    // The poll keeps it current: the running task ends.
    await dedicated.client.experimental.tasks.getTaskResult(running, CallToolResultSchema)
    await page.waitForFunction(`document.querySelector('#tasks tbody tr[data-task="${running}"] td:nth-child(2)')?.textContent === 'completed'`, { timeout: 15_000 })
    t.pass('the running task shows completed once it ended')

    // Another session, another kind: its own tasks only.
    await page.click(`button[data-tasks="${pooled.digest}"]`)
    await page.waitForFunction(`document.querySelector('#tasks tbody tr[data-task="${pooledTask}"]') !== null`)
    rows = await taskRows(page)
    t.same(rows.map(r => r.id), [pooledTask], 'the pooled session\'s task, under its gateway-minted id')

    await page.screenshot({ path: 'dist/console-tasks.png', fullPage: true })
    await page.click('#tasks-close')
    await page.waitForFunction("document.getElementById('tasks-card').hidden")
    t.pass('closed')
    t.same(problems, [], 'no console errors, CSP violations or failed requests')
  })
}
