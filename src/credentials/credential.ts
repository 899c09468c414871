// One token as the backends take it: in a header for an HTTP backend, in a variable of a stdio
// child's environment (docs/credentials.md). Every source builds its Credential here, so the two
// places always hold the same token.
import type { Credential, CredentialsConfig } from './types.js'

/** The header value of `token` under `config` (`<scheme> <token>`, or the bare token). */
export function headerValueOf (config: Pick<CredentialsConfig, 'scheme'>, token: string): string {
  return config.scheme === '' ? token : `${config.scheme} ${token}`
}

/** The Credential of `token`, with its header and, when the block names `env`, its variable. */
export function credentialOf (config: Pick<CredentialsConfig, 'scheme' | 'header' | 'env' | 'envTemplate'>, token: string, expiresAt: number | null): Credential {
  return {
    header: config.header.toLowerCase(),
    value: headerValueOf(config, token),
    expiresAt,
    // A function replacer: a `$` in the token is never read as a replacement pattern.
    ...(config.env === undefined ? {} : { env: { name: config.env, value: (config.envTemplate ?? '{token}').replaceAll('{token}', () => token) } })
  }
}
