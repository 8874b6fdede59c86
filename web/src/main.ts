// The mcp-sandboxd web editor: sandboxes, a /workspace file tree, Monaco
// tabs, live stdout/stderr, an xterm.js terminal, run history. Everything
// goes through the daemon's public API (api.ts); nothing here is trusted by
// the daemon, which authenticates and checks every request itself.
import './style.css';
import '@xterm/xterm/css/xterm.css';
import * as monaco from 'monaco-editor/editor/editor.api.js';
// Editor features (find, folding, suggest, multi-cursor, …) and Monarch
// tokenizers of common languages; no language-service workers.
import 'monaco-editor/features/register.all.js';
import 'monaco-editor/languages/definitions/python/register.js';
import 'monaco-editor/languages/definitions/javascript/register.js';
import 'monaco-editor/languages/definitions/typescript/register.js';
import 'monaco-editor/languages/definitions/go/register.js';
import 'monaco-editor/languages/definitions/rust/register.js';
import 'monaco-editor/languages/definitions/cpp/register.js';
import 'monaco-editor/languages/definitions/java/register.js';
import 'monaco-editor/languages/definitions/shell/register.js';
import 'monaco-editor/languages/definitions/ruby/register.js';
import 'monaco-editor/languages/definitions/markdown/register.js';
import 'monaco-editor/languages/definitions/yaml/register.js';
import 'monaco-editor/languages/definitions/ini/register.js';
import 'monaco-editor/languages/definitions/dockerfile/register.js';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import { api, APIError, initSession, lineData, ndjson, request, socket, type AutofixLine, type AutofixResult, type BuildLine, type Event as SandboxEvent, type ExecExit, type ExecLine,
  type FileEntry, type RunMeta, type RunReplay, type RunResult, type Sandbox, type TerminalMessage } from './api';

// Monaco's one worker (diffs, links), bundled beside app.js.
(self as any).MonacoEnvironment = { getWorkerUrl: () => '/assets/editor.worker.js' };

const $ = <T extends HTMLElement = HTMLElement>(id: string) => document.getElementById(id) as T;
const WS = '/workspace';

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, ...kids: (Node | string)[]): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  e.append(...kids);
  return e;
}

function status(msg: string, error = false) {
  const s = $('status-msg');
  s.textContent = msg;
  s.classList.toggle('error', error);
}

function report(e: unknown) {
  status(e instanceof APIError ? `${e.code}: ${e.message}` : String(e), true);
}

function fmtBytes(n: number): string {
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + ' GiB';
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + ' MiB';
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(0) + ' KiB';
  return n + ' B';
}

// ---- state ----

interface Tab { path: string; model: monaco.editor.ITextModel; saved: number; tab: HTMLElement; timer?: number }
const state = {
  sandbox: null as Sandbox | null,
  tabs: new Map<string, Tab>(),
  active: '' as string,
  features: {} as Record<string, boolean>,
  running: false,
  lastCPU: null as null | { t: number; s: number },
};

// ---- theme ----

function applyTheme(theme: string) {
  document.body.classList.toggle('dark', theme === 'dark');
  document.body.classList.toggle('light', theme !== 'dark');
  monaco.editor.setTheme(theme === 'dark' ? 'vs-dark' : 'vs');
  if (term) term.options.theme = theme === 'dark' ? { background: '#1e1e1e' } : { background: '#ffffff', foreground: '#222222', cursor: '#222222' };
  localStorage.setItem('theme', theme);
}

// ---- editor ----

const editor = monaco.editor.create($('editor'), {
  automaticLayout: true, theme: 'vs-dark', fontSize: 14, minimap: { enabled: false }, model: null,
});
editor.addCommand(monaco.KeyMod.CtrlCmd | monaco.KeyCode.KeyS, () => void saveActive());
editor.addCommand(monaco.KeyMod.CtrlCmd | monaco.KeyCode.Enter, () => void runProject());

function languageOf(path: string): string {
  const ext = path.slice(path.lastIndexOf('.')).toLowerCase();
  for (const l of monaco.languages.getLanguages()) {
    if (l.extensions?.some((e) => e.toLowerCase() === ext)) return l.id;
    if (l.filenames?.includes(path.split('/').pop()!)) return l.id;
  }
  return 'plaintext';
}

const AUTOSAVE_MS = 1500;

function markDirty(t: Tab) {
  const dirty = t.model.getAlternativeVersionId() !== t.saved;
  t.tab.classList.toggle('dirty', dirty);
  t.tab.querySelector('.mark')!.textContent = dirty ? '●' : '';
}

async function openFile(path: string) {
  if (!state.sandbox) return;
  let t = state.tabs.get(path);
  if (!t) {
    try {
      const r = await api.read(state.sandbox.sandbox_id, path);
      const text = await r.text();
      const model = monaco.editor.createModel(text, languageOf(path));
      const tab = el('div', { class: 'tab', 'data-path': path, title: path },
        el('span', { class: 'name' }, path.replace(WS + '/', '')), el('span', { class: 'mark' }), el('button', { class: 'close', title: 'Close' }, '×'));
      const nt: Tab = { path, model, saved: model.getAlternativeVersionId(), tab };
      tab.addEventListener('click', (ev) => {
        if ((ev.target as HTMLElement).classList.contains('close')) { ev.stopPropagation(); closeTab(path); } else activate(path);
      });
      model.onDidChangeContent(() => {
        markDirty(nt);
        clearTimeout(nt.timer);
        nt.timer = window.setTimeout(() => void save(nt), AUTOSAVE_MS);
      });
      $('tabs').append(tab);
      state.tabs.set(path, nt);
      t = nt;
    } catch (e) { report(e); return; }
  }
  activate(path);
}

function activate(path: string) {
  const t = state.tabs.get(path);
  if (!t) return;
  state.active = path;
  editor.setModel(t.model);
  for (const x of state.tabs.values()) x.tab.classList.toggle('active', x === t);
  for (const li of document.querySelectorAll('#file-tree li')) li.classList.toggle('active', (li as HTMLElement).dataset.path === path);
  editor.focus();
}

function closeTab(path: string) {
  const t = state.tabs.get(path);
  if (!t) return;
  if (t.model.getAlternativeVersionId() !== t.saved) void save(t);
  t.tab.remove();
  t.model.dispose();
  state.tabs.delete(path);
  if (state.active === path) {
    const next = [...state.tabs.keys()].pop();
    if (next) activate(next); else { state.active = ''; editor.setModel(null); }
  }
}

async function save(t: Tab) {
  if (!state.sandbox) return;
  clearTimeout(t.timer);
  const version = t.model.getAlternativeVersionId();
  if (version === t.saved) return;
  try {
    await api.write(state.sandbox.sandbox_id, t.path, t.model.getValue());
    t.saved = version;
    markDirty(t);
    status(`saved ${t.path}`);
  } catch (e) { report(e); }
}

async function saveActive() {
  const t = state.tabs.get(state.active);
  if (t) await save(t);
}

async function saveAll() {
  await Promise.all([...state.tabs.values()].map(save));
}

function closeAllTabs() {
  for (const p of [...state.tabs.keys()]) {
    const t = state.tabs.get(p)!;
    clearTimeout(t.timer);
    t.tab.remove();
    t.model.dispose();
  }
  state.tabs.clear();
  state.active = '';
  editor.setModel(null);
}

// ---- sandboxes ----

async function refreshSandboxes() {
  try {
    const list = await api.sandboxes();
    const ul = $('sandbox-list');
    ul.replaceChildren(...list.map((s) => {
      const li = el('li', { 'data-id': s.sandbox_id, class: s.sandbox_id === state.sandbox?.sandbox_id ? 'active' : '' },
        el('span', { class: `state ${s.state}` }, s.state),
        el('span', { class: 'lang' }, s.language || s.image),
        el('span', { class: 'id' }, s.sandbox_id),
        // An admin's session lists every tenant's sandboxes: say whose.
        ...(s.tenant ? [el('span', { class: 'tenant', title: 'Tenant' }, s.tenant)] : []),
        el('button', { class: 'terminate', title: 'Terminate' }, '✕'),
        el('span', { class: 'limits' }, `limits ${fmtBytes(s.limits.memory_bytes)} · ${s.limits.cpus} CPU · net ${s.network}`),
        el('span', { class: 'usage' }));
      li.addEventListener('click', (ev) => {
        if ((ev.target as HTMLElement).classList.contains('terminate')) { ev.stopPropagation(); void terminate(s.sandbox_id); } else void select(s);
      });
      return li;
    }));
    if (state.sandbox && !list.some((s) => s.sandbox_id === state.sandbox!.sandbox_id)) void select(null);
  } catch (e) { report(e); }
}

async function terminate(id: string) {
  try {
    await api.terminate(id);
    status(`terminated ${id}`);
    if (state.sandbox?.sandbox_id === id) await select(null);
    await refreshSandboxes();
  } catch (e) { report(e); }
}

async function select(s: Sandbox | null) {
  if (state.sandbox?.sandbox_id === s?.sandbox_id) return;
  await saveAll();
  closeAllTabs();
  state.sandbox = s;
  state.lastCPU = null;
  for (const li of document.querySelectorAll('#sandbox-list li')) li.classList.toggle('active', (li as HTMLElement).dataset.id === s?.sandbox_id);
  for (const b of ['run', 'rebuild', 'export']) $<HTMLButtonElement>(b).disabled = !s;
  $<HTMLButtonElement>('autofix').disabled = !s || !state.features.autofix;
  $('status-sandbox').textContent = s ? `sandbox ${s.sandbox_id} (${s.language})` : 'no sandbox';
  $('status-usage').textContent = '';
  await refreshFiles();
  openTerminal();
}

async function createSandbox(ev: Event) {
  ev.preventDefault();
  const req: Record<string, unknown> = { language: $<HTMLSelectElement>('new-sandbox-lang').value, network: $<HTMLSelectElement>('new-sandbox-net').value };
  const mem = $<HTMLInputElement>('new-sandbox-mem').value, cpus = $<HTMLInputElement>('new-sandbox-cpus').value;
  if (mem) req.memory_mb = Number(mem);
  if (cpus) req.cpus = Number(cpus);
  const btn = $<HTMLButtonElement>('create-sandbox');
  btn.disabled = true;
  status(`creating a ${req.language} sandbox…`);
  try {
    const s = await api.createSandbox(req);
    status(`created ${s.sandbox_id}`);
    await refreshSandboxes();
    await select(s);
  } catch (e) { report(e); } finally { btn.disabled = false; }
}

// ---- files ----

let newKind: 'file' | 'dir' = 'file';

async function refreshFiles() {
  const ul = $('file-tree');
  if (!state.sandbox) { ul.replaceChildren(); return; }
  try {
    const entries = (await api.list(state.sandbox.sandbox_id)).sort((a, b) => a.path.localeCompare(b.path));
    ul.replaceChildren(...entries.map(treeItem));
  } catch (e) { report(e); }
}

function treeItem(f: FileEntry): HTMLElement {
  const rel = f.path.replace(WS + '/', '');
  const depth = rel.split('/').length - 1;
  const li = el('li', { 'data-path': f.path, 'data-type': f.type, class: f.path === state.active ? 'active' : '', style: `padding-left:${0.5 + depth}em` },
    el('span', { class: 'icon' }, f.type === 'dir' ? '▸' : '·'),
    el('span', { class: 'name' }, rel.split('/').pop()!),
    el('span', { class: 'actions' },
      el('button', { class: 'rename', title: 'Rename' }, '✎'),
      ...(f.type === 'file' ? [el('button', { class: 'download', title: 'Download' }, '⤓')] : []),
      el('button', { class: 'delete', title: 'Delete' }, '🗑')));
  li.addEventListener('click', (ev) => {
    const c = (ev.target as HTMLElement).classList;
    if (c.contains('rename')) void renamePath(f.path);
    else if (c.contains('download')) void download(f.path);
    else if (c.contains('delete')) void deletePath(f.path);
    else if (f.type === 'file') void openFile(f.path);
  });
  return li;
}

function askName(kind: 'file' | 'dir') {
  newKind = kind;
  const form = $<HTMLFormElement>('new-name-form');
  form.hidden = false;
  const input = $<HTMLInputElement>('new-file-name');
  input.placeholder = kind === 'file' ? 'new file, e.g. main.py' : 'new folder, e.g. src';
  input.value = '';
  input.focus();
}

async function createPath(ev: Event) {
  ev.preventDefault();
  const input = $<HTMLInputElement>('new-file-name');
  const name = input.value.trim();
  $<HTMLFormElement>('new-name-form').hidden = true;
  if (!name || !state.sandbox) return;
  const path = name.startsWith('/') ? name : `${WS}/${name}`;
  try {
    if (newKind === 'file') await api.write(state.sandbox.sandbox_id, path, '');
    else await execOK(['mkdir', '-p', '--', path]);
    await refreshFiles();
    if (newKind === 'file') await openFile(path);
  } catch (e) { report(e); }
}

/** Runs a command through the exec API and fails on a non-zero exit. */
async function execOK(argv: string[]) {
  const r = await api.exec(state.sandbox!.sandbox_id, argv);
  let exit = null as ExecExit | null, err = '';
  await ndjson<ExecLine>(r, (l) => { if (l.exit) exit = l.exit; if (l.stream === 'stderr') err += lineData(l); if (l.error) err += l.error.message; });
  if (!exit || exit.exit_code !== 0) throw new Error(`${argv[0]}: ${err || 'failed'}`);
}

async function renamePath(path: string) {
  const to = prompt(`Rename ${path} to`, path);
  if (!to || to === path || !state.sandbox) return;
  try {
    // mv in the sandbox: one atomic rename(2), also of directories.
    await execOK(['mv', '-T', '--', path, to]);
    const t = state.tabs.get(path);
    if (t) closeTab(path);
    await refreshFiles();
  } catch (e) { report(e); }
}

async function deletePath(path: string) {
  if (!state.sandbox || !confirm(`Delete ${path}?`)) return;
  try {
    await api.remove(state.sandbox.sandbox_id, path);
    if (state.tabs.has(path)) { const t = state.tabs.get(path)!; t.saved = t.model.getAlternativeVersionId(); closeTab(path); }
    await refreshFiles();
  } catch (e) { report(e); }
}

function saveBlob(blob: Blob, name: string) {
  const a = el('a', { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

async function download(path: string) {
  try {
    const r = await api.read(state.sandbox!.sandbox_id, path);
    saveBlob(await r.blob(), path.split('/').pop()!);
  } catch (e) { report(e); }
}

async function upload(files: FileList) {
  if (!state.sandbox) return;
  try {
    for (const f of files) await api.write(state.sandbox.sandbox_id, `${WS}/${f.name}`, f);
    status(`uploaded ${files.length} file(s)`);
    await refreshFiles();
  } catch (e) { report(e); }
}

// ---- output ----

function showPane(id: string) {
  for (const b of document.querySelectorAll<HTMLElement>('#bottom-tabs button')) b.classList.toggle('active', b.dataset.pane === id);
  for (const p of document.querySelectorAll('#bottom .pane')) p.classList.toggle('active', p.id === id);
  if (id === 'terminal-pane') {
    fit.fit();
    // The shell exited (or the connection dropped): start a new one.
    if (state.sandbox && (!termSocket || termSocket.readyState >= WebSocket.CLOSING)) openTerminal();
    term.focus();
  }
}

function append(id: string, text: string, cls?: string) {
  const pre = $(id);
  if (cls) pre.append(el('span', { class: cls }, text)); else pre.append(text);
  pre.scrollTop = pre.scrollHeight;
}

function terminationLine(r: { exit_code: number; termination: { cause: string; detail?: string; signal?: string } }, ms: number): string {
  const t = r.termination;
  return `\n[${t.cause}${t.signal ? ' ' + t.signal : ''}, exit code ${r.exit_code}, ${ms} ms${t.detail ? ': ' + t.detail : ''}]\n`;
}

// Paths run_code does not need to be sent: outputs, dependencies and build
// trees (they stay in the sandbox's /workspace as they are).
const SKIP = /(^|\/)(\.[^/]*|output|node_modules|__pycache__|target|build|dist|vendor)(\/|$)/;

/** The project's files for run_code: the text files under /workspace. The
 * run uses the same sandbox, so what is left out (binary files, SKIP) is
 * still there, untouched: run_code's files are text, and sending a binary
 * file as text would corrupt it. */
async function projectFiles(): Promise<Record<string, string>> {
  const id = state.sandbox!.sandbox_id;
  const entries = await api.list(id);
  const files: Record<string, string> = {};
  const utf8 = new TextDecoder('utf-8', { fatal: true });
  const wanted = entries.filter((f) => f.type === 'file' && f.size <= 1 << 20 && !SKIP.test(f.path.slice(WS.length + 1))).slice(0, 500);
  await Promise.all(wanted.map(async (f) => {
    const rel = f.path.slice(WS.length + 1);
    const open = state.tabs.get(f.path);
    if (open) { files[rel] = open.model.getValue(); return; }
    try { files[rel] = utf8.decode(await (await api.read(id, f.path)).arrayBuffer()); } catch { /* binary: left in place */ }
  }));
  return files;
}

async function runProject() {
  const s = state.sandbox;
  if (!s || state.running) return;
  state.running = true;
  $<HTMLButtonElement>('run').disabled = true;
  try {
    await saveAll();
    const files = await projectFiles();
    const entry = state.active && files[state.active.replace(WS + '/', '')] !== undefined ? state.active.replace(WS + '/', '') : undefined;
    for (const id of ['stdout', 'stderr']) $(id).replaceChildren();
    showPane('output-pane');
    status('running…');
    const r = await api.runStream({ language: s.language, sandbox_id: s.sandbox_id, files, entrypoint: entry });
    let result = null as RunResult | null;
    await ndjson<ExecLine>(r, (l) => {
      if (l.stream) append(l.stream, lineData(l), l.stream === 'stderr' ? 'err' : undefined);
      if (l.result) result = l.result;
      if (l.error) append('stderr', `\n[error] ${l.error.code}: ${l.error.message}\n`, 'cause');
    });
    if (result) showResult(result);
    await refreshRuns();
    await refreshFiles();
  } catch (e) { report(e); } finally {
    state.running = false;
    $<HTMLButtonElement>('run').disabled = !state.sandbox;
  }
}

/** Re-renders the panels from the result: build steps (install, compile)
 * in the Build panel, the run step in stdout/stderr, the cause at the end. */
function showResult(r: RunResult) {
  const build = r.steps.filter((st) => st.name !== 'run');
  const run = r.steps.find((st) => st.name === 'run');
  if (build.length) {
    const pre = $('build-output');
    pre.replaceChildren();
    for (const st of build) {
      append('build-output', `$ ${st.name}\n${st.stdout}`);
      append('build-output', st.stderr, 'err');
      append('build-output', terminationLine(st, st.duration_ms), 'cause');
    }
    $('stdout').replaceChildren(run ? run.stdout : '');
    $('stderr').replaceChildren(el('span', { class: 'err' }, run ? run.stderr : ''));
    if (!run) showPane('build-pane');
  }
  append('stderr', terminationLine(r, r.duration_ms), r.success ? 'cause ok' : 'cause');
  status(`run ${r.run_id}: ${r.success ? 'success' : 'failed'} (exit ${r.exit_code}, ${r.duration_ms} ms)`, !r.success);
}

async function rebuild() {
  const s = state.sandbox;
  if (!s) return;
  const btn = $<HTMLButtonElement>('rebuild');
  btn.disabled = true;
  $('build-output').replaceChildren();
  showPane('build-pane');
  append('build-output', `$ build image ${s.image || s.language}\n`);
  try {
    const r = await api.buildImage(s.image || s.language);
    await ndjson<BuildLine>(r, (l) => {
      if (l.log !== undefined) append('build-output', l.log + '\n');
      if (l.image) append('build-output', `[image ${l.image.name} ${String(l.image.digest).slice(0, 12)} ready]\n`, 'cause ok');
      if (l.error) append('build-output', `[error] ${l.error.code}: ${l.error.message}\n`, 'cause');
    });
  } catch (e) { report(e); } finally { btn.disabled = false; }
}

async function exportWorkspace() {
  const s = state.sandbox;
  if (!s) return;
  try {
    await saveAll();
    const art = await api.exportWorkspace(s.sandbox_id);
    // A plain navigation: the browser downloads with the cookie (a GET).
    const a = el('a', { href: `/v1/artifacts/${encodeURIComponent(art.artifact_id)}`, download: `${s.sandbox_id}-workspace.tar.gz` });
    document.body.append(a);
    a.click();
    a.remove();
    status(`exported ${fmtBytes(art.size)} (sha256 ${art.sha256.slice(0, 12)}…)`);
  } catch (e) { report(e); }
}

/** AutoFix: POST /v1/autofix (the loop runs in a sandbox of its own) and
 * show its NDJSON events as they come — each attempt, each fix — then the
 * result; a fixed program's files are written back into this sandbox and
 * its open tabs. The stream's shape follows the autofix branch's
 * AutofixEvent ({type: attempt|fix|result|error, attempt, result, error}). */
async function autofix() {
  const s = state.sandbox;
  if (!s || !state.features.autofix) return;
  const btn = $<HTMLButtonElement>('autofix');
  btn.disabled = true;
  try {
    await saveAll();
    const files = await projectFiles();
    const entry = state.active ? state.active.slice(WS.length + 1) : undefined;
    for (const id of ['stdout', 'stderr']) $(id).replaceChildren();
    showPane('output-pane');
    status('autofix running…');
    const r = await request('POST', '/v1/autofix', { language: s.language, files, entrypoint: files[entry ?? ''] !== undefined ? entry : undefined });
    let result = null as AutofixResult | null;
    await ndjson<AutofixLine>(r, (l) => {
      const a = l.attempt;
      if (l.type === 'attempt' && a) {
        append('stdout', `attempt ${a.attempt}: ${a.success ? 'success' : 'failed'} (exit ${a.exit_code}, ${a.termination?.cause ?? ''}, ${a.duration_ms} ms)\n`);
        if (a.error_excerpt) append('stderr', `attempt ${a.attempt}:\n${a.error_excerpt}\n`, 'err');
      }
      if (l.type === 'fix' && a) append('stdout', `  fix${a.provider ? ' by ' + a.provider : ''}: ${a.refused ? 'refused: ' + a.refused : a.fix_summary ?? ''}\n`, 'cause');
      if (l.type === 'result') result = l.result ?? null;
      if (l.type === 'error' && l.error) append('stderr', `[error] ${l.error.code}: ${l.error.message}\n`, 'cause');
    });
    await refreshRuns();
    if (!result) return;
    append('stdout', `\n[${result.status}${result.stop_reason ? ': ' + result.stop_reason : ''}, ${result.attempts} attempt(s)]\n`, result.success ? 'cause ok' : 'cause');
    if (result.success && result.files) await applyFiles(result.files);
    if (result.run_id) await openRun(result.run_id);
    status(`autofix: ${result.status}`, !result.success);
  } catch (e) { report(e); } finally { btn.disabled = !state.sandbox || !state.features.autofix; }
}

/** Writes files (relative to /workspace) into the sandbox and open tabs. */
async function applyFiles(files: Record<string, string>) {
  const s = state.sandbox!;
  for (const [rel, text] of Object.entries(files)) {
    const path = `${WS}/${rel}`;
    const t = state.tabs.get(path);
    if (t && t.model.getValue() === text) continue;
    await api.write(s.sandbox_id, path, text);
    if (t) { t.model.setValue(text); t.saved = t.model.getAlternativeVersionId(); markDirty(t); }
  }
  await refreshFiles();
}

// ---- runs ----

async function refreshRuns() {
  try {
    const runs = await api.runs();
    $('runs-list').replaceChildren(...runs.map((m) => {
      const li = el('li', { 'data-run': m.runId, class: m.success ? 'ok' : 'failed' },
        el('span', { class: 'badge' }, m.success ? '✓' : '✗'),
        el('span', { class: 'id' }, m.runId),
        el('span', { class: 'meta' }, `${m.kind} ${m.language} · exit ${m.exitCode} · ${m.durationMs} ms`));
      li.addEventListener('click', () => void openRun(m.runId));
      return li;
    }));
  } catch (e) { report(e); }
}

let recordEditors: monaco.editor.IEditor[] = [];

async function openRun(id: string) {
  try {
    const rec = await api.run(id);
    for (const e of recordEditors) e.dispose();
    recordEditors = [];
    const m = rec.metadata;
    const box = $('run-record');
    const files = Object.keys(rec.code).sort();
    const plain = files.filter((f) => !/^attempt_\d+\//.test(f));
    box.replaceChildren(
      el('h3', {}, `Run ${m.runId} — ${m.success ? 'success' : 'failure'}`, ...replayControls(m)),
      el('div', { id: 'replay-diff' }),
      el('p', { class: 'meta' }, `${m.kind} · ${m.language} · exit ${m.exitCode} · ${m.termination.cause} · ${m.durationMs} ms · sandbox ${m.sandboxId}${m.entrypoint ? ' · ' + m.entrypoint : ''}${m.error ? ' · ' + m.error : ''}`),
      el('h4', {}, 'Code snapshot'),
      ...plain.map((f) => el('div', { class: 'snapshot', 'data-file': f }, el('div', { class: 'fname' }, f), el('div', { class: 'code' }))),
      el('h4', {}, 'stdout'), el('pre', { class: 'log' }, rec.stdout),
      el('h4', {}, 'stderr'), el('pre', { class: 'log err' }, rec.stderr),
    );
    const dark = document.body.classList.contains('dark');
    for (const div of box.querySelectorAll<HTMLElement>('.snapshot')) {
      const f = div.dataset.file!;
      const text = rec.code[f];
      const code = div.querySelector<HTMLElement>('.code')!;
      code.style.height = `${Math.min(20, text.split('\n').length + 1) * 19 + 4}px`;
      recordEditors.push(monaco.editor.create(code, {
        value: text, language: languageOf(f), readOnly: true, minimap: { enabled: false }, automaticLayout: true,
        scrollBeyondLastLine: false, theme: dark ? 'vs-dark' : 'vs',
      }));
    }
    // Autofix: each attempt's snapshot against the one before, side by side.
    const attempts = [...new Set(files.map((f) => /^attempt_(\d+)\//.exec(f)?.[1]).filter(Boolean))].map(Number).sort((a, b) => a - b);
    for (const n of attempts) {
      const prefix = `attempt_${n}/`;
      const info = rec.attempts.find((a) => a.attempt === n);
      box.append(el('h4', {}, `Attempt ${n}${info ? ` — exit ${info.exit_code}, ${info.duration_ms} ms` : ''}`));
      if (info?.error) box.append(el('pre', { class: 'log err' }, info.error));
      for (const f of files.filter((x) => x.startsWith(prefix))) {
        const name = f.slice(prefix.length);
        const before = rec.code[`attempt_${n - 1}/${name}`] ?? rec.code[name] ?? '';
        const div = el('div', { class: 'diff', 'data-file': f }, el('div', { class: 'fname' }, name), el('div', { class: 'code' }));
        box.append(div);
        const code = div.querySelector<HTMLElement>('.code')!;
        code.style.height = '240px';
        const d = monaco.editor.createDiffEditor(code, { readOnly: true, automaticLayout: true, renderSideBySide: true, theme: dark ? 'vs-dark' : 'vs' });
        d.setModel({ original: monaco.editor.createModel(before, languageOf(name)), modified: monaco.editor.createModel(rec.code[f], languageOf(name)) });
        recordEditors.push(d);
      }
    }
    showPane('record-pane');
  } catch (e) { report(e); }
}

// ---- replay ----

/** The record header's replay parts: a Replay button for a run_code
 * record, and the run a replay replayed, as a link. */
function replayControls(m: RunMeta): HTMLElement[] {
  const out: HTMLElement[] = [];
  if (m.replayOf) {
    const a = el('a', { href: '#', class: 'replay-of' }, ` replay of ${m.replayOf}`);
    a.addEventListener('click', (ev) => { ev.preventDefault(); void openRun(m.replayOf!); });
    out.push(a);
  }
  if (m.kind === 'run') {
    const b = el('button', { id: 'replay-run', title: 'Run it again in a fresh sandbox (same image digest, inputs and limits) and show what changed' }, '↻ Replay');
    b.addEventListener('click', () => void replayRun(m.runId, b as HTMLButtonElement));
    out.push(b);
  }
  return out;
}

/** POST /v1/runs/{id}/replay and show the diff above the record. */
async function replayRun(id: string, button: HTMLButtonElement) {
  button.disabled = true;
  status(`replaying run ${id}…`);
  try {
    const rep = await api.replay(id);
    showReplayDiff(rep);
    status(`run ${id} replayed as ${rep.replay.run_id}: ${rep.diff.same ? 'same' : 'differs'}`, !rep.diff.same);
    await refreshRuns();
  } catch (e) { report(e); } finally { button.disabled = false; }
}

/** A unified diff, its lines classed by their first character. */
function udiff(text: string): HTMLElement {
  const pre = el('pre', { class: 'udiff' });
  for (const line of text.replace(/\n$/, '').split('\n')) {
    const cls = line.startsWith('+++') || line.startsWith('---') ? 'hdr' : line.startsWith('@@') ? 'hunk'
      : line.startsWith('+') ? 'add' : line.startsWith('-') ? 'del' : 'ctx';
    pre.append(el('span', { class: cls }, line + '\n'));
  }
  return pre;
}

function showReplayDiff(rep: RunReplay) {
  const d = rep.diff;
  const box = $('replay-diff');
  const link = el('a', { href: '#' }, rep.replay.run_id);
  link.addEventListener('click', (ev) => { ev.preventDefault(); void openRun(rep.replay.run_id); });
  const parts: HTMLElement[] = [el('h4', {}, 'Replay ', link, d.same ? ' — same exit code, output and output files' : ' — differs')];
  if (rep.note) parts.push(el('p', { class: 'meta' }, rep.note));
  if (d.exit_code) parts.push(el('p', { class: 'exit-change' }, `exit code ${d.exit_code.original} → ${d.exit_code.replay}`));
  if (d.stdout) parts.push(udiff(d.stdout));
  if (d.stderr) parts.push(udiff(d.stderr));
  for (const f of d.files ?? []) {
    if (f.binary) {
      const side = (size?: number, sum?: string) => size === undefined ? 'none' : `${size} bytes, sha256 ${sum!.slice(0, 16)}…`;
      parts.push(el('p', { class: 'file-change' }, `output/${f.path} ${f.change} (binary): ${side(f.original_size, f.original_sha256)} → ${side(f.replay_size, f.replay_sha256)}`));
    } else if (f.diff) {
      parts.push(udiff(f.diff));
    }
  }
  box.className = d.same ? 'replay same' : 'replay differs';
  box.replaceChildren(...parts);
}

// ---- terminal ----

const term = new Terminal({ fontSize: 13, cursorBlink: true, convertEol: false });
const fit = new FitAddon();
term.loadAddon(fit);
let termSocket: WebSocket | null = null;
const encoder = new TextEncoder();

function openTerminal() {
  termSocket?.close();
  termSocket = null;
  term.reset();
  const s = state.sandbox;
  if (!s) return;
  try { fit.fit(); } catch { /* pane hidden */ }
  const ws = socket(`/v1/sandboxes/${encodeURIComponent(s.sandbox_id)}/terminal?rows=${term.rows}&cols=${term.cols}&cwd=${WS}`);
  ws.binaryType = 'arraybuffer';
  ws.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      const m = JSON.parse(ev.data) as TerminalMessage;
      if (m.type === 'exit') term.write(`\r\n[exited: ${m.exit_code ?? ''} ${m.termination?.cause ?? m.error?.message ?? ''}]\r\n`);
      return;
    }
    term.write(new Uint8Array(ev.data));
  };
  ws.onclose = () => { if (termSocket === ws) term.write('\r\n[terminal closed]\r\n'); };
  termSocket = ws;
}

term.onData((d) => { if (termSocket?.readyState === WebSocket.OPEN) termSocket.send(encoder.encode(d)); });
term.onResize(({ rows, cols }) => {
  if (termSocket?.readyState === WebSocket.OPEN) termSocket.send(JSON.stringify({ type: 'resize', rows, cols }));
});

// ---- status bar ----

async function pollStatus() {
  try {
    const r = await api.ready();
    const d = $('status-daemon');
    d.textContent = `daemon: ${r.status}`;
    d.className = r.status === 'ready' ? 'ok' : 'error';
  } catch { $('status-daemon').textContent = 'daemon: unreachable'; $('status-daemon').className = 'error'; }
  // Every listed sandbox's usage, in the list (a handful: one GET each).
  const items = [...document.querySelectorAll<HTMLElement>('#sandbox-list li')].slice(0, 20);
  await Promise.all(items.map(async (li) => {
    try {
      const d = await api.sandbox(li.dataset.id!);
      const u = li.querySelector('.usage')!;
      u.textContent = d.usage ? `using ${fmtBytes(d.usage.memory_bytes)} · ${d.usage.cpu_seconds.toFixed(1)} CPU-s · ${d.usage.pids} tasks` : '';
    } catch { /* gone: the events refresh the list */ }
  }));
  const s = state.sandbox;
  if (!s) return;
  try {
    const d = await api.sandbox(s.sandbox_id);
    if (d.usage && state.sandbox?.sandbox_id === s.sandbox_id) {
      const now = performance.now();
      let cpu = '';
      if (state.lastCPU) cpu = ` · CPU ${((100 * (d.usage.cpu_seconds - state.lastCPU.s)) / ((now - state.lastCPU.t) / 1000)).toFixed(0)}%`;
      state.lastCPU = { t: now, s: d.usage.cpu_seconds };
      $('status-usage').textContent = `mem ${fmtBytes(d.usage.memory_bytes)} / ${fmtBytes(d.limits.memory_bytes)}${cpu} · ${d.usage.pids} tasks · disk ${fmtBytes(d.usage.disk_bytes)}`;
    }
  } catch { /* terminated: the events refresh the list */ }
}

function watchEvents() {
  const ws = socket('/v1/events');
  let pending = 0;
  ws.onmessage = (ev) => {
    const e = JSON.parse(ev.data) as SandboxEvent;
    if (e.type === 'state' && !pending) pending = window.setTimeout(() => { pending = 0; void refreshSandboxes(); }, 200);
  };
  ws.onclose = () => setTimeout(watchEvents, 3000);
}

// ---- layout: resizable panels ----

function splitters() {
  for (const s of document.querySelectorAll<HTMLElement>('.vsplit, .hsplit')) {
    const vertical = s.classList.contains('vsplit');
    const target = $(s.dataset.target!);
    const invert = s.dataset.invert === '1';
    s.addEventListener('pointerdown', (down) => {
      down.preventDefault();
      s.setPointerCapture(down.pointerId);
      const start = vertical ? down.clientX : down.clientY;
      const size = vertical ? target.getBoundingClientRect().width : target.getBoundingClientRect().height;
      const move = (ev: PointerEvent) => {
        const delta = (vertical ? ev.clientX : ev.clientY) - start;
        const px = Math.max(60, size + (invert ? -delta : delta));
        target.style.flex = `0 0 ${px}px`;
        if (vertical) target.style.width = `${px}px`; else target.style.height = `${px}px`;
      };
      const up = () => { s.removeEventListener('pointermove', move); s.removeEventListener('pointerup', up); try { fit.fit(); } catch { /* hidden */ } };
      s.addEventListener('pointermove', move);
      s.addEventListener('pointerup', up);
    });
  }
}

// ---- start ----

async function main() {
  await initSession();
  applyTheme(localStorage.getItem('theme') ?? 'dark');
  term.open($('terminal'));
  splitters();
  new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } }).observe($('terminal-pane'));

  $('create-form').addEventListener('submit', (e) => void createSandbox(e));
  $('new-file').addEventListener('click', () => askName('file'));
  $('new-dir').addEventListener('click', () => askName('dir'));
  $('new-name-form').addEventListener('submit', (e) => void createPath(e));
  $('new-file-name').addEventListener('keydown', (e) => { if (e.key === 'Escape') $<HTMLFormElement>('new-name-form').hidden = true; });
  $('refresh-files').addEventListener('click', () => void refreshFiles());
  $('refresh-runs').addEventListener('click', () => void refreshRuns());
  $('run').addEventListener('click', () => void runProject());
  $('rebuild').addEventListener('click', () => void rebuild());
  $('export').addEventListener('click', () => void exportWorkspace());
  $('autofix').addEventListener('click', () => void autofix());
  $('theme').addEventListener('click', () => applyTheme(document.body.classList.contains('dark') ? 'light' : 'dark'));
  $('logout').addEventListener('click', async () => { try { await api.logout(); } finally { location.href = '/login'; } });
  for (const b of document.querySelectorAll<HTMLElement>('#bottom-tabs button')) b.addEventListener('click', () => showPane(b.dataset.pane!));
  const drop = $('files-panel');
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('drop'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('drop'));
  drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('drop'); if (e.dataTransfer?.files.length) void upload(e.dataTransfer.files); });
  window.addEventListener('keydown', (e) => {
    if ((e.ctrlKey || e.metaKey) && e.key === 'Enter') { e.preventDefault(); void runProject(); }
    if ((e.ctrlKey || e.metaKey) && e.key === 's') { e.preventDefault(); void saveActive(); }
  });
  window.addEventListener('beforeunload', (e) => {
    if ([...state.tabs.values()].some((t) => t.model.getAlternativeVersionId() !== t.saved)) e.preventDefault();
  });

  try {
    const sys = await api.system();
    state.features = sys.features;
    const af = $<HTMLButtonElement>('autofix');
    af.title = sys.features.autofix ? 'Run the autofix loop on the project' : 'autofix not available on this daemon';
    $('status-daemon').title = `mcp-sandboxd ${sys.version} (${sys.commit})`;
  } catch (e) { report(e); }
  try {
    const langs = await api.languages();
    $('new-sandbox-lang').replaceChildren(...langs.map((l) => el('option', { value: l.name }, `${l.name} ${l.version}${l.image_ready ? '' : ' (image not built)'}`)));
    const py = langs.find((l) => l.name === 'python');
    if (py) $<HTMLSelectElement>('new-sandbox-lang').value = 'python';
  } catch (e) { report(e); }
  await select(null);
  await Promise.all([refreshSandboxes(), refreshRuns(), pollStatus()]);
  setInterval(() => void pollStatus(), 2000);
  watchEvents();
  document.body.dataset.ready = '1';
}

void main();
