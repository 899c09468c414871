// Memory twin of the sessions' task view (session-tasks.ts).
import { byCreation, evictee, MAX_SESSION_TASKS, merged, type SessionTask, type SessionTasks } from './session-tasks.js'

interface Held { tasks: Map<string, SessionTask>, expiresAt: number }

export class MemorySessionTasks implements SessionTasks {
  readonly #sessions = new Map<string, Held>()

  async put (sid: string, task: SessionTask, ttlMs: number): Promise<string | null> {
    const now = Date.now()
    let held = this.#live(sid, now)
    if (held === undefined) {
      held = { tasks: new Map(), expiresAt: 0 }
      this.#sessions.set(sid, held)
    }
    held.expiresAt = now + ttlMs
    const before = held.tasks.get(task.taskId)
    held.tasks.set(task.taskId, structuredClone(merged(before, task)))
    if (before === undefined && held.tasks.size > MAX_SESSION_TASKS) {
      const drop = evictee(held.tasks.values())
      if (drop !== undefined) held.tasks.delete(drop.taskId)
    }
    // Expired sessions are dropped as they are met; a sweep over many would cost more than it saves.
    if (this.#sessions.size % 256 === 0) for (const [id, h] of this.#sessions) if (h.expiresAt <= now) this.#sessions.delete(id)
    return before?.status ?? null
  }

  async list (sid: string): Promise<SessionTask[]> {
    const held = this.#live(sid, Date.now())
    if (held === undefined) return []
    return [...held.tasks.values()].sort(byCreation).map(task => structuredClone(task))
  }

  async forget (sid: string): Promise<void> { this.#sessions.delete(sid) }

  #live (sid: string, now: number): Held | undefined {
    const held = this.#sessions.get(sid)
    if (held !== undefined && held.expiresAt <= now) {
      this.#sessions.delete(sid)
      return undefined
    }
    return held
  }
}
