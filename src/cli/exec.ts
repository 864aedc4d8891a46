// `dask-pmix exec PROGRAM ARGS...`: a plain MPICH / Intel MPI program as a member of a job. The
// work is the binder's (native/exec/dask_pmix_exec.c): bind the PMI connection with the member's
// PMI_ID, hand it to MPI as PMI_FD, exec the program. The launchers (bin/dask-pmix, the Python
// console script) exec the binder themselves, without starting Node.js; this path is for a
// `node main.js exec` and runs it as a child, passing signals and the exit status through.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { projectRoot } from '../pmix/native.js';

export function binderPath(): string {
  return join(projectRoot(), 'native', 'build', 'Release', 'dask-pmix-exec');
}

export function execBinder(args: string[]): Promise<number> {
  const binder = binderPath();
  if (!existsSync(binder)) {
    process.stderr.write(`dask-pmix: the binder is not built (${binder}); run scripts/setup.sh\n`);
    return Promise.resolve(1);
  }
  return new Promise((resolve) => {
    const child = spawn(binder, args, { stdio: 'inherit' });
    const forward = (sig: NodeJS.Signals) => () => child.kill(sig);
    for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, forward(sig));
    child.on('error', (e) => {
      process.stderr.write(`dask-pmix exec: ${e.message}\n`);
      resolve(127);
    });
    child.on('exit', (code, sig) =>
      resolve(code ?? 128 + (sig ? (({ SIGINT: 2, SIGKILL: 9, SIGTERM: 15 } as Record<string, number>)[sig] ?? 1) : 1)),
    );
  });
}
