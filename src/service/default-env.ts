// What each member of a job gets in its environment, per MPI library, besides the variables its
// protocol backend derives (PMIx's setup_fork, PMI_PORT/PMI_ID), unless the sidecar is
// configured otherwise. The values are measured on a 2-core machine, where waiting ranks that
// busy-poll starve the others (and the Dask threads of their worker). They act on MPI's own
// waits; the waits for the process manager inside MPI_Init are beyond any of them
// (bench/idle-ranks.ts, src/pmi/README.md).
import type { Impl } from '../rm/index.js';

export const DEFAULT_MEMBER_ENV: Readonly<Record<Impl, Readonly<Record<string, string>>>> = {
  /**
   * The wheel's libfabric transport costs about a second per init where there is no fabric, and
   * probing UCX for the pml another 100-150 ms (communicator ready 45 ms instead of 130-190 ms
   * with ob1); clusters with a fabric set OMPI_MCA_pml=ucx through --ompi-env. The async-modex
   * settings are left alone on purpose: with them a member that connects late hangs. Clusters
   * with a fabric set OMPI_MCA_osc=ucx the same way.
   */
  openmpi: {
    OMPI_MCA_btl: '^ofi',
    OMPI_MCA_pml: 'ob1',
    OMPI_MCA_mpi_yield_when_idle: '1',
    // Without a usable UCX device, osc/ucx fails its query at every window creation and prints
    // an error each time; osc/rdma and osc/sm serve windows over ob1 (open-mpi/ompi#14086).
    OMPI_MCA_osc: '^ucx',
  },
  /**
   * MPICH >= 4.1 (ch4): MPIR_CVAR_CH4_PROGRESS_THROTTLE sleeps 1 us after that many polls
   * without progress. 16 ranks, 200 Allreduces behind a 2 ms straggler: 10.5 s without, 1.0 s
   * with a count of 16 (the default count of 4096 helps much less). MPICH 4.0.2 has no such
   * setting (nor any UCX one that applies: shared memory on one host is MPICH's own).
   */
  mpich: {
    MPIR_CVAR_CH4_PROGRESS_THROTTLE: '1',
    MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT: '16',
  },
  /**
   * Intel MPI backs off by itself when oversubscribed; spinning once and then sched_yield
   * shaves a little more (0.64 s → 0.49 s in the same test with 8 ranks).
   */
  intelmpi: {
    I_MPI_SPIN_COUNT: '1',
    I_MPI_THREAD_YIELD: '2',
  },
};
