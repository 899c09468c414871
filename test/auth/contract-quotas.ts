// The session quota contract: the quota sets and the QuotaGate rule over them,
// against the memory twin and the Redis twin. Liveness comes from a Set standing in for the
// session store (the gate's only question to it: does this session still exist?).
import { randomUUID } from 'node:crypto'
import type { Test } from 'tap'
import { QuotaGate, type LimitsLookup, type SessionQuotas } from '../../src/auth/quotas.js'
import type { TenantLimitsConfig } from '../../src/config/schema.js'
import { isGatewayError } from '../../src/core/errors.js'

/** Makes `n` quota twins over one shared store for a subtest; closed in t.teardown. */
export type MakeQuotas = (t: Test, n: number) => Promise<SessionQuotas[]>

/** The limits lookup of a table where only tenant acme has limits. */
function configWith (limits: TenantLimitsConfig): LimitsLookup {
  return tenant => tenant === 'acme' ? limits : undefined
}

async function refusal (promise: Promise<unknown>): Promise<{ code: string, status: number | undefined, message: string } | null> {
  try {
    await promise
    return null
  } catch (err) {
    if (!isGatewayError(err)) throw err
    return { code: err.code, status: err.statusCode, message: err.message }
  }
}

export function quotasContract (t: Test, make: MakeQuotas): void {
  t.test('take: up to the tenant limit, then the members of the full set', async t => {
    const [quotas] = await make(t, 1)
    const tenant = randomUUID()
    const request = (sid: string, subject = 'alice'): Parameters<SessionQuotas['take']>[0] => ({ tenant, subject, sid, perTenant: 2 })
    t.same(await quotas!.take(request('s1')), { taken: true })
    t.same(await quotas!.take(request('s2', 'bob')), { taken: true })
    t.same(await quotas!.take(request('s1')), { taken: true }, 'a held slot is taken again')
    const full = await quotas!.take(request('s3'))
    t.equal(full.taken, false)
    if (!full.taken) {
      t.equal(full.scope, 'tenant')
      t.same(full.members.sort(), ['s1', 's2'])
    }
    await quotas!.drop(tenant, 'alice', ['s1'])
    t.same(await quotas!.take(request('s3')), { taken: true }, 'a dropped slot is free again')
  })

  t.test('take: the subject limit is per subject; unlimited scopes are not tracked', async t => {
    const [quotas] = await make(t, 1)
    const tenant = randomUUID()
    t.same(await quotas!.take({ tenant, subject: 'alice', sid: 'a1', perSubject: 1 }), { taken: true })
    const full = await quotas!.take({ tenant, subject: 'alice', sid: 'a2', perSubject: 1 })
    t.match(full, { taken: false, scope: 'subject', members: ['a1'] })
    t.same(await quotas!.take({ tenant, subject: 'bob', sid: 'b1', perSubject: 1 }), { taken: true }, 'bob has his own slot')
    // No tenant limit was set, so the tenant set holds nothing: a later tenant limit starts empty.
    t.same(await quotas!.take({ tenant, subject: 'carol', sid: 'c1', perTenant: 1 }), { taken: true })
  })

  t.test('QuotaGate: 429 at the quota; an ended session frees its slot', async t => {
    const [quotas] = await make(t, 1)
    const live = new Set<string>()
    const gate = new QuotaGate(configWith({ sessions: 3, sessionsPerSubject: 2 }), quotas!, async sid => live.has(sid))
    const open = async (subject: string): Promise<string> => {
      const sid = randomUUID()
      live.add(sid) // the record exists before the slot is taken
      await gate.admit(sid, 'acme', subject)
      return sid
    }
    const a1 = await open('alice')
    await open('alice')
    const refused = await refusal(open('alice'))
    t.match(refused, { code: 'GW_ERR_SESSION_QUOTA', status: 429 }, 'third of alice: subject quota')
    t.match(refused?.message, /quota of 2 open sessions/)
    await open('bob')
    t.match(await refusal(open('bob')), { code: 'GW_ERR_SESSION_QUOTA', status: 429, message: /tenant 'acme'.*3/ }, 'fourth in acme: tenant quota')
    live.delete(a1) // DELETE, end or idle expiry: the record is gone
    await open('bob')
    t.pass('the slot of the ended session was reused')
  })

  t.test('QuotaGate: anonymous principals and tenants without session limits pass', async t => {
    const [quotas] = await make(t, 1)
    const gate = new QuotaGate(configWith({ requestsPerSecond: 1 }), quotas!, async () => true)
    for (let i = 0; i < 5; i++) await gate.admit(randomUUID(), 'acme', 'alice')
    for (let i = 0; i < 5; i++) await gate.admit(randomUUID(), null, 'anonymous')
    for (let i = 0; i < 5; i++) await gate.admit(randomUUID(), 'unknown-tenant', 'x')
    t.pass('nothing refused')
  })

  t.test('QuotaGate: a store error counts the session as alive (no slot freed on a guess)', async t => {
    const [quotas] = await make(t, 1)
    const gate = new QuotaGate(configWith({ sessions: 1 }), quotas!, async () => { throw new Error('store down') })
    await gate.admit('s1', 'acme', 'a')
    t.match(await refusal(gate.admit('s2', 'acme', 'a')), { code: 'GW_ERR_SESSION_QUOTA' })
  })

  t.test('QuotaGate: concurrent creations through several gates get exactly the quota', async t => {
    const twins = await make(t, 3)
    const gates = twins.map(q => new QuotaGate(configWith({ sessions: 7 }), q, async () => true))
    const results = await Promise.allSettled(Array.from({ length: 30 }, async (_, i) => { await gates[i % gates.length]!.admit(randomUUID(), 'acme', `subject-${i}`) }))
    t.equal(results.filter(r => r.status === 'fulfilled').length, 7)
  })
}
