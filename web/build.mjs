// Bundles the web editor into ../pkg/webui/dist (embedded by the daemon):
// index.html, assets/app.js + app.css (the page, Monaco, xterm.js) and
// assets/editor.worker.js (Monaco's worker: diff computation, links).
// Only Monaco's tokenizers (Monarch) are bundled for languages, not the
// TypeScript/JSON/CSS/HTML language-service workers (megabytes each).
import * as esbuild from 'esbuild';
import { cpSync, mkdirSync, rmSync, statSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { gzipSync, constants } from 'node:zlib';
import { join } from 'node:path';

const out = new URL('../pkg/webui/dist/', import.meta.url).pathname;
rmSync(join(out, 'assets'), { recursive: true, force: true });
rmSync(join(out, 'index.html'), { force: true });
mkdirSync(join(out, 'assets'), { recursive: true });

const common = {
  bundle: true,
  minify: true,
  sourcemap: false,
  target: 'es2022',
  logLevel: 'warning',
  legalComments: 'none',
};
await esbuild.build({
  ...common,
  entryPoints: { app: 'src/main.ts' },
  outdir: join(out, 'assets'),
  format: 'esm',
  loader: { '.ttf': 'file' },
  assetNames: '[name]',
});
await esbuild.build({
  ...common,
  entryPoints: { 'editor.worker': 'monaco-editor/editor/editor.worker.js' },
  outdir: join(out, 'assets'),
  format: 'iife',
});
cpSync('src/index.html', join(out, 'index.html'));

// Pre-compressed copies, served to browsers that accept gzip (all do):
// a quarter of the bytes on the wire.
let total = 0, gz = 0;
for (const f of readdirSync(join(out, 'assets'))) {
  const p = join(out, 'assets', f);
  const z = gzipSync(readFileSync(p), { level: constants.Z_BEST_COMPRESSION });
  writeFileSync(p + '.gz', z);
  total += statSync(p).size;
  gz += z.length;
}
console.log(`web: bundle ${(total / 1024 / 1024).toFixed(2)} MiB (${(gz / 1024 / 1024).toFixed(2)} MiB gzipped) in ${out}`);
