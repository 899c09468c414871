import t from 'tap'
import { MemorySessionTasks } from '../../src/state/session-tasks-memory.js'
import { sessionTasksContract } from './contract-session-tasks.js'

sessionTasksContract(t, async () => new MemorySessionTasks())
