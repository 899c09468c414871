// This replica's id: unique per process, safe inside opaque ids (`s.<replica>.<seq>`) and key names.
import { randomBytes } from 'node:crypto'
import { hostname } from 'node:os'

export function newReplicaId (): string {
  const host = hostname().replace(/[^A-Za-z0-9_-]/g, '-').slice(0, 24)
  return `${host}-${process.pid}-${randomBytes(3).toString('hex')}`
}
