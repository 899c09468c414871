// The console in headless Chromium (docs/console.md): it loads with no console error and no CSP
// violation, shows the servers and the live sessions of traffic made here, a filter narrows them,
// and "End" (with its confirmation) ends a session. A screenshot is written for the docs
// (CONSOLE_SCREENSHOT=path, default dist/console.png). Without a chromium binary the test is
// skipped, except in CI (CI=true), where that is a failure.
import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { mkdir } from 'node:fs/promises'
import { dirname } from 'node:path'
import t from 'tap'
import puppeteer, { type Page } from 'puppeteer-core'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, newKey, openSession, PUBLIC_URL } from '../helpers/auth.js'
import { eventually } from '../helpers/wait.js'
import { shortHash } from '../../src/telemetry/logger.js'

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'].find(p => existsSync(p))
const TOKEN = randomBytes(24).toString('base64url')

{
  const skip = CHROMIUM === undefined && process.env.CI !== 'true' ? 'no chromium binary (apt-get install -y chromium); in CI this fails instead' : false
  t.test('the console shows live traffic, filters it and ends a session', { skip }, async t => {
    t.ok(CHROMIUM, 'a chromium binary (CI installs Debian\'s chromium)')
    if (CHROMIUM === undefined) return
    const acme = newKey('acme-bot')
    const beta = newKey('beta-bot')
    const gw = await startGateway(t, {
      admin: { token: TOKEN },
      auth: { publicUrl: PUBLIC_URL },
      tenants: {
        acme: { apiKeys: [acme.entry], servers: { files: {}, search: {} } },
        beta: { apiKeys: [beta.entry], servers: { files: {} } }
      },
      servers: { files: stdioFixture('full-server'), search: stdioFixture('full-server', [], { sessions: 'pooled', poolSize: 1 }) }
    })
    const sessions = [
      { ...await openSession(gw.url, 'files', bearer(acme.key)), key: acme.key, server: 'files', tenant: 'acme' },
      { ...await openSession(gw.url, 'search', bearer(acme.key)), key: acme.key, server: 'search', tenant: 'acme' },
      { ...await openSession(gw.url, 'files', bearer(beta.key)), key: beta.key, server: 'files', tenant: 'beta' }
    ]
    let id = 100
    for (const s of sessions) for (let i = 0; i < 3; i++) await callTool(gw.url, s.server, bearer(s.key), s, 'echo', { text: 'x' }, id++)

    const browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-dev-shm-usage'] })
    t.teardown(async () => { await browser.close() })
    const page = await browser.newPage()
    await page.setViewport({ width: 1440, height: 1000 })
    const problems: string[] = []
    page.on('console', m => { if (m.type() === 'error' || m.type() === 'warn') problems.push(`${m.type()}: ${m.text()}`) })
    page.on('pageerror', err => { problems.push(`pageerror: ${String(err)}`) })
    page.on('requestfailed', r => { problems.push(`requestfailed: ${r.url()}`) })

    await page.goto(`${gw.url}/admin`, { waitUntil: 'load' })
    t.equal(await page.evaluate("!document.getElementById('signin').hidden"), true, 'it asks for the token first')
    await page.type('#token', TOKEN)
    await page.click('#signin-form button[type=submit]')
    await page.waitForSelector('#servers tbody tr[data-server="files"]')
    t.same(await rowKeys(page, 'servers', 'server'), ['files', 'search'], 'the servers')
    t.equal(await page.evaluate("sessionStorage.getItem('mcpgw.admin.token') !== null && !location.href.includes('token')"), true, 'the token in sessionStorage, not in the URL')

    const digests = sessions.map(s => shortHash(s.sid)).sort()
    await page.waitForFunction(sessionRows(sessions.length))
    t.same((await rowKeys(page, 'sessions', 'session')).sort(), digests, 'the live sessions, by digest')
    t.equal(await page.$$eval('#charts .chart', c => c.length), 2, 'a chart card per server')
    t.equal(await page.$$eval('#charts .chart[data-server="files"] svg polyline', l => l.length), 3, 'calls, errors and latency')
    t.match(await page.$eval('#servers tbody tr[data-server="files"]', e => e.textContent ?? ''), /files.*stdio.*dedicated/)

    // A screenshot with everything on it, for the docs.
    const shot = process.env.CONSOLE_SCREENSHOT ?? 'dist/console.png'
    await mkdir(dirname(shot), { recursive: true })
    await page.screenshot({ path: shot as `${string}.png`, fullPage: true })
    t.ok(existsSync(shot), `screenshot written to ${shot}`)

    // The tenant filter narrows the sessions.
    await page.select('#filter-tenant', 'beta')
    await page.waitForFunction(sessionRows(1))
    const betaDigest = shortHash(sessions[2]!.sid)
    t.same(await rowKeys(page, 'sessions', 'session'), [betaDigest], 'only beta\'s session')
    await page.select('#filter-tenant', '')
    await page.select('#filter-server', 'search')
    await page.waitForFunction(sessionRows(1))
    t.same(await rowKeys(page, 'sessions', 'session'), [shortHash(sessions[1]!.sid)], 'the server filter: only the pooled session')
    await page.select('#filter-server', '')
    await page.waitForFunction(sessionRows(sessions.length))

    // End beta's session: cancel first (nothing happens), then confirm.
    await page.click(`button[data-end="${betaDigest}"]`)
    await page.waitForSelector('#confirm[open]')
    t.match(await page.$eval('#confirm-text', e => e.textContent ?? ''), new RegExp(`${betaDigest}.*beta.*files`), 'the confirmation names the session')
    await page.click('#confirm button[value=cancel]')
    await new Promise(resolve => setTimeout(resolve, 300))
    t.equal((await callTool(gw.url, 'files', bearer(beta.key), sessions[2]!, 'echo', { text: 'still' }, 200)).status, 200, 'cancelled: the session lives')
    await page.click(`button[data-end="${betaDigest}"]`)
    await page.waitForSelector('#confirm[open]')
    await page.click('#confirm-ok')
    await page.waitForFunction(`document.querySelector('#sessions tbody tr[data-session="${betaDigest}"]') === null`)
    t.equal((await callTool(gw.url, 'files', bearer(beta.key), sessions[2]!, 'echo', { text: 'gone' }, 201)).status, 404, 'ended: 404 for its client')
    await eventually('two sessions shown', async () => (await rowKeys(page, 'sessions', 'session')).length === 2 ? true : undefined)

    t.same(problems, [], 'no console errors, CSP violations or failed requests')
  })
}

/** A page expression: the sessions table shows `n` rows. */
const sessionRows = (n: number): string => `document.querySelectorAll('#sessions tbody tr[data-session]').length === ${n}`

async function rowKeys (page: Page, table: string, key: string): Promise<string[]> {
  return await page.$$eval(`#${table} tbody tr[data-${key}]`, (rows, k) => rows.map(r => r.getAttribute(`data-${k}`) ?? ''), key)
}
