// Small numeric and formatting helpers of the benchmark: latency summaries, medians, shuffles,
// bounded concurrency and the plain-text table.

export interface LatencyStats { n: number, p50: number, p99: number, mean: number, min: number, max: number }

/** Nearest-rank percentiles (no interpolation), so p50 is a latency one call really had. */
export function stats (samples: number[]): LatencyStats {
  const sorted = [...samples].sort((a, b) => a - b)
  const at = (q: number): number => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? NaN
  const sum = sorted.reduce((a, b) => a + b, 0)
  return { n: sorted.length, p50: at(0.5), p99: at(0.99), mean: sorted.length === 0 ? NaN : sum / sorted.length, min: sorted[0] ?? NaN, max: sorted.at(-1) ?? NaN }
}

export const median = (values: number[]): number => stats(values).p50

/** A shuffled copy (Fisher-Yates), so each round visits the targets in a fresh order. */
export function shuffled<T> (items: readonly T[]): T[] {
  const out = [...items]
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1))
    ;[out[i], out[j]] = [out[j]!, out[i]!]
  }
  return out
}

/** fn over items, at most `limit` at a time, results in item order. */
export async function mapLimit<T, R> (items: T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length)
  let next = 0
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++
      results[i] = await fn(items[i]!, i)
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker))
  return results
}

export const round = (n: number, digits = 3): number => Number.isFinite(n) ? Number(n.toFixed(digits)) : n

/** A ratio, or NaN when either side is missing (a target without that figure). */
export const ratio = (a: number | null | undefined, b: number | null | undefined): number =>
  a === null || a === undefined || b === null || b === undefined || b === 0 ? NaN : a / b

export const fmt = (n: number | null | undefined, digits = 2): string => n === null || n === undefined || !Number.isFinite(n) ? '-' : n.toFixed(digits)

/** Left-aligned first column, the rest right-aligned. */
export function table (rows: string[][]): string {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map(r => r[c]?.length ?? 0)))
  return rows.map(r => r.map((cell, c) => c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!)).join('  ').trimEnd()).join('\n')
}

/** A knob from the environment: a positive integer, or `fallback` when unset. */
export function intEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const n = Number(raw)
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, got ${raw}`)
  return n
}
