// Preloaded into the idle-memory benchmark's gateway process (node --expose-gc --import):
// on SIGUSR2 it runs a full GC and writes process.memoryUsage() with a sequence number to the
// file named by BENCH_MEM_FILE, so the benchmark samples memory after garbage is gone. The
// gateway's own code is untouched; SIGUSR2 is unused by Node and by the gateway.
import { writeFileSync } from 'node:fs'

const file = process.env.BENCH_MEM_FILE
let seq = 0
if (file !== undefined && file !== '') {
  process.on('SIGUSR2', () => {
    const gc = (globalThis as { gc?: () => void }).gc
    // Two passes: the first can leave weakly held and finalised objects for the second.
    gc?.()
    gc?.()
    writeFileSync(file, JSON.stringify({ seq: ++seq, gc: gc !== undefined, ...process.memoryUsage() }))
  })
}
