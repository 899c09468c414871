// Client stream ids: unique per process without a syscall each, and saying of a POST's stream how
// many answers end it, so the hot path reads that from the id instead of the store.
import { randomBytes } from 'node:crypto'

/** A per-process random prefix: stream ids are unique across replicas and restarts without a syscall each. */
const STREAM_PREFIX = randomBytes(9).toString('base64url')
let streamSeq = 0

/**
 * Request stream ids say their kind and how many responses end them: `r1_<prefix><seq>`,
 * `j3_<prefix><seq>`. They need only be unique (a stream belongs to its session, which the
 * principal check guards), so a counter after the process's random prefix does.
 */
export function newRequestStreamId (mode: 'sse' | 'json', responses: number): string {
  return `${mode === 'sse' ? 'r' : 'j'}${responses}_${STREAM_PREFIX}${(++streamSeq).toString(36)}`
}

/**
 * How many answers end a stream: a POST's stream id is `r` (SSE) or `j` (JSON), one to four
 * digits, then `_`; any other stream (GET, legacy) never ends by answers: Infinity. Read by hand,
 * not by a regular expression: it runs several times per call.
 */
export function expectedResponsesOf (streamId: string): number {
  const kind = streamId.charCodeAt(0)
  if (kind !== 0x72 && kind !== 0x6a) return Infinity // r, j
  let n = 0
  for (let i = 1; i <= 5; i++) {
    const c = streamId.charCodeAt(i)
    if (c === 0x5f) return i === 1 ? Infinity : n // _
    if (c < 0x30 || c > 0x39 || i === 5) return Infinity
    n = n * 10 + c - 0x30
  }
  return Infinity
}

/** Whether a stream is a POST's own stream (it carries the answers of that POST's requests). */
export function isRequestStreamId (streamId: string): boolean {
  return expectedResponsesOf(streamId) !== Infinity
}
