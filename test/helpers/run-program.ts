// Runs a program to its end with only PATH and `env` in its environment, collecting its output
// (killed after `timeoutMs`, so a hang fails the test that waits for it, not the suite).
import { spawn } from 'node:child_process';

export interface ProgramResult {
  code: number | null;
  out: string;
  err: string;
}

export function runProgram(
  cmd: readonly string[],
  env: Record<string, string>,
  opts: { uid?: number; cwd?: string; timeoutMs?: number } = {},
): Promise<ProgramResult> {
  return new Promise((resolve, reject) => {
    const c = spawn(cmd[0]!, cmd.slice(1), {
      env: { PATH: process.env.PATH!, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
      ...(opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : {}),
    });
    let out = '';
    let err = '';
    c.stdout.on('data', (d: Buffer) => (out += d.toString()));
    c.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const t = setTimeout(() => c.kill('SIGKILL'), opts.timeoutMs ?? 20_000);
    c.on('error', reject);
    c.on('close', (code) => {
      clearTimeout(t);
      resolve({ code, out, err });
    });
  });
}
