// The daemon's public REST API (the one sandboxctl uses), as the page calls
// it: same-origin requests carrying the HttpOnly session cookie, and the
// session's CSRF token on every state-changing request.

export interface Limits { memory_bytes: number; cpus: number; pids: number; disk_bytes: number }
export interface Usage { memory_bytes: number; cpu_seconds: number; pids: number; disk_bytes: number; oom_kills: number }
export interface Sandbox {
  sandbox_id: string; state: string; language: string; image: string; limits: Limits;
  network: string; created_at: string; labels?: Record<string, string>; usage?: Usage;
}
export interface FileEntry { path: string; type: string; size: number; mode: number; mtime: string }
export interface Termination { cause: string; exit_code?: number; signal?: string; detail?: string }
export interface RunStep { name: string; exit_code: number; stdout: string; stderr: string; termination: Termination; duration_ms: number }
export interface RunResult {
  run_id: string; sandbox_id: string; language: string; success: boolean; steps: RunStep[];
  exit_code: number; stdout: string; stderr: string; termination: Termination; duration_ms: number;
}
export interface RunMeta {
  runId: string; language: string; startTime: string; durationMs: number; exitCode: number;
  success: boolean; kind: string; sandboxId: string; attempts: number; entrypoint?: string;
  termination: { cause: string; detail?: string }; error?: string;
}
export interface Attempt { attempt: number; error: string; fix: string; exit_code: number; duration_ms: number }
export interface RunRecord {
  metadata: RunMeta; stdout: string; stderr: string; attempts: Attempt[];
  code: Record<string, string>; code_truncated?: boolean;
}
export interface Language { name: string; version: string; image_ready: boolean; extensions: string[]; entrypoint: string; compiled: boolean }
export interface Artifact { artifact_id: string; size: number; sha256: string }
export interface SystemInfo { version: string; commit: string; features: Record<string, boolean> }

export class APIError extends Error {
  constructor(public status: number, public code: string, message: string) { super(message); }
}

let csrf = '';

/** Reads the session's CSRF token; without a session, goes to the login page. */
export async function initSession(): Promise<void> {
  const r = await fetch('/v1/ui/session', { cache: 'no-store' });
  if (r.status === 401) { location.href = '/login'; throw new APIError(401, 'unauthenticated', 'not logged in'); }
  const s = await r.json();
  csrf = s.csrf_token;
}

export async function request(method: string, path: string, body?: BodyInit | object, headers: Record<string, string> = {}): Promise<Response> {
  const h: Record<string, string> = { ...headers };
  let b: BodyInit | undefined;
  if (body !== undefined && (typeof body === 'string' || body instanceof Blob || body instanceof ArrayBuffer || body instanceof Uint8Array)) {
    b = body as BodyInit;
  } else if (body !== undefined) {
    b = JSON.stringify(body);
    h['Content-Type'] = 'application/json';
  }
  if (method !== 'GET' && method !== 'HEAD') h['X-CSRF-Token'] = csrf;
  const r = await fetch(path, { method, body: b, headers: h, cache: 'no-store' });
  if (r.status === 401) { location.href = '/login'; }
  if (!r.ok) {
    let code = 'error', msg = `${method} ${path}: HTTP ${r.status}`;
    try { const e = await r.json(); code = e.error.code; msg = e.error.message; } catch { /* not JSON */ }
    throw new APIError(r.status, code, msg);
  }
  return r;
}

export async function json<T>(method: string, path: string, body?: object): Promise<T> {
  return (await request(method, path, body)).json();
}

/** Reads an NDJSON stream line by line as it arrives. */
export async function ndjson(r: Response, onLine: (v: any) => void): Promise<void> {
  const reader = r.body!.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.trim()) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}

/** Decodes a stream line's data (base64 when the output was not UTF-8). */
export function lineData(l: { data?: string; encoding?: string }): string {
  if (!l.data) return '';
  if (l.encoding !== 'base64') return l.data;
  const bin = atob(l.data);
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}

const enc = encodeURIComponent;
export const api = {
  system: () => json<SystemInfo>('GET', '/v1/system'),
  ready: async () => (await fetch('/readyz', { cache: 'no-store' })).json() as Promise<{ status: string }>,
  languages: async () => (await json<{ languages: Language[] }>('GET', '/v1/languages')).languages,
  sandboxes: async () => (await json<{ sandboxes: Sandbox[] }>('GET', '/v1/sandboxes')).sandboxes,
  sandbox: (id: string) => json<Sandbox>('GET', `/v1/sandboxes/${enc(id)}`),
  createSandbox: (req: object) => json<Sandbox>('POST', '/v1/sandboxes', req),
  terminate: (id: string) => json<Sandbox>('DELETE', `/v1/sandboxes/${enc(id)}`),
  list: async (id: string, path = '/workspace') =>
    (await json<{ entries: FileEntry[] }>('GET', `/v1/sandboxes/${enc(id)}/files?list=true&recursive=true&path=${enc(path)}`)).entries,
  read: (id: string, path: string) => request('GET', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`),
  write: (id: string, path: string, data: string | Blob) => request('PUT', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`, data),
  remove: (id: string, path: string) => json('DELETE', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}&recursive=true`),
  exec: (id: string, argv: string[]) => request('POST', `/v1/sandboxes/${enc(id)}/exec`, { argv }),
  runStream: (req: object) => request('POST', '/v1/run?stream=true', req),
  runs: async () => (await json<{ runs: RunMeta[] }>('GET', '/v1/runs?limit=100')).runs,
  run: (id: string) => json<RunRecord>('GET', `/v1/runs/${enc(id)}`),
  exportWorkspace: (id: string) => json<Artifact>('POST', `/v1/sandboxes/${enc(id)}/export`),
  buildImage: (name: string) => request('POST', `/v1/images/${enc(name)}/build`),
  logout: () => json('POST', '/v1/ui/logout'),
};

/** Opens a same-origin WebSocket (the browser sends the cookie and Origin). */
export function socket(path: string): WebSocket {
  const u = new URL(path, location.href);
  u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return new WebSocket(u.toString());
}
