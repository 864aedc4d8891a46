// Builds the dashboard page: src/dashboard/index.html with the charting library (Chart.js, from
// node_modules) inlined in place of its marker, written to python/dask_pmix/dashboard/index.html,
// the file both the sidecar (at `/`) and the scheduler (at /dask-pmix/) serve. The page then needs
// nothing from any other host: clusters may have no internet.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const MARKER = '<!-- chart.js: inlined by scripts/build-dashboard.mjs -->';

const page = readFileSync(join(root, 'src', 'dashboard', 'index.html'), 'utf8');
if (!page.includes(MARKER)) throw new Error(`src/dashboard/index.html lacks the marker ${MARKER}`);
// The package exports no path to its UMD build: its main entry sits in dist/, beside that file.
const library = readFileSync(join(dirname(require.resolve('chart.js')), 'chart.umd.min.js'), 'utf8');
if (library.includes('</script')) throw new Error('the library contains </script and cannot be inlined');
const out = join(root, 'python', 'dask_pmix', 'dashboard', 'index.html');
mkdirSync(dirname(out), { recursive: true });
writeFileSync(
  out,
  page.replace(MARKER, () => `<script>\n${library}\n</script>`),
);
