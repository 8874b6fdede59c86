// Tenants through the official e2b SDK: run as tenant A (mode "a": create
// a sandbox, print its id), as tenant B (mode "b" ID: every call on A's
// sandbox, expected not found), as the admin (mode "admin" ID: sees it),
// and with a bad key (mode "bad"). E2B_API_KEY names the key.
// Prints one JSON report; tenants_test.go asserts on it.
import { Sandbox, NotFoundError, AuthenticationError } from 'e2b'

const [mode, id] = process.argv.slice(2)
const report = {}

async function errorOf(fn) {
  try {
    const v = await fn()
    return { ok: true, value: v === undefined ? null : v }
  } catch (e) {
    return { name: e.constructor.name, message: String(e.message), notFound: e instanceof NotFoundError, auth: e instanceof AuthenticationError }
  }
}

async function ids() {
  return (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
}

try {
  if (mode === 'a') {
    const sbx = await Sandbox.create('base')
    report.id = sbx.sandboxId
    report.run = (await sbx.commands.run('echo mine')).stdout.trim()
    report.list = await ids()
  } else if (mode === 'b') {
    report.info = await errorOf(() => Sandbox.getInfo(id))
    report.connect = await errorOf(() => Sandbox.connect(id))
    report.setTimeout = await errorOf(() => Sandbox.setTimeout(id, 60000))
    report.kill = await errorOf(() => Sandbox.kill(id))
    report.list = await ids()
  } else if (mode === 'admin') {
    report.list = await ids()
    report.info = await errorOf(() => Sandbox.getInfo(id))
  } else if (mode === 'bad') {
    report.list = await errorOf(() => ids())
    report.create = await errorOf(() => Sandbox.create('base'))
  } else throw new Error('unknown mode ' + mode)
} catch (e) {
  report.fatal = String(e && e.stack ? e.stack : e)
}
process.stdout.write(JSON.stringify(report) + '\n')
process.exit(0)
