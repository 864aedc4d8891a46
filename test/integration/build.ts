// Builds the integration tests' own PMIx clients (next to the shared ones in test/.work/bin).
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { BIN, PMIX_INCLUDE, PMIX_LIB_DIR } from '../helpers/paths.js';

const here = dirname(fileURLToPath(import.meta.url));

export async function pmixClient(name: string): Promise<string> {
  const src = join(here, 'clients', `${name}.c`);
  const out = join(BIN, name);
  mkdirSync(BIN, { recursive: true });
  if (!existsSync(out) || statSync(out).mtimeMs < statSync(src).mtimeMs) {
    await promisify(execFile)('gcc', [
      '-O',
      '-Wall',
      `-I${PMIX_INCLUDE}`,
      '-o',
      out,
      src,
      join(PMIX_LIB_DIR, 'libpmix.so.2'),
      `-Wl,-rpath,${PMIX_LIB_DIR}`,
    ]);
  }
  return out;
}
