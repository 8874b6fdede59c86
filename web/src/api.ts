// The daemon's public REST API (the one sandboxctl uses), as the page calls
// it: same-origin requests carrying the HttpOnly session cookie, and the
// session's CSRF token on every state-changing request.

// The JSON types are generated from the daemon's pkg/apitypes
// (apitypes.gen.ts, by cmd/tsgen; pkg/webui's test fails on drift): the
// editor reads exactly what the daemon writes.
import type {
  Artifact, FileEntry, FileList, FixedAttempt, LanguageInfo, LanguageList, Readiness, RunList,
  RunMetadata, RunRecord, RunReplay, RunResult, SandboxDetail, SandboxList, SystemInfo,
} from './apitypes.gen';

export type * from './apitypes.gen';
/** A sandbox as the list and detail routes answer it (usage in the detail only). */
export type Sandbox = SandboxDetail;
export type Language = LanguageInfo;
export type RunMeta = RunMetadata;
export type Attempt = FixedAttempt;
export type { Artifact, FileEntry, RunRecord, RunReplay, RunResult, SystemInfo };

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

/** Reads an NDJSON stream line by line as it arrives; T is the stream's
 * line type (ExecLine, BuildLine, AutofixLine, ...). */
export async function ndjson<T>(r: Response, onLine: (v: T) => void): Promise<void> {
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
  ready: async () => (await fetch('/readyz', { cache: 'no-store' })).json() as Promise<Readiness>,
  languages: async () => (await json<LanguageList>('GET', '/v1/languages')).languages,
  sandboxes: async () => (await json<SandboxList>('GET', '/v1/sandboxes')).sandboxes as Sandbox[],
  sandbox: (id: string) => json<Sandbox>('GET', `/v1/sandboxes/${enc(id)}`),
  createSandbox: (req: object) => json<Sandbox>('POST', '/v1/sandboxes', req),
  terminate: (id: string) => json<Sandbox>('DELETE', `/v1/sandboxes/${enc(id)}`),
  list: async (id: string, path = '/workspace') =>
    (await json<FileList>('GET', `/v1/sandboxes/${enc(id)}/files?list=true&recursive=true&path=${enc(path)}`)).entries,
  read: (id: string, path: string) => request('GET', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`),
  write: (id: string, path: string, data: string | Blob) => request('PUT', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`, data),
  remove: (id: string, path: string) => json('DELETE', `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}&recursive=true`),
  exec: (id: string, argv: string[]) => request('POST', `/v1/sandboxes/${enc(id)}/exec`, { argv }),
  runStream: (req: object) => request('POST', '/v1/run?stream=true', req),
  runs: async () => (await json<RunList>('GET', '/v1/runs?limit=100')).runs,
  run: (id: string) => json<RunRecord>('GET', `/v1/runs/${enc(id)}`),
  replay: (id: string) => json<RunReplay>('POST', `/v1/runs/${enc(id)}/replay`),
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
