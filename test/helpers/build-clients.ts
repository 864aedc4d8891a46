// Builds the C programs the tests start as MPI ranks and PMIx clients.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { BIN, BINDER, PMIX_INCLUDE, PMIX_LIB_DIR, ROOT, VENV, VENV_MPICH } from './paths.js';

const run = promisify(execFile);

interface Target {
  out: string;
  src: string;
  cc: string;
  flags: string[];
  /** Headers it includes, for the rebuild check. */
  deps?: string[];
}

export function targets(): Target[] {
  const src = (f: string) => join(ROOT, 'test', 'clients', f);
  // The starter's PMI handshake, shared with the binder (native/exec).
  const connectH = join(ROOT, 'native', 'exec', 'pmi_connect.h');
  // The PMIx clients' shared calls, and the scenario clients' frame (found beside the sources).
  const pmixCalls = src('pmix_calls.h');
  const scenario = [src('scenario.h'), pmixCalls];
  return [
    ...(
      [
        ['pmix_client', scenario],
        ['pmix_tool', [pmixCalls]],
        ['pmix_conform', scenario],
      ] as const
    ).map(([name, deps]) => ({
      out: name,
      src: src(`${name}.c`),
      cc: 'gcc',
      flags: ['-O', '-Wall', `-I${PMIX_INCLUDE}`, join(PMIX_LIB_DIR, 'libpmix.so.2'), `-Wl,-rpath,${PMIX_LIB_DIR}`],
      deps: [...deps],
    })),
    { out: 'mpi_job_ompi5', src: src('mpi_job.c'), cc: join(VENV, 'bin', 'mpicc'), flags: ['-O'] },
    { out: 'mpi_hosts_ompi5', src: src('mpi_hosts.c'), cc: join(VENV, 'bin', 'mpicc'), flags: ['-O'] },
    // MPICH: Debian's 4.0.2 and the PyPI wheel's 5.0.x, both PMI-1 clients in practice.
    { out: 'mpi_job_mpich4', src: src('mpi_job.c'), cc: 'mpicc.mpich', flags: ['-O'] },
    { out: 'mpi_job_mpich5', src: src('mpi_job.c'), cc: join(VENV_MPICH, 'bin', 'mpicc'), flags: ['-O'] },
    { out: 'mpi_hosts_mpich5', src: src('mpi_hosts.c'), cc: join(VENV_MPICH, 'bin', 'mpicc'), flags: ['-O'] },
    {
      out: 'mpich_probe_mpich4',
      src: src('mpich_probe.c'),
      cc: 'mpicc.mpich',
      flags: ['-O', `-I${dirname(connectH)}`],
      deps: [connectH],
    },
    {
      out: 'mpich_probe_mpich5',
      src: src('mpich_probe.c'),
      cc: join(VENV_MPICH, 'bin', 'mpicc'),
      flags: ['-O', `-I${dirname(connectH)}`],
      deps: [connectH],
    },
    ...['publish_lookup', 'abort', 'connect_accept'].flatMap((p) => [
      { out: `${p}_mpich4`, src: join(ROOT, 'compat-matrix', 'programs', `${p}.c`), cc: 'mpicc.mpich', flags: ['-O'] },
      {
        out: `${p}_mpich5`,
        src: join(ROOT, 'compat-matrix', 'programs', `${p}.c`),
        cc: join(VENV_MPICH, 'bin', 'mpicc'),
        flags: ['-O'],
      },
    ]),
    // A PMI-2 client of the older dialect: Slurm's libpmi2 (Debian libpmi2-0-dev).
    { out: 'pmi2_probe', src: src('pmi2_probe.c'), cc: 'gcc', flags: ['-O', '-Wall', '-lpmi2'] },
  ];
}

export async function buildClients(): Promise<void> {
  mkdirSync(BIN, { recursive: true });
  for (const t of targets()) {
    const out = join(BIN, t.out);
    if (existsSync(out) && [t.src, ...(t.deps ?? [])].every((f) => statSync(out).mtimeMs > statSync(f).mtimeMs))
      continue;
    await run(t.cc, ['-o', out, t.src, ...t.flags]);
  }
}

export function bin(name: string): string {
  return join(BIN, name);
}

/**
 * The command line that starts `program` as an MPICH / Intel MPI rank the way a Dask worker
 * does: its PMI connection bound with the PMI_ID credential first (src/pmi/credential.ts), by
 * the binder behind `dask-pmix exec` (native/exec, built with the addon).
 */
export function pmiRank(program: string, args: string[] = []): [string, string[]] {
  return [BINDER, [program, ...args]];
}
