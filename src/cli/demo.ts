// `dask-pmix demo`: the main job. Dask lives in Python, so the demo itself is the dask_pmix
// package's demo module, run in the checkout's Open MPI environment; it starts the sidecar
// (this same CLI, `serve`, run on Node directly) through the scheduler plugin. An installed wheel's
// `dask-pmix demo` runs the same module in its own environment.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { projectRoot } from '../pmix/native.js';

export async function demo(args: string[]): Promise<number> {
  const root = projectRoot();
  const python = join(root, '.venv', 'bin', 'python');
  const child = spawn(python, ['-m', 'dask_pmix.demo', ...args], {
    stdio: 'inherit',
    env: process.env,
  });
  const forward = (sig: NodeJS.Signals) => () => child.kill(sig);
  process.on('SIGINT', forward('SIGINT'));
  process.on('SIGTERM', forward('SIGTERM'));
  return new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1)));
  });
}
