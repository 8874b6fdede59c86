// The 2026-07-28 MCP tasks extension (io.modelcontextprotocol/tasks) against
// mcp-sandboxd, driven from ../exttasks_test.go with the official TypeScript
// SDK v2 (@modelcontextprotocol/client) and the official extension package
// (@modelcontextprotocol/ext-tasks). Prints one JSON report on stdout.
//
//   node client.mjs <transport.json> <marker>
//
// transport.json: {"type":"http","url":...,"token":...,"foreign":...} or
//                 {"type":"stdio","command":...,"args":[...]}
// marker: the sleep length (seconds, unique per run) of the long program,
//         by which its process is found in /proc.
//
// The extension package needs, for a 2026-07-28 server, a raw dispatcher
// (the SDK client's own request path rejects resultType "task") and the
// request framing the client negotiated: rawDispatch sends through the
// client's own transport, with ids of its own, and takes the answers to
// those ids before the client sees them.
import { readdirSync, readFileSync } from "node:fs";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const [transportJSON, marker] = process.argv.slice(2);
const spec = JSON.parse(transportJSON);
const errors = [];
const clientInfo = { name: "mcp-sandboxd-ext-tasks", version: "1.0.0" };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function transport(token) {
  if (spec.type === "http") {
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    return new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers } });
  }
  return new StdioClientTransport({ command: spec.command, args: spec.args, stderr: "pipe" });
}

// connect returns a connected v2 client and a raw dispatcher on its transport.
async function connect(token) {
  // "auto": probe server/discover and speak 2026-07-28 when the server
  // offers it (the SDK's default, "legacy", never probes: it initializes
  // on 2025-11-25, where the package falls back to that revision's tasks).
  const client = new Client(clientInfo, { capabilities: {}, versionNegotiation: { mode: "auto" } });
  client.onerror = (e) => errors.push(String(e));
  const t = transport(token);
  await client.connect(t);
  if (t.stderr) t.stderr.on("data", () => {});
  const pending = new Map();
  let n = 0;
  const theirs = t.onmessage;
  t.onmessage = (msg, extra) => {
    if (msg && typeof msg.id === "string" && pending.has(msg.id) && ("result" in msg || "error" in msg)) {
      const resolve = pending.get(msg.id);
      pending.delete(msg.id);
      resolve(msg.error ? { kind: "error", error: msg.error } : { kind: "result", result: msg.result });
      return;
    }
    theirs?.call(t, msg, extra);
  };
  const rawDispatch = async (request) => {
    const id = `ext-tasks-${++n}`;
    const answered = new Promise((resolve) => pending.set(id, resolve));
    await t.send({ jsonrpc: "2.0", id, method: request.method, params: request.params ?? {} });
    return answered;
  };
  return { client, rawDispatch, version: client.getNegotiatedProtocolVersion?.() ?? "2026-07-28" };
}

// framed is a request as a declaring client sends it: its protocol version,
// identity and capabilities (with or without the extension) in _meta.
function framed(version, params, declare = true) {
  return {
    ...params,
    _meta: {
      "io.modelcontextprotocol/protocolVersion": version,
      "io.modelcontextprotocol/clientInfo": clientInfo,
      "io.modelcontextprotocol/clientCapabilities": declare ? { extensions: { "io.modelcontextprotocol/tasks": {} } } : {},
    },
  };
}

// markerProcs counts this host's processes running the long program's sleep.
function markerProcs() {
  let count = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      if (argv[0].endsWith("sleep") && argv[1] === marker) count++;
    } catch {}
  }
  return count;
}

async function sandboxes(client) {
  const res = await client.callTool({ name: "sandbox_list", arguments: {} });
  return (res.structuredContent?.sandboxes ?? []).filter((s) => s.state !== "terminated").map((s) => s.sandbox_id);
}

function errorOf(r) {
  return r.kind === "error" ? { code: r.error.code, message: r.error.message, data: r.error.data } : { result: r.result };
}

async function main() {
  const report = {};
  const { client, rawDispatch, version } = await connect(spec.token);
  report.era = client.getProtocolEra();
  report.version = version;
  report.extension = client.getServerCapabilities()?.extensions?.["io.modelcontextprotocol/tasks"] ?? null;
  const session = createTaskSessionFromClient(client, {
    endpointId: `mcp-sandboxd-${spec.type}`,
    rawDispatch,
    v2RequestFraming: { protocolVersion: version, clientInfo, clientCapabilities: {} },
  });

  // A short run_code: a task, settled by polling, 42 in its result.
  const short = await session.callTool("run_code", { language: "python", code: "print(6*7)" });
  report.short = { kind: short.kind, task_id: short.handle?.taskId };
  const shortEvents = [];
  const settled = await short.settle({ onEvent: (e) => shortEvents.push(e.type === "task" ? e.task.status : `outcome:${e.outcome.status}`) });
  report.short.events = shortEvents;
  report.short.status = settled.outcome.status;
  report.short.result = settled.outcome.result;

  // The 90 s program: a task, polled while it works, its process seen.
  const code = `import subprocess\nsubprocess.run(["sleep", "${marker}"])\nprint("not cancelled")\n`;
  const started = Date.now();
  const long = await session.callTool("run_code", { language: "python", code });
  report.long = { kind: long.kind, task_id: long.handle?.taskId, polls: [] };
  const ctl = session.task(long.handle.taskId);
  for (let i = 0; i < 60; i++) {
    const snap = await ctl.snapshot();
    report.long.polls.push(snap.status);
    report.long.poll_interval_ms = snap.suggestedPollIntervalMs ?? snap.pollInterval;
    report.long.ttl_ms = snap.ttl;
    if (snap.status !== "working") break;
    if ((report.long.procs_working = markerProcs()) > 0 && report.long.polls.length >= 3) break;
    await sleep(1000);
  }
  report.long.sandboxes_working = await sandboxes(client);

  // Another key sees nothing of it, and cannot cancel it.
  if (spec.foreign) {
    const other = await connect(spec.foreign);
    report.foreign = {
      get: errorOf(await other.rawDispatch({ method: "tasks/get", params: framed(other.version, { taskId: long.handle.taskId }) })),
      cancel: errorOf(await other.rawDispatch({ method: "tasks/cancel", params: framed(other.version, { taskId: long.handle.taskId }) })),
    };
    // Its own task runs as that key (the test reads the audit log), and
    // this key sees nothing of it either.
    const otherSession = createTaskSessionFromClient(other.client, {
      endpointId: `mcp-sandboxd-${spec.type}-other`,
      rawDispatch: other.rawDispatch,
      v2RequestFraming: { protocolVersion: other.version, clientInfo, clientCapabilities: {} },
    });
    const theirs = await otherSession.callTool("run_code", { language: "python", code: "print('other key')" });
    const theirOutcome = (await theirs.settle()).outcome;
    report.foreign.own = { kind: theirs.kind, status: theirOutcome.status, stdout: theirOutcome.result?.structuredContent?.stdout };
    report.foreign.theirs_here = errorOf(await rawDispatch({ method: "tasks/get", params: framed(version, { taskId: theirs.handle.taskId }) }));
    await otherSession.close();
    await other.client.close();
    report.foreign.after = (await ctl.snapshot()).status;
  }

  // Cancelled: the status says so, the process and the sandbox go.
  await long.cancel();
  const cancelledAt = Date.now();
  report.long.after_cancel = (await ctl.snapshot()).status;
  for (;;) {
    report.long.procs_after = markerProcs();
    report.long.sandboxes_after = await sandboxes(client);
    if ((report.long.procs_after === 0 && report.long.sandboxes_after.length === 0) || Date.now() - cancelledAt > 60_000) break;
    await sleep(200);
  }
  report.long.gone_ms = Date.now() - cancelledAt;
  report.long.elapsed_ms = Date.now() - started;
  report.long.outcome = (await long.result()).status;

  // Bad requests: JSON-RPC errors with our code, naming the field.
  const bad = async (method, params, declare = true) => errorOf(await rawDispatch({ method, params: framed(version, params, declare) }));
  report.invalid = {
    missing: await bad("tasks/get", {}),
    number: await bad("tasks/get", { taskId: 42 }),
    empty: await bad("tasks/get", { taskId: "" }),
    long: await bad("tasks/get", { taskId: "x".repeat(300) }),
    unknown: await bad("tasks/get", { taskId: "task-00000000-0000-4000-8000-000000000000" }),
    update: await bad("tasks/update", { taskId: long.handle.taskId }),
    undeclared: await bad("tasks/get", { taskId: long.handle.taskId }, false),
  };

  await session.close();

  // A client without the extension: today's synchronous result.
  const plain = await client.callTool({ name: "run_code", arguments: { language: "python", code: "print(6*7)" } });
  report.plain = { keys: Object.keys(plain).sort(), stdout: plain.structuredContent?.stdout, text: plain.content?.[1]?.text };
  await client.close();
  report.errors = errors;
  return report;
}

main().then(
  (r) => {
    process.stdout.write(JSON.stringify(r));
    process.exit(0);
  },
  (e) => {
    process.stdout.write(JSON.stringify({ fatal: String(e?.stack ?? e), errors }));
    process.exit(1);
  },
);
