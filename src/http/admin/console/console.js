// The mcp-gateway console: reads the admin API every two seconds and draws tables and
// charts. Plain browser JavaScript, no dependencies, no inline script (the page's CSP forbids it).
// The admin token stays in this tab's sessionStorage and goes out only as a bearer header.
'use strict'
;(() => {
  const API = '/admin/api'
  const EVERY_MS = 2000
  const PAGE = 50
  const KEY = 'mcpgw.admin.token'
  const SVG = 'http://www.w3.org/2000/svg'
  const $ = id => document.getElementById(id)
  const state = { tenant: '', server: '', offset: 0, timer: null, busy: false, tasksOf: null }

  const token = () => sessionStorage.getItem(KEY)

  async function api (path, init = {}) {
    const res = await fetch(API + path, { ...init, headers: { authorization: `Bearer ${token()}`, accept: 'application/json' }, cache: 'no-store' })
    if (res.status === 401 || res.status === 429) {
      signOut(res.status === 401 ? 'The token was refused.' : 'Too many failed attempts from this address; wait and try again.')
      throw new Error('unauthorized')
    }
    const body = await res.json().catch(() => null)
    if (!res.ok) throw new Error(body?.error?.message ?? `HTTP ${res.status}`)
    return body
  }

  function el (tag, attrs = {}, ...children) {
    const node = document.createElement(tag)
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null) continue
      if (k === 'class') node.className = v
      else if (k === 'text') node.textContent = v
      else node.setAttribute(k, v)
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child)
    return node
  }

  const td = (text, cls) => el('td', { class: cls, text: text === null || text === undefined ? '–' : String(text) })
  const fill = (table, rows, empty) => {
    const body = $(table).tBodies[0]
    body.replaceChildren(...(rows.length > 0 ? rows : [el('tr', {}, el('td', { colspan: '20', class: 'muted', text: empty }))]))
  }

  function duration (ms) {
    const s = Math.max(0, Math.round(ms / 1000))
    if (s < 60) return `${s}s`
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`
  }

  function sparkline (values, color) {
    const w = 200
    const h = 28
    const svg = document.createElementNS(SVG, 'svg')
    svg.setAttribute('width', String(w))
    svg.setAttribute('height', String(h))
    svg.setAttribute('viewBox', `0 0 ${w} ${h}`)
    const nums = values.map(v => v ?? 0)
    const max = Math.max(1, ...nums)
    const step = w / Math.max(1, nums.length - 1)
    const points = nums.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`).join(' ')
    const base = document.createElementNS(SVG, 'line')
    for (const [k, v] of [['x1', 0], ['x2', w], ['y1', h - 1], ['y2', h - 1], ['stroke', '#e3e6ea']]) base.setAttribute(k, String(v))
    const line = document.createElementNS(SVG, 'polyline')
    line.setAttribute('points', points)
    line.setAttribute('fill', 'none')
    line.setAttribute('stroke', color)
    line.setAttribute('stroke-width', '1.5')
    svg.append(base, line)
    return svg
  }

  function setOptions (id, names, current) {
    const select = $(id)
    const have = [...select.options].map(o => o.value).slice(1).join('\n')
    if (have === names.join('\n')) return
    select.replaceChildren(el('option', { value: '', text: 'all' }), ...names.map(n => el('option', { value: n, text: n })))
    select.value = names.includes(current) ? current : ''
  }

  function renderOverview (o) {
    const servers = o.servers.filter(s => state.server === '' || s.name === state.server)
    setOptions('filter-tenant', o.tenants.map(t => t.name), state.tenant)
    setOptions('filter-server', o.servers.map(s => s.name), state.server)
    fill('servers', servers.map(s => el('tr', { 'data-server': s.name },
      td(s.name, 'mono'), td(s.transport), td(s.mode), td(s.members.length > 0 ? s.members.join(', ') : null),
      td(s.sessions, 'n'), td(s.children, 'n'), td(`${s.pool.inUse} / ${s.pool.warm} / ${s.pool.waiting}`, 'n'),
      td(s.callsPerMinute, 'n'), td(s.errorsPerMinute, 'n'), td(s.latencyMsAvg, 'n'), td(s.health, `health-${s.health}`)
    )), 'No servers configured.')
    $('charts').replaceChildren(...servers.map(s => el('div', { class: 'chart', 'data-server': s.name },
      el('h3', { text: s.name }),
      el('div', { class: 'row' }, el('span', { text: 'calls' }), sparkline(s.series.calls, '#2563eb'), el('b', { text: `${s.callsPerMinute}/min` })),
      el('div', { class: 'row' }, el('span', { text: 'errors' }), sparkline(s.series.errors, '#c0262d'), el('b', { text: `${s.errorsPerMinute}/min` })),
      el('div', { class: 'row' }, el('span', { text: 'latency' }), sparkline(s.series.latencyMsAvg, '#b7791f'), el('b', { text: s.latencyMsAvg === null ? '–' : `${s.latencyMsAvg} ms` }))
    )))
    fill('replicas', o.replicas.map(r => el('tr', { 'data-replica': r.id },
      td(r.self ? `${r.id} (this)` : r.id, 'mono'), td(r.version), td(duration(r.uptimeS * 1000), 'n'), td(r.draining ? 'draining' : 'serving'),
      td(r.sessions, 'n'), td(r.children, 'n'), td(r.eventLoopDelayMs, 'n'),
      td(r.lastReload === null ? null : `${r.lastReload.ok ? 'ok' : 'refused'}, ${duration(o.at - r.lastReload.at)} ago`)
    )), 'No replica has published a summary yet.')
    fill('tenants', o.tenants.filter(t => state.tenant === '' || t.name === state.tenant).map(t => el('tr', { 'data-tenant': t.name },
      td(t.name, 'mono'), td(t.sessions, 'n'), td(t.callsPerMinute, 'n'), td(t.rateLimitedPerMinute, 'n'), td(t.quotaRefusedPerMinute, 'n')
    )), 'No tenants configured (auth off): every session is anonymous.')
    $('status').textContent = `${o.replicas.length} replica${o.replicas.length === 1 ? '' : 's'} · ${o.sessions.total} session${o.sessions.total === 1 ? '' : 's'} · updated ${new Date(o.at).toLocaleTimeString()}`
  }

  function renderSessions (page, now) {
    fill('sessions', page.sessions.map(s => {
      const end = el('button', { type: 'button', class: 'danger', 'data-end': s.session, text: 'End' })
      end.addEventListener('click', () => { confirmEnd(s) })
      const tasks = el('button', { type: 'button', 'data-tasks': s.session, text: 'Tasks' })
      tasks.addEventListener('click', () => { state.tasksOf = s.session; void refresh() })
      return el('tr', { 'data-session': s.session, class: state.tasksOf === s.session ? 'selected' : undefined },
        td(s.session, 'mono'), td(s.server, 'mono'), td(s.tenant), td(s.client), td(s.pooled ? `${s.transport} (pooled)` : s.transport), td(s.protocolVersion),
        td(s.subject, 'mono'), td(duration(now - s.createdAt), 'n'), td(`${duration(now - s.lastActivityAt)} ago`, 'n'),
        td(s.owner, 'mono'), td(s.holder, 'mono'), el('td', { class: 'actions' }, tasks, end))
    }), 'No live sessions match.')
    const last = Math.min(page.total, page.offset + page.sessions.length)
    $('sessions-count').textContent = `(${page.total}${page.truncated ? '+' : ''} matching)`
    $('page').textContent = page.total === 0 ? '' : `${page.offset + 1}–${last} of ${page.total}`
    $('prev').disabled = page.offset === 0
    $('next').disabled = last >= page.total
  }

  // The selected session's tasks, as its client was last told of them (docs/console.md).
  function renderTasks (found, now) {
    $('tasks-card').hidden = found === null
    if (found === null) return
    $('tasks-of').textContent = `of ${found.session} on ${found.server}`
    const time = iso => iso === undefined ? null : `${duration(now - Date.parse(iso))} ago`
    fill('tasks', found.tasks.map(task => el('tr', { 'data-task': task.taskId },
      td(task.taskId, 'mono'), td(task.status, `status-${task.status}`), td(task.statusMessage),
      td(time(task.createdAt), 'n'), td(time(task.lastUpdatedAt) ?? `${duration(now - task.seenAt)} ago`, 'n'),
      td(task.ttl === undefined ? null : task.ttl === null ? 'unlimited' : duration(task.ttl), 'n')
    )), 'No task seen in this session.')
  }

  async function sessionTasks () {
    if (state.tasksOf === null) return null
    try {
      return await api(`/sessions/${encodeURIComponent(state.tasksOf)}/tasks`)
    } catch (err) {
      if (err.message === 'unauthorized') throw err
      state.tasksOf = null
      return null
    }
  }

  function confirmEnd (s) {
    const dialog = $('confirm')
    $('confirm-text').textContent = `End session ${s.session} of ${s.tenant ?? 'anonymous'} on ${s.server}? Its backend stops and its client must start a new session.`
    dialog.returnValue = ''
    dialog.onclose = async () => {
      if (dialog.returnValue !== 'ok') return
      try {
        await api(`/sessions/${encodeURIComponent(s.session)}`, { method: 'DELETE' })
        showError(null)
      } catch (err) { if (err.message !== 'unauthorized') showError(`Ending ${s.session} failed: ${err.message}`) }
      await refresh()
    }
    dialog.showModal()
  }

  function showError (text) {
    $('error').hidden = text === null
    $('error').textContent = text ?? ''
  }

  async function refresh () {
    if (state.busy || token() === null) return
    state.busy = true
    try {
      const query = new URLSearchParams({ offset: String(state.offset), limit: String(PAGE) })
      if (state.tenant !== '') query.set('tenant', state.tenant)
      if (state.server !== '') query.set('server', state.server)
      const [overview, sessions, tasks] = await Promise.all([api('/overview'), api(`/sessions?${query}`), sessionTasks()])
      renderOverview(overview)
      renderSessions(sessions, overview.at)
      renderTasks(tasks, overview.at)
      showError(null)
    } catch (err) {
      if (err.message !== 'unauthorized') showError(`Could not read the admin API: ${err.message}`)
    } finally {
      state.busy = false
    }
  }

  function signedIn () {
    $('signin').hidden = true
    $('main').hidden = false
    $('reload').hidden = false
    $('signout').hidden = false
    clearInterval(state.timer)
    state.timer = setInterval(refresh, EVERY_MS)
    void refresh()
  }

  function signOut (message) {
    sessionStorage.removeItem(KEY)
    clearInterval(state.timer)
    $('main').hidden = true
    $('reload').hidden = true
    $('signout').hidden = true
    $('signin').hidden = false
    $('signin-error').hidden = message === undefined
    $('signin-error').textContent = message ?? ''
    $('status').textContent = 'not signed in'
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('signin-form').addEventListener('submit', event => {
      event.preventDefault()
      sessionStorage.setItem(KEY, $('token').value.trim())
      $('token').value = ''
      signedIn()
    })
    $('signout').addEventListener('click', () => { signOut() })
    $('reload').addEventListener('click', async () => {
      if (!window.confirm('Reload the config file on every replica?')) return
      try {
        const out = await api('/reload', { method: 'POST' })
        showError(out.local.ok ? null : `Reload refused here: ${(out.local.errors ?? []).join('; ')}`)
      } catch (err) { if (err.message !== 'unauthorized') showError(`Reload failed: ${err.message}`) }
    })
    $('filter-tenant').addEventListener('change', e => { state.tenant = e.target.value; state.offset = 0; void refresh() })
    $('filter-server').addEventListener('change', e => { state.server = e.target.value; state.offset = 0; void refresh() })
    $('prev').addEventListener('click', () => { state.offset = Math.max(0, state.offset - PAGE); void refresh() })
    $('next').addEventListener('click', () => { state.offset += PAGE; void refresh() })
    $('tasks-close').addEventListener('click', () => { state.tasksOf = null; void refresh() })
    if (token() !== null) signedIn()
  })
})()
