#!/usr/bin/env node
// Process entry: load config (or only check it), build the gateway, listen, stop gracefully.
// SIGTERM drains first (/readyz 503 for shutdown.drainMs while requests are still served), then
// stops; SIGINT (Ctrl-C) and a second signal skip the drain. shutdown.deadlineMs bounds the stop.
// SIGHUP re-reads the config file (and so, with reload.watch, does a change on disk): see
// config/reload.ts.
import { loadConfig, parseArgs, USAGE, vaultKeysFrom } from './config/load.js'
import { parseVaultKeys } from './credentials/cipher.js'
import type { ConfigReloader } from './config/reload.js'
import { newReplicaId } from './core/replica.js'
import { keyCommand } from './auth/key-command.js'
import { GATEWAY_VERSION } from './core/version.js'

async function main (): Promise<void> {
  if (process.argv[2] === 'key') {
    try {
      process.stdout.write(keyCommand(process.argv.slice(3)))
    } catch (err) {
      process.stderr.write(`mcp-gateway: ${err instanceof Error ? err.message : String(err)}`)
      process.exitCode = 2
    }
    return
  }
  let configPath: string
  let checkOnly: boolean
  try {
    const args = parseArgs(process.argv.slice(2))
    if (args.help) { process.stdout.write(USAGE); return }
    if (args.version) { process.stdout.write(`mcp-gateway ${GATEWAY_VERSION}\n`); return }
    configPath = args.configPath
    checkOnly = args.checkOnly
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`)
    process.exitCode = 2
    return
  }
  let config
  try {
    config = await loadConfig(configPath)
    // A malformed vault key is a configuration error too, said by --check-config as well.
    const keys = vaultKeysFrom()
    if (keys !== undefined) parseVaultKeys(keys)
  } catch (err) {
    process.stderr.write(`mcp-gateway: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exitCode = 1
    return
  }
  if (checkOnly) {
    const servers = Object.keys(config.servers)
    process.stdout.write(`mcp-gateway: ${configPath} is valid (${servers.length} server${servers.length === 1 ? '' : 's'}: ${servers.join(', ')})\n`)
    return
  }
  // Loaded only to serve, so --help, --version and --check-config answer without loading the
  // whole gateway (seconds on a busy machine, paid by every `npx mcp-gateway --check-config`).
  const [{ buildGateway }, { closeHttpDispatchers }, { stopAllChildren }, { ConfigReloader }, { createLogger }] = await Promise.all([
    import('./app.js'), import('./backends/http.js'), import('./backends/stdio.js'), import('./config/reload.js'), import('./telemetry/logger.js')
  ])
  const replicaId = newReplicaId()
  const log = createLogger(config.log.level, replicaId, undefined, config.log.flushMs)
  process.on('uncaughtException', err => {
    log.fatal({ err }, 'uncaught exception; stopping')
    void stopAllChildren().finally(() => process.exit(1))
  })
  process.on('unhandledRejection', err => {
    log.fatal({ err }, 'unhandled rejection; stopping')
    void stopAllChildren().finally(() => process.exit(1))
  })

  // Installed before the (slow) build: SIGHUP's default action would end the process.
  let reloader: ConfigReloader | undefined
  process.on('SIGHUP', () => {
    if (reloader === undefined) { log.warn('SIGHUP ignored: still starting'); return }
    void reloader.reload('SIGHUP')
  })

  const vaultKeys = vaultKeysFrom()
  const gateway = await buildGateway(config, { log, replicaId, ...(vaultKeys === undefined ? {} : { vaultKeys }) })
  reloader = new ConfigReloader({ path: configPath, live: gateway.live, log })
  const reloads = reloader
  gateway.setReloader(async trigger => {
    const outcome = await reloads.reload(trigger)
    return outcome.ok ? { ok: true } : { ok: false, errors: outcome.errors }
  })
  if (config.reload.watch) await reloader.watch(config.reload.debounceMs)
  const { drainMs, deadlineMs } = config.shutdown
  let stopping = false
  let skipDrain: (() => void) | undefined
  const stop = (signal: string): void => {
    if (stopping) { skipDrain?.(); return }
    stopping = true
    reloader?.close()
    gateway.drain()
    const drain = signal === 'SIGTERM' ? drainMs : 0
    log.info({ signal, drainMs: drain }, 'shutting down')
    const drained = new Promise<void>(resolve => {
      const timer = setTimeout(resolve, drain)
      skipDrain = () => { clearTimeout(timer); resolve() }
    })
    void drained.then(() => {
      const deadline = setTimeout(() => {
        log.error('shutdown deadline passed; killing children')
        void stopAllChildren().finally(() => process.exit(1))
      }, deadlineMs)
      deadline.unref()
      // Upstream connection pools are per process: closed once, after the gateway stopped.
      gateway.close().then(async () => { await closeHttpDispatchers() }).then(
        () => { log.info('stopped'); process.exit(0) },
        err => { log.error({ err }, 'shutdown failed'); void stopAllChildren().finally(() => process.exit(1)) }
      )
    })
  }
  process.on('SIGTERM', () => { stop('SIGTERM') })
  process.on('SIGINT', () => { stop('SIGINT') })
  try {
    const address = await gateway.app.listen({ host: config.listen.host, port: config.listen.port })
    const metricsAt = config.metrics.listen
    const metricsAddress = gateway.metricsApp === null || metricsAt === undefined ? undefined : await gateway.metricsApp.listen({ host: metricsAt.host, port: metricsAt.port })
    const adminAt = config.admin?.listen
    const adminAddress = gateway.adminApp === null || adminAt === undefined ? undefined : await gateway.adminApp.listen({ host: adminAt.host, port: adminAt.port })
    log.info({ address, metricsAddress, adminAddress, servers: Object.keys(config.servers) }, 'mcp-gateway listening')
    // Whoever waits for this line (an orchestrator, a test) need not wait for the flush timer.
    log.flush()
  } catch (err) {
    log.fatal({ err }, 'could not listen')
    await gateway.close().catch(() => {})
    process.exitCode = 1
  }
}

await main()
