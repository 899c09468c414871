// Processes a test starts must not outlive it, even when tap kills the test process on a timeout
// (SIGALRM), where no teardown runs. Every spawned server registers here; on exit or a fatal
// signal they are SIGKILLed synchronously, then the signal takes its normal course.
import type { ChildProcess } from 'node:child_process'

const live = new Set<ChildProcess>()
const SIGNALS = ['SIGALRM', 'SIGTERM', 'SIGINT', 'SIGHUP'] as const
let installed = false

function killAll (): void {
  for (const child of live) {
    if (child.exitCode === null && child.signalCode === null) {
      try { child.kill('SIGKILL') } catch { /* already gone */ }
    }
  }
  live.clear()
}

function install (): void {
  if (installed) return
  installed = true
  process.on('exit', killAll)
  for (const signal of SIGNALS) {
    const onSignal = (): void => {
      killAll()
      process.removeListener(signal, onSignal)
      process.kill(process.pid, signal)
    }
    process.on(signal, onSignal)
  }
}

/** Registers a child process to be killed if this process ends first. */
export function reap<T extends ChildProcess> (child: T): T {
  install()
  live.add(child)
  child.once('exit', () => { live.delete(child) })
  return child
}
