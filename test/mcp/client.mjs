// Black-box MCP client for mcp_test.go: drives mcp-sandboxd with the official
// TypeScript SDK (@modelcontextprotocol/sdk) and prints one JSON report on
// stdout. The SDK validates every tool's output schema and every structured
// result against it, so a schema the SDK rejects fails here.
//
//   node client.mjs <mode> <transport.json> [n]
//
// transport.json: {"type":"http","url":...,"token":...} or
//                 {"type":"stdio","command":...,"args":[...]}
// modes: scenario | concurrent (n run_code calls at once) | bench (n
//        sequential run_code print(1) calls, durations in ms) | progress (n
//        exec_command calls with progress, 8 in flight) | autofix (the client
//        provider: autofix, autofix_submit, autofix_status; then the sampling
//        provider answered by this client's "model") | agent (agent_run
//        with progress, run_get of its record, bad inputs) | vm (a VM of
//        the Linux test guest through the sandbox tools) | vmqga (a VM of
//        an administrator's disk reached through qemu-ga: the same tools
//        where capable, unavailable naming the capability where not) |
//        tasks (run_code as MCP tasks through the SDK's task client:
//        a result fetched, a 90 s program polled and cancelled, over HTTP
//        a task that outlives its client's connection; and a plain call) |
//        approval (an allowlist sandbox refused the package index's host:
//        pip install twice, the client answering transport.answer "yes",
//        "no" or, for "none", declaring no elicitation at all),
//        approvaldisconnect (the client goes away while it is asked)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, CreateMessageRequestSchema, ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [mode, transportJSON, nArg] = process.argv.slice(2);
const spec = JSON.parse(transportJSON);
const n = Number(nArg || 10);
const errors = [];

function transport() {
  if (spec.type === "http") {
    const headers = spec.token ? { Authorization: `Bearer ${spec.token}` } : {};
    return new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers } });
  }
  const t = new StdioClientTransport({ command: spec.command, args: spec.args, stderr: "pipe" });
  return t;
}

async function connect(options) {
  const client = new Client({ name: "mcp-sandboxd-blackbox", version: "1.0.0" }, options);
  if (options?.onSample) client.setRequestHandler(CreateMessageRequestSchema, options.onSample);
  client.onerror = (e) => errors.push(String(e));
  const t = transport();
  await client.connect(t);
  if (t.stderr) t.stderr.on("data", () => {}); // drained; the test reads the daemon's log instead
  return client;
}

const timeout = { timeout: 300_000 };

async function call(client, name, args, extra = {}) {
  const res = await client.callTool({ name, arguments: args }, undefined, { ...timeout, ...extra });
  return res;
}

// ok returns the structured content of a successful call, or throws.
async function ok(client, name, args, extra) {
  const res = await call(client, name, args, extra);
  if (res.isError) throw new Error(`${name}: ${res.content?.[0]?.text}`);
  return res.structuredContent;
}

async function scenario() {
  const client = await connect();
  const report = { server: client.getServerVersion(), instructions: client.getInstructions() };
  const { tools } = await client.listTools();
  report.tools = tools.map((t) => t.name).sort();
  report.annotations = Object.fromEntries(tools.map((t) => [t.name, t.annotations]));

  report.languages = (await ok(client, "languages_list", {})).languages.map((l) => l.name);
  const sb = await ok(client, "sandbox_create", { language: "python" });
  report.sandbox = sb;
  const id = sb.sandbox_id;

  report.python = await ok(client, "run_code", { language: "python", code: "import sys\nprint('hello from', sys.version_info[0])\n" });
  report.c = await ok(client, "run_code", { language: "c", code: "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", undefined_var); }\n" });

  report.write = await ok(client, "file_write", { sandbox_id: id, path: "/workspace/notes/a.txt", content: "line one\nline two\n" });
  report.read = await ok(client, "file_read", { sandbox_id: id, path: "/workspace/notes/a.txt" });

  // A background job polled to completion.
  const job = await ok(client, "exec_command", { sandbox_id: id, background: true,
    command: "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.3; done; echo warn >&2; exit 2" });
  report.job_started = job;
  let out = "", err = "", so = 0, se = 0, polls = 0, st;
  for (;;) {
    st = await ok(client, "job_status", { sandbox_id: id, job_id: job.job_id, stdout_offset: so, stderr_offset: se });
    polls++;
    out += st.stdout; err += st.stderr;
    so = st.next_stdout_offset; se = st.next_stderr_offset;
    if (st.state === "finished" && !st.more) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  report.job = { stdout: out, stderr: err, polls, exit_code: st.exit_code, termination: st.termination };

  // Progress: a line every 100 ms for 2 s.
  const progress = [];
  let resultAt = null;
  const res = await ok(client, "exec_command", { sandbox_id: id, command: "for i in $(seq 20); do echo tick $i; sleep 0.1; done" },
    { onprogress: (p) => progress.push({ at: Date.now(), progress: p.progress, message: p.message }), resetTimeoutOnProgress: true });
  resultAt = Date.now();
  report.progress = { count: progress.length, before_result: progress.filter((p) => p.at <= resultAt).length,
    text: progress.map((p) => p.message).join(""), stdout: res.stdout };

  // Errors: isError results with the taxonomy code in the text.
  const bad = await call(client, "sandbox_get", { sandbox_id: "sb-000000000000" });
  report.not_found = { isError: bad.isError, text: bad.content[0].text };
  const missing = await call(client, "file_read", { sandbox_id: id });
  report.missing = { isError: missing.isError, text: missing.content[0].text };

  // A preview port: the answer is checked against the tool's output schema
  // by the SDK.
  report.expose = await ok(client, "sandbox_expose_port", { sandbox_id: id, port: 8000 });
  const exposeBad = await call(client, "sandbox_expose_port", { sandbox_id: id, port: 70000 });
  report.expose_bad = { isError: exposeBad.isError, text: exposeBad.content[0].text };

  report.terminate = await ok(client, "sandbox_terminate", { sandbox_id: id });
  const after = await call(client, "exec_command", { sandbox_id: id, command: "true" });
  report.after_terminate = { isError: after.isError, text: after.content[0].text };
  await client.close();
  report.errors = errors;
  return report;
}

async function concurrent() {
  const client = await connect();
  const tag = `${process.pid}-${Math.random().toString(16).slice(2, 8)}`;
  const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const want = `${tag}:${i}`;
    const start = Date.now();
    const r = await ok(client, "run_code", { language: "python", code: `import os\nprint(${JSON.stringify(want)})\nprint(os.environ.get('HOSTNAME'))\n` });
    const [got, host] = r.stdout.trim().split("\n");
    return { want, got, ok: r.success && got === want && host === r.sandbox_id, run_id: r.run_id, ms: Date.now() - start };
  }));
  await client.close();
  return { tag, results, errors };
}

async function bench() {
  const client = await connect();
  await ok(client, "run_code", { language: "python", code: "print(1)\n" }); // warm
  const ms = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    const r = await ok(client, "run_code", { language: "python", code: "print(1)\n" });
    ms.push(Number(process.hrtime.bigint() - start) / 1e6);
    if (r.stdout !== "1\n") throw new Error(`bench: stdout ${JSON.stringify(r.stdout)}`);
  }
  await client.close();
  return { ms, errors };
}

// progress: n exec_command calls with a progress token, 8 in flight at a
// time, on one sandbox; every event gets a sequence number, so that a
// progress notification written after its request's result shows (the SDK
// also reports one for an unknown token through onerror).
async function progress() {
  const client = await connect();
  const sb = await ok(client, "sandbox_create", { language: "shell" });
  let seq = 0, notes = 0, late = 0, wrong = 0;
  const window = 8;
  let next = 0;
  async function worker() {
    while (next < n) {
      const i = next++;
      const seen = [];
      const res = await ok(client, "exec_command", { sandbox_id: sb.sandbox_id, command: `echo a${i}; echo b${i}` },
        { onprogress: (p) => { seen.push(++seq); notes++; } });
      const at = ++seq;
      late += seen.filter((s) => s > at).length;
      if (res.stdout !== `a${i}\nb${i}\n`) wrong++;
      // A notification that arrives after the result is counted where the
      // SDK drops it: onerror ("unknown token").
    }
  }
  await Promise.all(Array.from({ length: window }, worker));
  await ok(client, "sandbox_terminate", { sandbox_id: sb.sandbox_id });
  await client.close();
  return { calls: n, notifications: notes, late, wrong, errors };
}


async function autofix() {
  const report = {};
  let client = await connect();
  const first = await ok(client, "autofix", { language: "python", code: "print(undefined_name)\n", provider: "client" });
  report.first = { status: first.status, autofix_id: first.autofix_id, prompt_has_error: first.prompt.includes("NameError"), attempts: first.attempts };
  const status = await ok(client, "autofix_status", { autofix_id: first.autofix_id });
  report.status = { status: status.status, attempts: status.attempts };
  const done = await ok(client, "autofix_submit", { autofix_id: first.autofix_id, code: "print('fixed by the client')\n" });
  report.done = { status: done.status, success: done.success, attempts: done.attempts, stdout: done.last_result?.stdout, diff: done.diff };
  client.onerror = () => {}; // closing aborts the GET stream, which is no error
  await client.close();

  // Sampling: this client declares the capability and answers as a model.
  const prompts = [];
  client = await connect({ capabilities: { sampling: {} }, onSample: async (req) => {
    prompts.push(req.params.messages.map((m) => m.content.text).join(""));
    return { model: "blackbox-model", role: "assistant", stopReason: "endTurn",
      content: { type: "text", text: "```python main.py\nprint('fixed by sampling')\n```\n" } };
  } });
  const progress = [];
  const sampled = await ok(client, "autofix", { language: "python", code: "print(undefined_name)\n", provider: "sampling" },
    { onprogress: (p) => progress.push(p.message), resetTimeoutOnProgress: true });
  report.sampled = { status: sampled.status, provider: sampled.provider, attempts: sampled.attempts, stdout: sampled.last_result?.stdout,
    prompts: prompts.length, prompt_has_error: prompts.some((p) => p.includes("NameError")), progress };
  report.errors = [...errors];
  client.onerror = () => {};
  await client.close();
  return report;
}

// agent: agent_run with a progress token (the daemon's credential proxy
// points at the test's scripted Messages API), run_get of its record, and
// the bad inputs of agent sessions and credentials.
async function agent() {
  const client = await connect();
  const report = {};
  const progress = [];
  const session = await ok(client, "agent_run", { prompt: "Make test_calc.py pass.", max_turns: 10, timeout: 180,
    files: { "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n" } },
    { onprogress: (p) => progress.push(p.message), resetTimeoutOnProgress: true });
  report.session = session;
  report.progress = progress;
  report.record = await ok(client, "run_get", { run_id: session.run_id });
  const bad = async (name, args) => {
    const res = await call(client, name, args);
    return { isError: res.isError, text: res.content[0].text };
  };
  report.no_cli = await bad("agent_run", { prompt: "x", language: "shell" });
  report.unknown_image = await bad("agent_run", { prompt: "x", language: "no-such-image" });
  report.unknown_credential = await bad("sandbox_create", { language: "shell", network: "egress", credentials: ["no-such-credential"] });
  report.credential_on_none = await bad("sandbox_create", { language: "shell", network: "none", credentials: ["anthropic"] });
  report.no_prompt = await bad("agent_run", { prompt: "" });
  report.errors = [...errors];
  client.onerror = () => {};
  await client.close();
  return report;
}

// refusal is a call expected to fail: its isError and text.
async function refusal(client, name, args) {
  const res = await call(client, name, args);
  return { isError: !!res.isError, text: res.content?.[0]?.text ?? "" };
}

// screenshot is sandbox_screenshot's answer: its structured content and
// the image blocks (their type, size and PNG signature).
async function screenshot(client, id) {
  const res = await call(client, "sandbox_screenshot", { sandbox_id: id });
  const images = (res.content || []).filter((c) => c.type === "image").map((c) => {
    const b = Buffer.from(c.data, "base64");
    return { mimeType: c.mimeType, bytes: b.length, png: b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])) };
  });
  return { isError: !!res.isError, structured: res.structuredContent, images };
}

// vmCommon is the part of vm and vmqga that is the same on both guests:
// create (with its progress), exec, files, snapshot and restore, the
// screenshot, terminate; dir is a directory of the guest to write in.
async function vmCommon(client, report, dir) {
  const progress = [];
  const sb = await ok(client, "sandbox_create", { backend: "vm" },
    { onprogress: (p) => progress.push(p.message), resetTimeoutOnProgress: true });
  report.created = sb;
  report.create_progress = progress;
  const id = sb.sandbox_id;
  report.exec = await ok(client, "exec_command", { sandbox_id: id, command: "uname -s; id -u; echo err >&2; exit 3" });
  report.write = await ok(client, "file_write", { sandbox_id: id, path: `${dir}/notes/a.txt`, content: "hello from the SDK\n" });
  report.read = await ok(client, "file_read", { sandbox_id: id, path: `${dir}/notes/a.txt` });
  report.snapshot = await ok(client, "sandbox_snapshot", { sandbox_id: id, name: "clean" });
  await ok(client, "file_write", { sandbox_id: id, path: `${dir}/notes/later.txt`, content: "after the snapshot" });
  report.before_restore = await ok(client, "exec_command", { sandbox_id: id, command: `ls ${dir}/notes` });
  report.restore = await ok(client, "sandbox_restore", { sandbox_id: id, snapshot_id: report.snapshot.snapshot_id });
  report.after_restore = await ok(client, "exec_command", { sandbox_id: id, command: `ls ${dir}/notes` });
  report.get = await ok(client, "sandbox_get", { sandbox_id: id });
  report.screenshot = await screenshot(client, id);
  return id;
}

async function vmEnd(client, report, id) {
  report.terminate = await ok(client, "sandbox_terminate", { sandbox_id: id });
  report.after_terminate = await refusal(client, "exec_command", { sandbox_id: id, command: "true" });
  report.errors = [...errors];
  await client.close();
  return report;
}

// vm: a VM of the Linux test guest (our agent inside): every sandbox tool
// works on it, file_list and a background job too.
async function vm() {
  const client = await connect();
  const report = {};
  const { tools } = await client.listTools();
  report.tools = tools.map((t) => t.name).sort();
  const id = await vmCommon(client, report, "/workspace");
  report.list = await ok(client, "file_list", { sandbox_id: id, path: "/workspace/notes" });
  const job = await ok(client, "exec_command", { sandbox_id: id, background: true, command: "echo job; exit 4" });
  let st;
  for (let i = 0; i < 120; i++) {
    st = await ok(client, "job_status", { sandbox_id: id, job_id: job.job_id });
    if (st.state === "finished") break;
    await new Promise((r) => setTimeout(r, 250));
  }
  report.job = st;
  report.pause = await ok(client, "sandbox_pause", { sandbox_id: id });
  report.paused_exec = await refusal(client, "exec_command", { sandbox_id: id, command: "true" });
  report.resume = await ok(client, "sandbox_resume", { sandbox_id: id });
  report.resumed_exec = await ok(client, "exec_command", { sandbox_id: id, command: "cat /workspace/notes/a.txt" });
  return vmEnd(client, report, id);
}

// vmqga: a VM of an administrator's disk (vm.images.linux), reached
// through qemu-ga only: exec, files, machine snapshots and the screen
// work; listings, jobs and ports are refused naming the capability.
async function vmqga() {
  const client = await connect();
  const report = {};
  const id = await vmCommon(client, report, "/root");
  report.list = await refusal(client, "file_list", { sandbox_id: id, path: "/root/notes" });
  report.job = await refusal(client, "exec_command", { sandbox_id: id, background: true, command: "true" });
  report.expose = await refusal(client, "sandbox_expose_port", { sandbox_id: id, port: 8000 });
  report.pause = await refusal(client, "sandbox_pause", { sandbox_id: id });
  return vmEnd(client, report, id);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// startTask starts name as a task through the SDK's task client and
// returns the task it created (the stream is left: the caller polls).
async function startTask(client, name, args) {
  const it = client.experimental.tasks.callToolStream({ name, arguments: args }, undefined, { ...timeout, task: { ttl: 600_000 } });
  const first = (await it.next()).value;
  await it.return();
  if (first?.type !== "taskCreated") throw new Error(`${name}: first message ${JSON.stringify(first)}, want taskCreated`);
  return first.task;
}

async function liveSandboxes(client) {
  return (await ok(client, "sandbox_list", {})).sandboxes.map((s) => s.sandbox_id);
}

async function tasks() {
  let client = await connect();
  const report = { capabilities: client.getServerCapabilities().tasks };
  const { tools } = await client.listTools();
  report.task_support = Object.fromEntries(tools.filter((t) => t.execution?.taskSupport).map((t) => [t.name, t.execution.taskSupport]));

  // A short program to its result: the SDK polls tasks/get and fetches
  // tasks/result itself.
  report.short = [];
  for await (const m of client.experimental.tasks.callToolStream({ name: "run_code", arguments: { language: "python", code: "print(6*7)" } },
    undefined, { ...timeout, task: { ttl: 600_000 } })) {
    report.short.push(m.type === "result" ? { type: m.type, result: m.result } : m.type === "error" ? { type: m.type, error: String(m.error) }
      : { type: m.type, status: m.task.status, task_id: m.task.taskId, ttl: m.task.ttl });
  }

  // A 90 s program: polled while it runs, then cancelled; its throw-away
  // sandbox must go.
  const before = await liveSandboxes(client);
  const long = await startTask(client, "run_code", { language: "python", code: "import time\nprint('started', flush=True)\ntime.sleep(90)\nprint('finished')\n" });
  report.long = { created: long, polls: [] };
  let running = [];
  for (const t0 = Date.now(); Date.now() - t0 < 60_000;) {
    const t = await client.experimental.tasks.getTask(long.taskId);
    report.long.polls.push(t.status);
    running = (await liveSandboxes(client)).filter((id) => !before.includes(id));
    if (report.long.polls.length >= 3 && running.length > 0) break;
    await sleep(1000);
  }
  report.long.running_sandboxes = running;
  report.long.listed = (await client.experimental.tasks.listTasks()).tasks.some((t) => t.taskId === long.taskId);
  const cancelAt = Date.now();
  await client.experimental.tasks.cancelTask(long.taskId);
  report.long.after_cancel = (await client.experimental.tasks.getTask(long.taskId)).status;
  let left = running;
  while (left.length > 0 && Date.now() - cancelAt < 60_000) {
    await sleep(250);
    const live = await liveSandboxes(client);
    left = running.filter((id) => live.includes(id));
  }
  report.long.sandboxes_left = left;
  report.long.gone_ms = Date.now() - cancelAt;
  report.long.elapsed_ms = Date.now() - Date.parse(long.createdAt);

  // A client that sends no task parameter gets today's answer.
  const plain = await client.callTool({ name: "run_code", arguments: { language: "python", code: "print(6*7)" } }, undefined, timeout);
  report.plain = { keys: Object.keys(plain).sort(), stdout: plain.structuredContent?.stdout, text: plain.content?.map((c) => c.text).join("\n") };

  // Over HTTP: a task outlives its client's connection. The client goes
  // away while the program runs; a new connection on the same session
  // finds the task and its result.
  if (spec.type === "http") {
    const t = await startTask(client, "run_code", { language: "python", code: "import time\ntime.sleep(4)\nprint(6*7)\n" });
    const sessionId = client.transport.sessionId;
    const protocol = client.transport.protocolVersion;
    // The disconnect is the point: its aborted GET stream is not an error.
    client.onerror = () => {};
    await client.close();
    await sleep(1000);
    const headers = spec.token ? { Authorization: `Bearer ${spec.token}` } : {};
    const tr = new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers }, sessionId });
    client = new Client({ name: "mcp-sandboxd-blackbox", version: "1.0.0" });
    client.onerror = (e) => errors.push(String(e));
    await client.connect(tr);
    if (protocol) tr.setProtocolVersion(protocol);
    const polls = [];
    let st;
    for (const t0 = Date.now(); Date.now() - t0 < 120_000;) {
      st = await client.experimental.tasks.getTask(t.taskId);
      polls.push(st.status);
      if (st.status !== "working") break;
      await sleep(500);
    }
    const res = await client.experimental.tasks.getTaskResult(t.taskId, CallToolResultSchema);
    report.reconnect = { polls, status: st.status, stdout: res.structuredContent?.stdout, same_session: tr.sessionId === sessionId };
  }
  await client.close();
  report.errors = errors;
  return report;
}

// approval: network approvals through elicitation (elicit.go). The client
// declares elicitation (form mode) unless spec.answer is "none", records
// every elicitation/create (with the time it came, ms since the start)
// and answers it spec.answer, the first one after spec.delay_ms if set. With spec.fresh
// it then runs a fresh allowlist run_code that pip-installs from the
// configured index.
async function approval() {
  const t0 = Date.now();
  const asked = [];
  const options = spec.answer === "none" ? {} : { capabilities: { elicitation: { form: {} } } };
  const client = new Client({ name: "mcp-sandboxd-blackbox", version: "1.0.0" }, options);
  if (spec.answer !== "none") {
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push({ ...req.params, at: Date.now() - t0 });
      if (spec.delay_ms && asked.length === 1) await new Promise((r) => setTimeout(r, spec.delay_ms));
      return spec.answer === "yes" ? { action: "accept", content: { allow: true } } : { action: "decline" };
    });
  }
  client.onerror = (e) => errors.push(String(e));
  await client.connect(transport());
  const sb = await ok(client, "sandbox_create", { language: "python", network: "allowlist", allow: ["other.example.test"] });
  const id = sb.sandbox_id;
  const pip = "pip install --no-cache-dir --disable-pip-version-check --retries 0 --timeout 5 --target /workspace/lib " +
    "--index-url http://pkg.example.test/simple/ --trusted-host pkg.example.test greetpkg";
  const report = { sandbox_id: id };
  const start = Date.now() - t0;
  report.first = await call(client, "exec_command", { sandbox_id: id, command: pip });
  report.first_at = Date.now() - t0;
  report.first_ms = report.first_at - start;
  report.asked_after_first = asked.length;
  report.second = await call(client, "exec_command", { sandbox_id: id, command: pip });
  report.hello = await ok(client, "exec_command", { sandbox_id: id,
    command: "PYTHONPATH=/workspace/lib python3 -c 'import greetpkg; print(greetpkg.hello())'" });
  report.status = await ok(client, "sandbox_network", { sandbox_id: id });
  await ok(client, "sandbox_terminate", { sandbox_id: id });
  if (spec.fresh) {
    report.asked_before_fresh = asked.length;
    report.fresh = await call(client, "run_code", { language: "python", network: "allowlist",
      files: { "requirements.txt": "greetpkg\n" }, code: "import greetpkg\nprint(greetpkg.hello())\n" });
    report.fresh_at = Date.now() - t0;
  }
  report.asked = asked;
  await client.close();
  report.errors = errors;
  return report;
}

// approvaldisconnect: a client that goes away while it is asked (it
// closes its connection from the elicitation handler, never answering).
// A second client then reads the sandbox's network status until the
// refused name shows (the forwarder records it once the held lookup is
// answered), bounded, and removes the sandbox.
async function approvaldisconnect() {
  const t0 = Date.now();
  const client = new Client({ name: "mcp-sandboxd-blackbox", version: "1.0.0" }, { capabilities: { elicitation: { form: {} } } });
  const report = { asked_at: -1, closed_at: -1 };
  client.setRequestHandler(ElicitRequestSchema, async () => {
    report.asked_at = Date.now() - t0;
    setTimeout(() => { report.closed_at = Date.now() - t0; client.close(); }, 0);
    return new Promise(() => {}); // never answered
  });
  client.onerror = () => {}; // closing mid-call makes errors
  await client.connect(transport());
  const sb = await ok(client, "sandbox_create", { language: "python", network: "allowlist", allow: ["other.example.test"] });
  const id = sb.sandbox_id;
  report.sandbox_id = id;
  const pip = "pip install --no-cache-dir --disable-pip-version-check --retries 0 --timeout 5 --target /workspace/lib " +
    "--index-url http://pkg.example.test/simple/ --trusted-host pkg.example.test greetpkg";
  try {
    await call(client, "exec_command", { sandbox_id: id, command: pip });
    report.call = "returned";
  } catch (e) {
    report.call = String(e);
  }
  const c2 = await connect();
  let st;
  for (;;) {
    st = await ok(c2, "sandbox_network", { sandbox_id: id });
    if (st.counters.denied_destinations.includes("pkg.example.test") || Date.now() - t0 - report.closed_at > 20_000) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  report.released_after = Date.now() - t0 - report.closed_at;
  report.status = st;
  await ok(c2, "sandbox_terminate", { sandbox_id: id });
  await c2.close();
  report.errors = errors;
  return report;
}

const modes = { approval, approvaldisconnect, scenario, concurrent, bench, progress, autofix, agent, vm, vmqga, tasks };
try {
  const report = await modes[mode]();
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
} catch (e) {
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e), errors }) + "\n");
  process.exit(1);
}
