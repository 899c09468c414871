import t from 'tap'
import { MemorySessionQuotas, sessionLimitsOf } from '../../src/auth/quotas.js'
import { quotasContract } from './contract-quotas.js'

quotasContract(t, async (t, n) => {
  const quotas = new MemorySessionQuotas()
  t.teardown(() => quotas.close())
  return Array.from({ length: n }, () => quotas)
})

t.test('sessionLimitsOf: only the limits a tenant sets', async t => {
  t.equal(sessionLimitsOf(undefined), undefined)
  t.equal(sessionLimitsOf({ requestsPerSecond: 3 }), undefined)
  t.same(sessionLimitsOf({ sessions: 4 }), { perTenant: 4 })
  t.same(sessionLimitsOf({ sessions: 4, sessionsPerSubject: 2 }), { perTenant: 4, perSubject: 2 })
})
