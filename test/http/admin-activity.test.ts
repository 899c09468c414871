// The console's "Last active" is the client's last message, not the idle TTL's renewal: an open
// GET stream's keep-alive moves that too, so every SDK session would read "1 s ago" and idle
// clients could not be found.
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { startGateway, stdioFixture } from '../helpers/gateway.js'
import { bearer, callTool, openSession } from '../helpers/auth.js'

const TOKEN = randomBytes(24).toString('base64url')

interface View { server: string, lastActivityAt: number }

t.test('an idle session holding a GET stream reads idle; a session that calls reads active, and comes first', async t => {
  const gw = await startGateway(t, {
    admin: { token: TOKEN },
    http: { keepAliveMs: 1000 },
    sessions: { idleTimeoutMs: 5000 },
    servers: { quiet: stdioFixture('full-server'), busy: stdioFixture('full-server') }
  })
  const quiet = await openSession(gw.url, 'quiet', {})
  const stream = new AbortController()
  t.teardown(() => { stream.abort() })
  const get = await fetch(`${gw.url}/mcp/quiet`, { headers: { accept: 'text/event-stream', 'mcp-session-id': quiet.sid, 'mcp-protocol-version': quiet.version }, signal: stream.signal })
  t.equal(get.status, 200, 'the quiet session holds a GET stream (keep-alives every second)')
  const quietSince = Date.now()
  const busy = await openSession(gw.url, 'busy', {})
  // Past the idle timeout: the stream alone keeps the session alive, with no client message.
  for (let i = 0; i < 13; i++) {
    await sleep(500)
    await callTool(gw.url, 'busy', {}, busy, 'echo', { text: 'x' }, 10 + i)
  }
  const res = await fetch(`${gw.url}/admin/api/sessions`, { headers: bearer(TOKEN) })
  t.equal(res.status, 200)
  const { sessions } = await res.json() as { sessions: View[] }
  t.same(sessions.map(s => s.server), ['busy', 'quiet'], 'both live; the busy one first')
  const [active, idle] = sessions as [View, View]
  t.ok(idle.lastActivityAt <= quietSince, `the quiet session's last activity is its last message (${Date.now() - idle.lastActivityAt} ms ago), not its keep-alive`)
  t.ok(Date.now() - active.lastActivityAt < 10_000, 'the busy session reads active, to within the marking interval')
  t.ok(active.lastActivityAt > quietSince, 'and later than the quiet one')
})
