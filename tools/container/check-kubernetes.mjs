// The Kubernetes base (deploy/kubernetes): renders the base and every overlay with
// `kubectl kustomize`, validates each object against the Kubernetes API schemas (kubernetes-models,
// which bundles the OpenAPI schemas and validates with ajv; ServiceMonitor from
// @kubernetes-models/prometheus-operator), checks what an operator relies on (probes, grace period
// longer than the drain, non-root read-only pod, resources, folder mounts, references that resolve),
// and with --out DIR writes what tools/container/run.sh needs to run the image as the trial
// overlay's Deployment would: the ConfigMap's files, the Secret's files (fresh values: the overlay's
// are placeholders), and `docker run` arguments for its mounts and variables.
// Exit 0 when everything held; every problem is printed and the exit is 1 otherwise.
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { mkdirSync, readdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { parseAllDocuments, parse as parseYaml } from 'yaml'

const root = fileURLToPath(new URL('../../deploy/kubernetes/', import.meta.url))
const { values } = parseArgs({ options: { out: { type: 'string' } } })
const problems = []
const problem = (where, text) => { problems.push(`${where}: ${text}`) }
const say = text => { process.stdout.write(`# container: ${text}\n`) }

/** The model class of an object's apiVersion and kind, or undefined when none is known. */
async function modelOf (apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion]
  const path = group === 'monitoring.coreos.com'
    ? `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`
    : `kubernetes-models/${group === '' ? '' : `${group}/`}${version}/${kind}`
  try {
    return (await import(path))[kind]
  } catch {
    return undefined
  }
}

function render (dir) {
  const text = execFileSync('kubectl', ['kustomize', dir], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
  return parseAllDocuments(text).map(d => d.toJS()).filter(o => o !== null)
}

const dirs = ['base', ...readdirSync(join(root, 'overlays')).map(o => `overlays/${o}`)]
const rendered = {}
for (const dir of dirs) {
  let objects
  try {
    objects = render(join(root, dir))
  } catch (err) {
    problem(dir, `kubectl kustomize failed: ${String(err.stderr ?? err.message).trim()}`)
    continue
  }
  rendered[dir] = objects
  for (const obj of objects) {
    const where = `${dir}: ${obj.kind}/${obj.metadata?.name}`
    const Model = await modelOf(obj.apiVersion, obj.kind)
    if (Model === undefined) { problem(where, `no schema for ${obj.apiVersion} ${obj.kind}`); continue }
    try {
      new Model(obj).validate()
    } catch (err) {
      problem(where, `invalid: ${err.message}`)
    }
  }
  checkGateway(dir, objects)
  say(`${dir}: ${objects.length} objects valid against the API schemas (${objects.map(o => o.kind).join(', ')})`)
}

/** What the issue asks of the gateway's objects, in every rendering. */
function checkGateway (dir, objects) {
  const find = (kind, name = 'mcp-gateway') => objects.find(o => o.kind === kind && o.metadata?.name === name)
  const deployment = find('Deployment')
  if (deployment === undefined) { problem(dir, 'no Deployment mcp-gateway'); return }
  const pod = deployment.spec.template.spec
  const gw = pod.containers.find(c => c.name === 'gateway')
  const where = `${dir}: Deployment/mcp-gateway`
  if (dir === 'base' && deployment.spec.replicas !== 3) problem(where, 'three replicas in the base')
  if (gw.readinessProbe?.httpGet?.path !== '/readyz') problem(where, 'readiness probe on /readyz')
  if (gw.livenessProbe?.httpGet?.path !== '/healthz') problem(where, 'liveness probe on /healthz')
  if (gw.command !== undefined) problem(where, 'must keep the image\'s command (and tini)')
  if (pod.securityContext?.runAsNonRoot !== true || typeof pod.securityContext?.runAsUser !== 'number') problem(where, 'runAsNonRoot with a numeric runAsUser')
  if (gw.securityContext?.readOnlyRootFilesystem !== true) problem(where, 'read-only root file system')
  if (gw.resources?.requests?.cpu === undefined || gw.resources?.limits?.memory === undefined) problem(where, 'resources: cpu request and memory limit')
  for (const m of gw.volumeMounts ?? []) if (m.subPath !== undefined) problem(where, `${m.mountPath} mounted by subPath (the kubelet never updates it)`)
  const env = Object.fromEntries((gw.env ?? []).map(e => [e.name, e]))
  if (env.HOME === undefined || !(gw.volumeMounts ?? []).some(m => m.mountPath === env.HOME.value)) problem(where, 'HOME must be a writable mount (npx under a read-only root)')
  const configPath = env.MCP_GATEWAY_CONFIG?.value
  const configMount = (gw.volumeMounts ?? []).find(m => configPath?.startsWith(`${m.mountPath}/`))
  const configVolume = pod.volumes.find(v => v.name === configMount?.name)
  const configMap = find('ConfigMap', configVolume?.configMap?.name)
  const file = configPath?.slice((configMount?.mountPath.length ?? 0) + 1)
  if (configMap?.data?.[file] === undefined) { problem(where, 'MCP_GATEWAY_CONFIG names no file of a mounted ConfigMap'); return }
  const config = parseYaml(configMap.data[file])
  const drainS = (config.shutdown?.drainMs ?? 5000) / 1000
  const deadlineS = (config.shutdown?.deadlineMs ?? 15000) / 1000
  if (!(pod.terminationGracePeriodSeconds > drainS + deadlineS)) problem(where, `terminationGracePeriodSeconds (${pod.terminationGracePeriodSeconds}) must exceed drain + deadline (${drainS + deadlineS} s)`)
  if (config.listen?.port !== gw.ports?.[0]?.containerPort) problem(where, 'the container port is the config\'s listen.port')
  if (config.reload?.watch !== true) problem(where, 'the config should be reloaded live (reload.watch)')
  for (const kind of ['Service', 'PodDisruptionBudget', 'HorizontalPodAutoscaler', 'NetworkPolicy']) if (find(kind) === undefined) problem(dir, `no ${kind} mcp-gateway`)
  const labels = deployment.spec.template.metadata.labels
  const selects = selector => Object.entries(selector ?? {}).every(([k, v]) => labels[k] === v) && Object.keys(selector ?? {}).length > 0
  if (!selects(find('Service')?.spec.selector)) problem(dir, 'the Service selects no gateway pod')
  if (!selects(find('PodDisruptionBudget')?.spec.selector.matchLabels)) problem(dir, 'the PodDisruptionBudget selects no gateway pod')
  if (!selects(find('NetworkPolicy')?.spec.podSelector.matchLabels)) problem(dir, 'the NetworkPolicy selects no gateway pod')
  const secretName = pod.volumes.find(v => v.secret !== undefined)?.secret.secretName
  const secret = find('Secret', secretName)
  if (secret !== undefined) {
    const keys = new Set(Object.keys({ ...secret.data, ...secret.stringData }))
    for (const e of gw.env ?? []) {
      const ref = e.valueFrom?.secretKeyRef
      if (ref !== undefined && (ref.name !== secretName || !keys.has(ref.key))) problem(where, `env ${e.name} names a key the Secret lacks`)
    }
    const secretMount = gw.volumeMounts.find(m => m.name === pod.volumes.find(v => v.secret !== undefined).name).mountPath
    const uncommented = configMap.data[file].split('\n').filter(l => !/^\s*#/.test(l)).join('\n')
    for (const [, path] of uncommented.matchAll(/\$\{file:([^}]+)\}/g)) {
      if (!path.startsWith(`${secretMount}/`) || !keys.has(path.slice(secretMount.length + 1))) problem(where, `the config reads ${path}, which the Secret does not provide`)
    }
  }
}

function writeRunInputs (out) {
  const objects = rendered['overlays/trial']
  if (objects === undefined) { problem('--out', 'overlays/trial did not render'); return }
  const deployment = objects.find(o => o.kind === 'Deployment' && o.metadata.name === 'mcp-gateway')
  const pod = deployment.spec.template.spec
  const gw = pod.containers.find(c => c.name === 'gateway')
  const secretVolume = pod.volumes.find(v => v.secret !== undefined)
  const secret = objects.find(o => o.kind === 'Secret' && o.metadata.name === secretVolume.secret.secretName)
  const decoded = Object.fromEntries(Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]))
  const apiKey = `mgw_${randomBytes(24).toString('base64url')}`
  const values = {}
  for (const [key, value] of Object.entries({ ...decoded, ...secret.stringData })) {
    // The overlay's placeholders are refused by the gateway on purpose: fresh values stand in.
    if (key.endsWith('.sha256')) values[key] = createHash('sha256').update(apiKey).digest('hex')
    else if (value === 'REPLACE-ME') values[key] = randomBytes(32).toString('hex')
    else values[key] = value
  }
  mkdirSync(join(out, 'config'), { recursive: true })
  mkdirSync(join(out, 'secrets'), { recursive: true })
  const args = []
  for (const m of gw.volumeMounts) {
    const volume = pod.volumes.find(v => v.name === m.name)
    if (volume.configMap !== undefined) {
      const cm = objects.find(o => o.kind === 'ConfigMap' && o.metadata.name === volume.configMap.name)
      for (const [name, text] of Object.entries(cm.data)) writeFileSync(join(out, 'config', name), text)
      args.push('-v', `${join(out, 'config')}:${m.mountPath}:ro`)
    } else if (volume.secret !== undefined) {
      for (const [name, value] of Object.entries(values)) writeFileSync(join(out, 'secrets', name), `${value}\n`)
      args.push('-v', `${join(out, 'secrets')}:${m.mountPath}:ro`)
    } else if (volume.emptyDir !== undefined) {
      args.push('--tmpfs', `${m.mountPath}:uid=${pod.securityContext.runAsUser},gid=${pod.securityContext.runAsGroup}`)
    }
  }
  for (const e of gw.env) {
    const ref = e.valueFrom?.secretKeyRef
    args.push('-e', `${e.name}=${ref !== undefined ? values[ref.key] : e.value}`)
  }
  args.push('--user', `${pod.securityContext.runAsUser}:${pod.securityContext.runAsGroup}`)
  if (gw.securityContext.readOnlyRootFilesystem === true) args.push('--read-only')
  if (gw.securityContext.capabilities?.drop?.includes('ALL')) args.push('--cap-drop', 'ALL')
  if (gw.securityContext.allowPrivilegeEscalation === false) args.push('--security-opt', 'no-new-privileges')
  writeFileSync(join(out, 'docker-args'), `${args.join('\n')}\n`)
  writeFileSync(join(out, 'api-key'), apiKey)
  writeFileSync(join(out, 'metrics-token'), values['metrics-token'] ?? '')
  writeFileSync(join(out, 'host'), gw.env.find(e => e.name === 'PUBLIC_HOST')?.value ?? '')
  writeFileSync(join(out, 'redis-host'), new URL(values['redis-url']).hostname)
}

if (values.out !== undefined && problems.length === 0) writeRunInputs(values.out)
if (problems.length > 0) {
  for (const p of problems) process.stderr.write(`# container: FAILED: ${p}\n`)
  process.exit(1)
}
