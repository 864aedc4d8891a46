// Compiles the feature programs with a row's compiler wrapper (skipped when up to date).
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Row } from './rows.js';

const run = promisify(execFile);

export interface Built {
  dir: string;
  programs: Map<string, string>;
  errors: Map<string, string>;
}

export async function buildRow(root: string, row: Row): Promise<Built> {
  const src = join(root, 'compat-matrix', 'programs');
  const dir = join(root, 'compat-matrix', '.work', row.id, 'bin');
  mkdirSync(dir, { recursive: true });
  const programs = new Map<string, string>();
  const errors = new Map<string, string>();
  // Every program includes compat.h; the agent also the rank starter's PMI handshake.
  const header = Math.max(
    statSync(join(src, 'compat.h')).mtimeMs,
    statSync(join(root, 'native', 'exec', 'pmi_connect.h')).mtimeMs,
  );
  for (const file of readdirSync(src).filter((f) => f.endsWith('.c'))) {
    const name = file.slice(0, -2);
    const out = join(dir, name);
    const errFile = `${out}.error`;
    const newest = Math.max(header, statSync(join(src, file)).mtimeMs);
    if (existsSync(out) && statSync(out).mtimeMs > newest) {
      programs.set(name, out);
      continue;
    }
    if (existsSync(errFile) && statSync(errFile).mtimeMs > newest) {
      errors.set(name, readFileSync(errFile, 'utf8'));
      continue;
    }
    try {
      await run(row.cc, ['-O', '-o', out, join(src, file)], { env: { ...process.env, ...row.baseEnv } });
      programs.set(name, out);
    } catch (err) {
      const text = String((err as { stderr?: string }).stderr ?? err);
      const first = text.split('\n').find((l) => l.includes('error')) ?? text.split('\n')[0] ?? 'build failed';
      const reason = `does not build with ${row.label}: ${first.replace(/^.*?error: /, '').trim()}`;
      writeFileSync(errFile, reason);
      errors.set(name, reason);
    }
  }
  return { dir, programs, errors };
}
