// Operations endpoints: /healthz (the process answers) and /readyz (it can take new sessions:
// the session store is reachable and it is neither draining nor shutting down). Draining starts at
// SIGTERM, before anything stops, so a load balancer sees 503 and stops sending first.
import type { FastifyInstance } from 'fastify'
import { DEFAULT_RETRY_AFTER_S } from '../core/errors.js'
import type { Router } from '../routing/router.js'
import type { SessionStore } from '../state/session-store.js'

export interface HttpOpsOptions {
  router: Router
  store: SessionStore
  /** Whether the process has been told to stop (SIGTERM) and is draining. */
  draining: () => boolean
}

export default async function httpOps (app: FastifyInstance, opts: HttpOpsOptions): Promise<void> {
  app.get('/healthz', async () => ({ status: 'ok' }))
  app.get('/readyz', async (_req, reply) => {
    const storeReady = opts.store.isReady()
    const shuttingDown = opts.router.stopping || opts.draining()
    const ready = storeReady && !shuttingDown
    reply.code(ready ? 200 : 503)
    // Every 503 says when to ask again (issue 28).
    if (!ready) reply.header('retry-after', String(DEFAULT_RETRY_AFTER_S))
    return { status: ready ? 'ready' : 'not ready', store: storeReady ? 'up' : 'down', shuttingDown }
  })
}
