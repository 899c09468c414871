// Operations endpoints: /healthz (the process answers) and /readyz (it can take new sessions:
// the session store is reachable and it is not shutting down).
import type { FastifyInstance } from 'fastify'
import type { Router } from '../routing/router.js'
import type { SessionStore } from '../state/session-store.js'

export interface HttpOpsOptions {
  router: Router
  store: SessionStore
}

export default async function httpOps (app: FastifyInstance, opts: HttpOpsOptions): Promise<void> {
  app.get('/healthz', async () => ({ status: 'ok' }))
  app.get('/readyz', async (_req, reply) => {
    const storeReady = opts.store.isReady()
    const ready = storeReady && !opts.router.stopping
    reply.code(ready ? 200 : 503)
    return { status: ready ? 'ready' : 'not ready', store: storeReady ? 'up' : 'down', shuttingDown: opts.router.stopping }
  })
}
