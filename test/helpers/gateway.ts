// Starts a real gateway (in this process) on a free loopback port for a test, stopped in teardown.
import { fileURLToPath } from 'node:url'
import type { Test } from 'tap'
import { buildGateway, type Gateway, type GatewayOptions } from '../../src/app.js'
import { parseConfig } from '../../src/config/load.js'
import type { Config } from '../../src/config/schema.js'
import { createLogger } from '../../src/telemetry/logger.js'

/** Absolute path of a compiled fixture: dist/test/fixtures/<name>.js. */
export function fixture (name: string): string {
  return fileURLToPath(new URL(`../fixtures/${name}.js`, import.meta.url))
}

/** A stdio server entry running a compiled fixture with node. */
export function stdioFixture (name: string, args: string[] = [], extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { transport: 'stdio', command: process.execPath, args: [fixture(name), ...args], ...extra }
}

export interface RunningGateway {
  url: string
  config: Readonly<Config>
  gateway: Gateway
  close: () => Promise<void>
}

export async function startGateway (t: Test, raw: Record<string, unknown>, options: GatewayOptions = {}): Promise<RunningGateway> {
  const config = parseConfig({ listen: { host: '127.0.0.1', port: 0 }, log: { level: process.env.TEST_LOG_LEVEL ?? 'silent' }, ...raw })
  const gateway = await buildGateway(config, { log: createLogger(config.log.level, options.replicaId ?? 'test'), ...options })
  const address = await gateway.app.listen({ host: '127.0.0.1', port: 0 })
  // Every caller, the teardown included, waits for the one close (a test may start it itself).
  let closing: Promise<void> | undefined
  const close = async (): Promise<void> => {
    closing ??= gateway.close()
    await closing
  }
  t.teardown(close)
  return { url: address, config, gateway, close }
}
