// Drives mcp-sandboxd's E2B-compatible API with the official e2b SDK, as a
// user's program would: the environment names the daemon (E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY), nothing else differs from E2B's own cloud.
// Prints one JSON report of what it observed; e2b_test.go asserts on it.
//
// usage: node client.mjs MODE [ARG]
//   main    - the acceptance flow (create, commands, files, pty, getHost,
//             lifecycle); ARG is the daemon's host:port for getHost
//   errors  - bad input, each through the SDK
//   timeout - a sandbox whose timeout passes
//   tls     - the SDK over https, envd by host name (ARG: host:port)
//   bench N - Sandbox.create() + commands.run('node -v'), N times
//   restart-before - start a background command that reads stdin and
//             prints a line a second; report the sandbox id and pid
//   gateway - through mcp-sandboxd gateway: create, commands.run (a
//             streamed one too), files, list, kill; the Go test checks
//             which node holds the sandbox
//   restart-after ID:PID - after the daemon restarted: list, connect to
//             that pid, send it input, and wait for its end
import http from 'node:http'
import https from 'node:https'
import { Sandbox, CommandExitError, NotFoundError, AuthenticationError } from 'e2b'

const [mode, arg] = process.argv.slice(2)
const report = {}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// errorOf runs fn and describes what it threw (null: nothing).
async function errorOf(fn) {
  try {
    await fn()
    return null
  } catch (e) {
    return { name: e.constructor.name, message: String(e.message), notFound: e instanceof NotFoundError,
      auth: e instanceof AuthenticationError, exit: e instanceof CommandExitError ? e.exitCode : undefined }
  }
}

async function until(what, fn, ms = 20000) {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(100)) {
    if (await fn()) return true
  }
  throw new Error('timed out waiting for ' + what)
}

// get fetches http://HOST/PATH from the daemon's listener with the Host
// header getHost gave: a wildcard DNS name would resolve to that listener.
function get(listen, host, path) {
  const [h, p] = listen.split(':')
  return new Promise((resolve) => {
    const req = http.request({ host: h, port: Number(p), path, headers: { Host: host } }, (res) => {
      let body = ''
      res.on('data', (d) => (body += d))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', (e) => resolve({ status: 0, body: String(e) }))
    req.end()
  })
}

async function main() {
  const run = Math.random().toString(16).slice(2)
  const sbx = await Sandbox.create('base', { metadata: { suite: 'e2b', run } })
  report.sandboxId = sbx.sandboxId

  // commands.run with callbacks, exit codes, envs, cwd, users
  const out = [], err = []
  const r = await sbx.commands.run('echo hello; echo oops >&2', { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) })
  report.run = { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode, onStdout: out.join(''), onStderr: err.join('') }
  report.exit = await errorOf(() => sbx.commands.run('echo before; exit 3'))
  report.envs = (await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar baz' } })).stdout
  report.envsGone = (await sbx.commands.run('echo "[$FOO]"')).stdout
  report.cwd = (await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout
  report.whoami = (await sbx.commands.run('id -un; echo $HOME; pwd')).stdout
  report.root = (await sbx.commands.run('id -u; touch /etc/e2b-root-was-here && chown user /etc/e2b-root-was-here && echo wrote', { user: 'root' })).stdout
  report.userCaps = (await sbx.commands.run('grep CapEff /proc/self/status')).stdout
  // sudo as the SDKs' own tests use it: the user becomes root (and back),
  // stdin passes through, the exit status and the environment are sudo's.
  report.sudo = (await sbx.commands.run('sudo echo hi; sudo id -u; sudo -u user id -un; echo piped | sudo cat; sudo sh -c \'echo $HOME $USER $SUDO_USER; touch /root/sudo-was-here; ls /root\'')).stdout
  report.sudoExit = await errorOf(() => sbx.commands.run('sudo sh -c "exit 3"'))
  report.userCannot = await errorOf(() => sbx.commands.run('touch /etc/e2b-user'))
  report.tools = (await sbx.commands.run('bash --version | head -1; python3 --version; python --version; node -v; git --version')).stdout

  // background, sendStdin, connect, list, kill, wait
  const bgOut = []
  const h = await sbx.commands.run('read line; echo got:$line; sleep 60', { background: true, stdin: true, onStdout: (d) => bgOut.push(d) })
  report.bgPid = h.pid
  await sbx.commands.sendStdin(h.pid, 'abc\n')
  await until('stdin echo', () => bgOut.join('').includes('got:abc'))
  report.bgStdout = bgOut.join('')
  report.listed = (await sbx.commands.list()).map((p) => p.pid).includes(h.pid)
  const h2 = await sbx.commands.connect(h.pid)
  report.killed = await h2.kill()
  report.bgWait = await errorOf(() => h.wait())
  report.killAgain = await sbx.commands.kill(h.pid)
  const h3 = await sbx.commands.run('sleep 0.5; echo done', { background: true })
  report.bgDone = (await h3.wait()).stdout
  const h4 = await sbx.commands.run('cat; echo eof', { background: true, stdin: true })
  await sbx.commands.sendStdin(h4.pid, 'piped\n')
  await sbx.commands.closeStdin(h4.pid)
  report.closeStdin = (await h4.wait()).stdout

  // A client that goes away leaves the command running; its timeout kills it.
  const h5 = await sbx.commands.run('sleep 1; echo survived', { background: true })
  await h5.disconnect()
  report.survived = (await (await sbx.commands.connect(h5.pid)).wait()).stdout
  const t0 = Date.now()
  report.timeoutErr = await errorOf(() => sbx.commands.run('sleep 30; echo late', { timeoutMs: 1000 }))
  report.timeoutMs = Date.now() - t0
  report.afterTimeout = (await sbx.commands.run('ps -eo args')).stdout.includes('sleep 30')

  // files
  await sbx.files.write('/home/user/a.txt', 'hello file')
  report.readText = await sbx.files.read('/home/user/a.txt')
  await sbx.files.write('rel.bin', new Uint8Array([0, 1, 2, 255]).buffer)
  report.readBytes = Array.from(await sbx.files.read('/home/user/rel.bin', { format: 'bytes' }))
  report.catText = (await sbx.commands.run('cat /home/user/a.txt; stat -c %U /home/user/a.txt')).stdout
  report.list = (await sbx.files.list('/home/user')).map((e) => e.name).sort()
  report.exists = [await sbx.files.exists('/home/user/a.txt'), await sbx.files.exists('/home/user/nope')]
  const info = await sbx.files.getInfo('/home/user/a.txt')
  report.info = { name: info.name, type: info.type, size: info.size, owner: info.owner, permissions: info.permissions, path: info.path }
  report.rename = (await sbx.files.rename('/home/user/a.txt', '/home/user/sub/b.txt')).path
  report.afterRename = [await sbx.files.exists('/home/user/a.txt'), await sbx.files.read('/home/user/sub/b.txt')]
  await sbx.files.remove('/home/user/sub')
  report.afterRemove = await sbx.files.exists('/home/user/sub/b.txt')
  report.makeDir = [await sbx.files.makeDir('/home/user/d/e'), await sbx.files.makeDir('/home/user/d/e')]
  report.dirInfo = (await sbx.files.getInfo('/home/user/d/e')).type
  await sbx.files.makeDir('/home/user/w')
  const events = []
  const watch = await sbx.files.watchDir('/home/user/w', (ev) => events.push(ev))
  await sbx.files.write('/home/user/w/new.txt', 'x')
  await until('watch event', () => events.some((e) => e.name === 'new.txt' && e.type === 'write'))
  await watch.stop()
  report.watch = events.map((e) => `${e.type}:${e.name}`)

  // pty
  let ptyOut = ''
  const dec = new TextDecoder()
  const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (ptyOut += dec.decode(d)) })
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
  await until('pty output', () => ptyOut.includes('pty-42'))
  await sbx.pty.resize(t.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size\n'))
  await until('stty size', () => ptyOut.includes('30 100'))
  report.ptyKilled = await sbx.pty.kill(t.pid)
  report.pty = ptyOut.includes('pty-42') && ptyOut.includes('30 100')

  // getHost: a server started in the sandbox, reached by host name
  await sbx.files.write('/home/user/www/index.html', 'served-from-sandbox')
  await sbx.commands.run('cd /home/user/www && python3 -m http.server 8000', { background: true })
  const host = sbx.getHost(8000)
  report.host = host
  let page = { status: 0 }
  await until('http server', async () => {
    page = await get(arg, host, '/index.html')
    return page.status === 200
  })
  report.page = page.body

  // lifecycle: timeout, list with a metadata filter, metrics, pause/connect
  await sbx.setTimeout(120_000)
  const i1 = await sbx.getInfo()
  report.endInSec = Math.round((i1.endAt.getTime() - Date.now()) / 1000)
  report.metadata = i1.metadata
  const listed = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
  report.listMeta = listed.map((s) => s.sandboxId)
  report.listOther = (await Sandbox.list({ query: { metadata: { run: 'other' } } }).nextItems()).length
  const m = await sbx.getMetrics()
  report.metrics = m.length > 0 && m[0].cpuCount >= 1 && m[0].memTotal > 0 && m[0].timestamp instanceof Date && !isNaN(m[0].timestamp)
  report.pause = await sbx.pause()
  report.pausedState = (await sbx.getInfo()).state
  report.pausedList = (await Sandbox.list({ query: { metadata: { run }, state: ['paused'] } }).nextItems()).length
  const again = await Sandbox.connect(sbx.sandboxId)
  report.resumedState = (await again.getInfo()).state
  report.afterResume = (await again.commands.run('cat /home/user/rel.bin | wc -c')).stdout

  report.kill = await sbx.kill()
  report.isRunning = await sbx.isRunning()
  report.killedRun = await errorOf(() => sbx.commands.run('echo hi'))
  report.killedInfo = await errorOf(() => Sandbox.getInfo(sbx.sandboxId))
  report.killTwice = await Sandbox.kill(sbx.sandboxId)
}

async function errors() {
  report.wrongKey = await errorOf(() => Sandbox.create('base', { apiKey: 'e2b_' + '0'.repeat(40) }))
  report.badKeyForm = await errorOf(() => Sandbox.create('base', { apiKey: 'not-a-key' }))
  report.unknownSandbox = await errorOf(() => Sandbox.connect('sb000000000000'))
  report.unknownKill = await Sandbox.kill('sb000000000000')
  report.unknownTemplate = await errorOf(() => Sandbox.create('no-such-template'))
  // Every image is a template; E2B's home is made in it.
  const other = await Sandbox.create('shell')
  report.otherTemplate = (await other.commands.run('pwd; echo $HOME; touch x && echo ok; id -u')).stdout
  await other.kill()
  const sbx = await Sandbox.create('base')
  report.sandboxId = sbx.sandboxId
  report.missingFile = await errorOf(() => sbx.files.read('/home/user/missing.txt'))
  await sbx.files.write('/home/user/f.txt', 'regular')
  report.underFile = await errorOf(() => sbx.files.write('/home/user/f.txt/g.txt', 'x'))
  report.underFileLeft = (await sbx.commands.run('ls -la /home/user; cat /home/user/f.txt')).stdout
  report.badCwd = await errorOf(() => sbx.commands.run('pwd', { cwd: '/no/such/dir' }))
  report.badUser = await errorOf(() => sbx.commands.run('id', { user: 'mallory' }))
  // The same sandbox through a handle with a forged access token.
  report.badToken = await errorOf(() => new Sandbox({ sandboxId: sbx.sandboxId, envdVersion: '0.5.7', envdAccessToken: 'forged' }).commands.run('id'))
  report.badTokenFile = await errorOf(() => new Sandbox({ sandboxId: sbx.sandboxId, envdVersion: '0.5.7', envdAccessToken: 'forged' }).files.read('/home/user/f.txt'))
  // A pre-signed URL works without headers or key; altered, it does not.
  const url = await sbx.downloadUrl('/home/user/f.txt')
  const ok = await fetch(url)
  report.signed = [ok.status, await ok.text()]
  const bad = await fetch(url.replace('f.txt', 'g.txt'))
  report.signedAltered = bad.status
  await sbx.kill()
  report.killedRun = await errorOf(() => sbx.commands.run('echo hi'))
  report.killedWrite = await errorOf(() => sbx.files.write('/home/user/x', 'x'))
}

async function timeout() {
  const sbx = await Sandbox.create('base', { timeoutMs: 2000 })
  report.sandboxId = sbx.sandboxId
  report.runningAtFirst = await sbx.isRunning()
  const start = Date.now()
  await until('the timeout', async () => !(await sbx.isRunning()), 30000)
  report.goneAfterMs = Date.now() - start
  report.info = await errorOf(() => Sandbox.getInfo(sbx.sandboxId))
  // onTimeout: 'pause' (autoPause): paused when the timeout passes, then
  // resumed by connect with its files.
  const p = await Sandbox.create('base', { timeoutMs: 2000, lifecycle: { onTimeout: 'pause' } })
  await p.files.write('/home/user/kept.txt', 'kept')
  await until('the pause', async () => (await p.getInfo()).state === 'paused', 30000)
  report.autoPaused = true
  const back = await Sandbox.connect(p.sandboxId)
  report.resumed = (await back.commands.run('cat /home/user/kept.txt')).stdout
  report.resumedEndIn = Math.round(((await back.getInfo()).endAt.getTime() - Date.now()) / 1000)
  await back.kill()
}

// bench alternates the E2B SDK and our REST API (REST_URL, REST_TOKEN),
// each: create a base sandbox, run node -v; the kill is not timed.
// tls: the same SDK over https (E2B_API_URL and E2B_SANDBOX_URL are
// https://; NODE_EXTRA_CA_CERTS trusts the daemon's certificate), and envd
// reached by host name over TLS (ARG is the listener's host:port).
async function tls() {
  const sbx = await Sandbox.create('base')
  report.sandboxId = sbx.sandboxId
  report.run = (await sbx.commands.run('echo over-tls')).stdout
  await sbx.files.write('/home/user/t.txt', 'tls file')
  report.read = await sbx.files.read('/home/user/t.txt')
  const [h, p] = arg.split(':')
  const name = `49983-${sbx.sandboxId}.e2b.test`
  report.hostHealth = await new Promise((resolve) => {
    const req = https.request({ host: h, port: Number(p), path: '/health', servername: name, headers: { Host: name } }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode))
    })
    req.on('error', (e) => resolve(String(e)))
    req.end()
  })
  await sbx.kill()
}

async function restartBefore() {
  const sbx = await Sandbox.create('base', { timeoutMs: 300000 })
  report.sandboxId = sbx.sandboxId
  const h = await sbx.commands.run('for i in 1 2 3; do echo tick$i; sleep 0.2; done; read line; echo got:$line', { background: true, stdin: true })
  report.pid = h.pid
  // The ticks are out before the restart: after it, only what follows.
  await until('ticks', async () => (h.stdout || '').includes('tick3'))
  report.before = h.stdout
}

async function restartAfter() {
  const [id, pid] = arg.split(':')
  const sbx = await Sandbox.connect(id)
  report.listed = (await sbx.commands.list()).some((p) => p.pid === Number(pid))
  const h = await sbx.commands.connect(Number(pid))
  await sbx.commands.sendStdin(Number(pid), 'after-restart\n')
  const r = await h.wait()
  report.stdout = r.stdout
  report.exitCode = r.exitCode
  report.unknown = await errorOf(() => sbx.commands.connect(999999))
  await sbx.kill()
}

async function bench(n) {
  report.ms = []
  report.restMs = []
  const rest = async (method, path, body) => {
    const res = await fetch(process.env.REST_URL + path, { method, headers: { Authorization: 'Bearer ' + process.env.REST_TOKEN, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body) })
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`)
    if (res.status === 204) return null
    // exec answers NDJSON: output lines, then {exit}.
    const lines = (await res.text()).trim().split('\n').map((l) => JSON.parse(l))
    const exit = lines.find((l) => l.exit)
    if (!exit) return lines[lines.length - 1]
    return { ...exit.exit, stdout: lines.filter((l) => l.stream === 'stdout').map((l) => l.data).join('') }
  }
  for (let i = 0; i < n; i++) {
    let t0 = performance.now()
    const sbx = await Sandbox.create()
    const r = await sbx.commands.run('node -v')
    report.ms.push(performance.now() - t0)
    report.node = r.stdout.trim()
    await sbx.kill()
    t0 = performance.now()
    const sb = await rest('POST', '/v1/sandboxes', { image: 'base' })
    const x = await rest('POST', `/v1/sandboxes/${sb.sandbox_id}/exec`, { command: 'node -v' })
    report.restMs.push(performance.now() - t0)
    report.restNode = x.stdout.trim()
    await rest('DELETE', `/v1/sandboxes/${sb.sandbox_id}`)
  }
}

// gateway is the flow a program runs against a fleet's gateway, whose
// E2B listener places the sandbox on a node and routes envd to it.
async function gateway() {
  const sbx = await Sandbox.create('base', { metadata: { suite: 'gateway' } })
  report.sandboxId = sbx.sandboxId
  const r = await sbx.commands.run('echo hello-$((6*7)); echo oops >&2')
  report.run = { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
  // A server stream through the gateway: each line arrives while the
  // command still runs, not all at its end.
  const seen = []
  await sbx.commands.run('for i in 1 2 3; do echo line-$i; sleep 0.4; done', { onStdout: (d) => seen.push(performance.now()) })
  report.streamed = seen.length
  report.streamSpreadMs = seen.length > 1 ? seen[seen.length - 1] - seen[0] : 0
  await sbx.files.write('/home/user/gw.txt', 'through the gateway')
  report.readText = await sbx.files.read('/home/user/gw.txt')
  const listed = await Sandbox.list().nextItems()
  report.listed = listed.map((s) => s.sandboxId).includes(sbx.sandboxId)
  report.killed = await sbx.kill()
  report.runningAfterKill = await sbx.isRunning()
}

try {
  if (mode === 'main') await main()
  else if (mode === 'gateway') await gateway()
  else if (mode === 'errors') await errors()
  else if (mode === 'timeout') await timeout()
  else if (mode === 'tls') await tls()
  else if (mode === 'bench') await bench(Number(arg))
  else if (mode === 'restart-before') await restartBefore()
  else if (mode === 'restart-after') await restartAfter()
  else throw new Error('unknown mode ' + mode)
} catch (e) {
  report.fatal = String(e && e.stack ? e.stack : e)
}
process.stdout.write(JSON.stringify(report) + '\n')
process.exit(0)
