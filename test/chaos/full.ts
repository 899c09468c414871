// The full chaos run (`npm run chaos`): 50 SDK sessions, at least 5,000 calls, two replica kills
// (each restarted) and a Redis primary failover. Prints the figures docs/replicas.md quotes.
import t from 'tap'
import { runChaos } from './chaos.js'

t.test('full chaos run', async t => {
  const figures = await runChaos(t, { sessions: 50, durationMs: 120_000, kills: 2, callTimeoutMs: 30_000, log: line => { console.log(line) } })
  console.log(JSON.stringify({ ...figures, events: undefined }, null, 2))
  t.ok(figures.calls >= 5000, `at least 5,000 calls (${figures.calls})`)
  t.equal(figures.neverAnswered, 0, 'never answered: 0')
  t.equal(figures.duplicated, 0, 'duplicated: 0')
  t.equal(figures.misrouted, 0, 'misrouted: 0')
  t.equal(figures.lostUnreached, 0, 'no call answered -32007 that never reached a backend', { calls: figures.events.filter(e => /never reached/.test(e)).slice(0, 10) })
  t.equal(figures.survivors + figures.sessionsRenewed, figures.before, 'every session from before the chaos still works')
})
