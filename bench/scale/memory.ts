// The sidecar's memory per registered worker and per job rank: RSS of a `dask-pmix serve` child
// after registering 1,000 and 4,000 workers over REST, then with one Open MPI (PMIx namespace and
// clients in libpmix) and one MPICH (PMI) job over 1,000 and 4,000 of them, and after deleting
// each job (memory that stays is a leak or a high-water mark).
import { inFlight, round3 } from '../lib/run.js';
import { SidecarProcess } from '../lib/sidecar.js';

export interface MemoryOptions {
  workers: number[];
  jobSizes: number[];
  serveArgs?: string[];
}

export async function memory({ workers, jobSizes, serveArgs = [] }: MemoryOptions) {
  const s = await SidecarProcess.start(['--max-jobs', '64', ...serveArgs]);
  try {
    const rss0 = await s.settledRssKb();
    const ids: string[] = [];
    const registration: { workers: number; rss_kb: number; seconds: number; per_second: number }[] = [];
    for (const target of workers) {
      const from = ids.length;
      const t0 = performance.now();
      await inFlight(target - from, 8, async (i) => {
        const id = `tcp://10.0.${(from + i) >> 8}.${(from + i) & 255}:40000`;
        await s.must(
          'POST',
          '/v1/workers',
          { id, host: `node-${(from + i) % 64}`, pid: 1000 + from + i, uid: process.getuid!(), gid: process.getgid!() },
          201,
        );
        ids.push(id);
      });
      const seconds = (performance.now() - t0) / 1000;
      registration.push({
        workers: target,
        rss_kb: await s.settledRssKb(),
        seconds: round3(seconds),
        per_second: Math.round((target - from) / seconds),
      });
    }
    const wMax = registration.at(-1)!;
    const wMin = registration[0]!;
    const perWorkerKb = (wMax.rss_kb - wMin.rss_kb) / (wMax.workers - wMin.workers);

    const jobs = [];
    for (const impl of ['openmpi', 'mpich'] as const) {
      for (const size of jobSizes.filter((n) => n <= ids.length)) {
        const before = await s.settledRssKb();
        const t0 = performance.now();
        const job = await s.must('POST', '/v1/jobs', { impl, members: ids.slice(0, size) }, 201);
        const createMs = performance.now() - t0;
        // The member environment, as every joining worker asks for it (one is enough to time).
        const t1 = performance.now();
        await s.must('GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(ids[size - 1]!)}`, undefined, 200);
        const envMs = performance.now() - t1;
        const during = await s.settledRssKb();
        const t2 = performance.now();
        await s.must('DELETE', `/v1/jobs/${job.id}`, undefined, 200);
        const deleteMs = performance.now() - t2;
        const after = await s.settledRssKb();
        jobs.push({
          impl,
          ranks: size,
          create_ms: round3(createMs),
          member_env_ms: round3(envMs),
          delete_ms: round3(deleteMs),
          rss_before_kb: before,
          rss_with_job_kb: during,
          rss_after_delete_kb: after,
          per_rank_kb: round3((during - before) / size),
        });
      }
    }
    return {
      serve_args: serveArgs,
      rss_at_start_kb: rss0,
      registration,
      per_worker_kb: round3(perWorkerKb),
      jobs,
      target: 'RSS at most 100 MB + 50 KB per registered worker, at every checkpoint (0 workers included)',
      target_by_checkpoint: [{ workers: 0, rss_kb: rss0 }, ...registration].map((r) => ({
        workers: r.workers,
        rss_kb: r.rss_kb,
        bound_kb: 100 * 1024 + 50 * r.workers,
        met: r.rss_kb <= 100 * 1024 + 50 * r.workers,
      })),
      notes: [
        'RSS: VmRSS of the dask-pmix serve process (Node.js + libpmix), median of 5 samples over 1 s after 1 s of rest',
        'per_worker_kb: RSS growth per worker between the first and last registration checkpoint',
        'registration: POST /v1/workers over loopback HTTP, 8 in flight',
        'jobs: one job at a time over the first N workers; per_rank_kb = (RSS with the job - RSS before) / N; create_ms = POST /v1/jobs (for openmpi: register_nspace + N register_client in libpmix)',
      ],
    };
  } finally {
    await s.stop();
  }
}
