// Deep freezing for plain data (the config, stored session records, logged messages): a value
// nobody may change after it is handed over, where a change would throw instead of spreading.

/** Freezes `value` and everything reachable from it; a frozen part is taken as frozen throughout. */
export function deepFreeze<T> (value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value)
    for (const item of Object.values(value)) deepFreeze(item)
  }
  return value
}
