// Builds the dashboard page: src/dashboard/index.html with the charting library (Chart.js, from
// node_modules) and the page's own script (src/dashboard/page.js) inlined in place of their
// markers, written to python/dask_pmix/dashboard/index.html, the file both the sidecar (at `/`)
// and the scheduler (at /dask-pmix/) serve. The page then needs nothing from any other host:
// clusters may have no internet.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const here = (...p) => join(root, 'src', 'dashboard', ...p);

// The package exports no path to its UMD build: its main entry sits in dist/, beside that file.
const scripts = {
  '<!-- chart.js: inlined by scripts/build-dashboard.mjs -->': join(
    dirname(require.resolve('chart.js')),
    'chart.umd.min.js',
  ),
  '<!-- page.js: inlined by scripts/build-dashboard.mjs -->': here('page.js'),
};

let page = readFileSync(here('index.html'), 'utf8');
for (const [marker, file] of Object.entries(scripts)) {
  if (!page.includes(marker)) throw new Error(`src/dashboard/index.html lacks the marker ${marker}`);
  const code = readFileSync(file, 'utf8');
  if (code.includes('</script')) throw new Error(`${file} contains </script and cannot be inlined`);
  // The page's own script is a module (strict, run once the document is parsed); the library a
  // classic script before it, which defines the global Chart.
  const type = file.endsWith('page.js') ? ' type="module"' : '';
  page = page.replace(marker, () => `<script${type}>\n${code}\n</script>`);
}
const out = join(root, 'python', 'dask_pmix', 'dashboard', 'index.html');
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, page);
