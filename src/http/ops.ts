// Operations endpoints: /healthz (the process answers) and /readyz (it can take new sessions:
// the session store is reachable and it is neither draining nor shutting down). Draining starts at
// SIGTERM, before anything stops, so a load balancer sees 503 and stops sending first.
//
// The store is shared by every replica, so a Redis blip makes them all unready at once: a Service
// then has no endpoint left, clients get the balancer's error instead of the gateway's JSON-RPC 503
// with Retry-After, and a PodDisruptionBudget blocks node drains. So the store's absence turns
// /readyz to 503 only once it has lasted `redis.readinessGraceMs` (counted from the first /readyz
// that found it away); a replica cut off from Redis for longer still leaves the rotation.
import type { FastifyInstance } from 'fastify'
import { DEFAULT_RETRY_AFTER_S } from '../core/errors.js'
import type { Router } from '../routing/router.js'
import type { SessionStore } from '../state/session-store.js'

export interface HttpOpsOptions {
  router: Router
  store: SessionStore
  /** Whether the process has been told to stop (SIGTERM) and is draining. */
  draining: () => boolean
  /** How long the store may be unreachable before /readyz answers 503 (0: at once). */
  storeGraceMs: number
  now?: () => number
}

export default async function httpOps (app: FastifyInstance, opts: HttpOpsOptions): Promise<void> {
  app.get('/healthz', async () => ({ status: 'ok' }))
  const now = opts.now ?? Date.now
  let storeAwaySince: number | undefined
  app.get('/readyz', async (_req, reply) => {
    const storeReady = opts.store.isReady()
    if (storeReady) storeAwaySince = undefined
    else storeAwaySince ??= now()
    const storeTolerated = storeReady || now() - (storeAwaySince ?? 0) < opts.storeGraceMs
    const shuttingDown = opts.router.stopping || opts.draining()
    const ready = storeTolerated && !shuttingDown
    reply.code(ready ? 200 : 503)
    // Every 503 says when to ask again, so clients back off instead of retrying at once.
    if (!ready) reply.header('retry-after', String(DEFAULT_RETRY_AFTER_S))
    return { status: ready ? 'ready' : 'not ready', store: storeReady ? 'up' : 'down', shuttingDown }
  })
}
