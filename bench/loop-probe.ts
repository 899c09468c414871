// Preloaded into a gateway process the benchmark watches for event-loop stalls (node --import):
// a 10 ms interval timer measures how late it fires (timer drift), and every 250 ms one JSON line
// goes to the file named by BENCH_LOOP_FILE with the window's largest stall, the longest GC pause
// seen in it and the process's memory. The benchmark reads the file afterwards and picks the
// lines of the phase it timed (ramp, hold) by their wall-clock `t`. The gateway's own code is
// untouched. The same probe in an idle process (the control) shows what the machine alone does:
// timer drift also counts the time the OS did not run the process at all.
//
// Timer drift rather than perf_hooks.monitorEventLoopDelay: the histogram would need a reset per
// window and reports in its own resolution; drift is what a client waiting on this loop sees.
import { appendFileSync } from 'node:fs'
import { performance, PerformanceObserver } from 'node:perf_hooks'

const file = process.env.BENCH_LOOP_FILE
const TICK_MS = 10
const WINDOW_MS = 250

if (file !== undefined && file !== '') {
  let last = performance.now()
  let windowStart = last
  let maxStall = 0
  // GC entries arrive a little after the pause, so a pause may land in the next window.
  let maxGc = 0
  new PerformanceObserver(list => {
    for (const entry of list.getEntries()) maxGc = Math.max(maxGc, entry.duration)
  }).observe({ entryTypes: ['gc'] })
  const timer = setInterval(() => {
    const now = performance.now()
    maxStall = Math.max(maxStall, now - last - TICK_MS)
    last = now
    if (now - windowStart < WINDOW_MS) return
    const mem = process.memoryUsage()
    appendFileSync(file, `${JSON.stringify({
      t: Date.now(),
      maxStallMs: Math.max(0, Math.round(maxStall * 10) / 10),
      maxGcMs: Math.round(maxGc * 10) / 10,
      rssKiB: Math.round(mem.rss / 1024),
      heapUsedKiB: Math.round(mem.heapUsed / 1024)
    })}\n`)
    windowStart = now
    maxStall = 0
    maxGc = 0
  }, TICK_MS)
  // The probe must not keep a stopping gateway alive.
  timer.unref()
}
