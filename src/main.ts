// Process entry: load config, build the gateway, listen, stop gracefully on SIGTERM/SIGINT.
import { buildGateway } from './app.js'
import { closeHttpDispatchers } from './backends/http.js'
import { stopAllChildren } from './backends/stdio.js'
import { loadConfig, parseArgs, USAGE } from './config/load.js'
import { createLogger } from './telemetry/logger.js'
import { newReplicaId } from './core/replica.js'

const SHUTDOWN_DEADLINE_MS = 15_000

async function main (): Promise<void> {
  let configPath: string
  try {
    const args = parseArgs(process.argv.slice(2))
    if (args.help) { process.stdout.write(USAGE); return }
    configPath = args.configPath
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n${USAGE}`)
    process.exitCode = 2
    return
  }
  let config
  try {
    config = await loadConfig(configPath)
  } catch (err) {
    process.stderr.write(`mcp-gateway: ${err instanceof Error ? err.message : String(err)}\n`)
    process.exitCode = 1
    return
  }
  const replicaId = newReplicaId()
  const log = createLogger(config.log.level, replicaId)
  process.on('uncaughtException', err => {
    log.fatal({ err }, 'uncaught exception; stopping')
    void stopAllChildren().finally(() => process.exit(1))
  })
  process.on('unhandledRejection', err => {
    log.fatal({ err }, 'unhandled rejection; stopping')
    void stopAllChildren().finally(() => process.exit(1))
  })

  const gateway = await buildGateway(config, { log, replicaId })
  let stopping = false
  const stop = (signal: string): void => {
    if (stopping) return
    stopping = true
    log.info({ signal }, 'shutting down')
    const deadline = setTimeout(() => {
      log.error('shutdown deadline passed; killing children')
      void stopAllChildren().finally(() => process.exit(1))
    }, SHUTDOWN_DEADLINE_MS)
    deadline.unref()
    // Upstream connection pools are per process: closed once, after the gateway stopped.
    gateway.close().then(async () => { await closeHttpDispatchers() }).then(
      () => { log.info('stopped'); process.exit(0) },
      err => { log.error({ err }, 'shutdown failed'); void stopAllChildren().finally(() => process.exit(1)) }
    )
  }
  process.on('SIGTERM', () => { stop('SIGTERM') })
  process.on('SIGINT', () => { stop('SIGINT') })
  try {
    const address = await gateway.app.listen({ host: config.listen.host, port: config.listen.port })
    log.info({ address, servers: Object.keys(config.servers) }, 'mcp-gateway listening')
  } catch (err) {
    log.fatal({ err }, 'could not listen')
    await gateway.close().catch(() => {})
    process.exitCode = 1
  }
}

await main()
