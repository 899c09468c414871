// Scrapes /metrics and parses the Prometheus text format (enough of it for assertions).
export interface Sample {
  name: string
  labels: Record<string, string>
  value: number
}

export class Scrape {
  constructor (readonly text: string, readonly samples: Sample[]) {}

  /** Samples of one metric whose labels include `labels`. */
  all (name: string, labels: Record<string, string> = {}): Sample[] {
    return this.samples.filter(s => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
  }

  /** The sum of the matching samples (0 when none). */
  sum (name: string, labels: Record<string, string> = {}): number {
    return this.all(name, labels).reduce((n, s) => n + s.value, 0)
  }

  has (name: string): boolean {
    return this.samples.some(s => s.name === name)
  }
}

const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g

export function parsePrometheus (text: string): Scrape {
  const samples: Sample[] = []
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue
    const match = LINE.exec(line)
    if (match === null) throw new Error(`not a Prometheus sample line: ${line}`)
    const labels: Record<string, string> = {}
    for (const [, key, value] of (match[2] ?? '').matchAll(LABEL)) labels[key!] = value!.replace(/\\n/g, '\n').replace(/\\"/g, '"').replace(/\\\\/g, '\\')
    samples.push({ name: match[1]!, labels, value: Number(match[3]) })
  }
  return new Scrape(text, samples)
}

export async function scrape (url: string, headers: Record<string, string> = {}): Promise<Scrape> {
  const res = await fetch(`${url}/metrics`, { headers })
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}: ${await res.text()}`)
  return parsePrometheus(await res.text())
}
