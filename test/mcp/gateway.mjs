// Black-box MCP client for test/e2e's TestGatewayMCP: drives a gateway's
// /mcp (mcp-sandboxd gateway) with the official TypeScript SDK, which
// validates every tool's output schema and structured result, and prints
// one JSON report on stdout.
//
//   node gateway.mjs <spec.json>
//
// spec: {"url", "token", "calls": [{"name", "args"}]} makes the calls in
// order in one session; an argument whose value is "$sandbox" is the
// sandbox_id the session's last sandbox_create answered; a call with
// "progress": true asks for progress notifications. The report has the
// tools listed and each call's {ms, progress [{ms, message}], isError,
// text, structured}. With
// "stdio": {command, args, env} instead of url, the session goes through
// that command (mcp-sandboxd stdio --url GATEWAY).
// spec: {"bench": {"a": {url, token}, "b": {url, token}, "sandbox_id", "n"}}
// makes n exec_command calls on each of two sessions, alternately, and
// reports each one's durations in milliseconds (a and b).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const spec = JSON.parse(process.argv[2]);
const errors = [];

async function connect(url, token, stdio) {
  const client = new Client({ name: "mcp-sandboxd-gateway-blackbox", version: "1.0.0" });
  client.onerror = (e) => errors.push(String(e));
  if (stdio) {
    const t = new StdioClientTransport({ command: stdio.command, args: stdio.args, env: stdio.env, stderr: "pipe" });
    await client.connect(t);
    t.stderr?.on("data", (d) => process.stderr.write(d));
    return client;
  }
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  return client;
}

const timeout = { timeout: 300_000 };

async function calls() {
  const client = await connect(spec.url, spec.token, spec.stdio);
  const report = { server: client.getServerVersion() };
  report.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  report.results = [];
  let sandbox = "";
  for (const c of spec.calls) {
    const args = Object.fromEntries(Object.entries(c.args || {}).map(([k, v]) => [k, v === "$sandbox" ? sandbox : v]));
    const progress = [];
    const t0 = performance.now();
    const opts = c.progress ? { ...timeout, onprogress: (p) => progress.push({ ms: performance.now() - t0, message: p.message ?? "" }) } : timeout;
    const res = await client.callTool({ name: c.name, arguments: args }, undefined, opts);
    const ms = performance.now() - t0;
    if (c.name === "sandbox_create" && !res.isError) sandbox = res.structuredContent.sandbox_id;
    report.results.push({ name: c.name, args, ms, progress, isError: !!res.isError, text: res.content?.[0]?.text ?? "", structured: res.structuredContent ?? null });
  }
  await client.close();
  report.errors = errors;
  return report;
}

async function bench() {
  const b = spec.bench;
  const a = await connect(b.a.url, b.a.token);
  const o = await connect(b.b.url, b.b.token);
  const report = { a: [], b: [] };
  const args = { sandbox_id: b.sandbox_id, command: "true" };
  for (let i = 0; i < b.n; i++) {
    for (const [name, client] of [["a", a], ["b", o]]) {
      const t0 = performance.now();
      const res = await client.callTool({ name: "exec_command", arguments: args }, undefined, timeout);
      report[name].push(performance.now() - t0);
      if (res.isError) throw new Error(`exec_command through ${name}: ${res.content?.[0]?.text}`);
    }
  }
  await a.close();
  await o.close();
  report.errors = errors;
  return report;
}

try {
  const report = spec.bench ? await bench() : await calls();
  process.stdout.write(JSON.stringify(report) + "\n");
  process.exit(0);
} catch (e) {
  process.stdout.write(JSON.stringify({ fatal: String(e && e.stack || e), errors }) + "\n");
  process.exit(1);
}
