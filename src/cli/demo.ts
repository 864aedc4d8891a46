// `dask-pmix demo`: the main job. Dask lives in Python, so the demo itself is the dask_pmix
// package's demo module, run in the project's Open MPI environment; it starts the sidecar
// (this same CLI, `serve`) through the scheduler plugin.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { projectRoot } from '../pmix/native.js';

export async function demo(args: string[]): Promise<number> {
  const root = projectRoot();
  const python = join(root, '.venv', 'bin', 'python');
  const child = spawn(python, ['-m', 'dask_pmix.demo', ...args], {
    stdio: 'inherit',
    env: { ...process.env, DASK_PMIX_BIN: join(root, 'bin', 'dask-pmix'), DASK_PMIX_NO_SETUP: '1' },
  });
  const forward = (sig: NodeJS.Signals) => () => child.kill(sig);
  process.on('SIGINT', forward('SIGINT'));
  process.on('SIGTERM', forward('SIGTERM'));
  return new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? (signal ? 128 : 1)));
  });
}
