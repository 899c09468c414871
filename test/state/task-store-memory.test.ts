import t from 'tap'
import { MemoryTaskStore } from '../../src/state/task-store-memory.js'
import { taskStoreContract } from './contract-task-store.js'

taskStoreContract(t, async t => {
  const store = new MemoryTaskStore()
  t.teardown(() => store.close())
  return store
})
