// The in-process pool at P = 1,024 and 4,096 ranks: how long the sidecar takes to register an
// epoch (a PMIx namespace of P ranks, every client registered up front) and what it costs in RSS,
// then P workers taking their seats over REST.
import { execFileSync } from 'node:child_process';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { inFlight, median, ROOT, round3 } from '../lib/run.js';
import { SidecarProcess } from '../lib/sidecar.js';

export function poolSupported(): boolean {
  const help = execFileSync(process.execPath, [join(ROOT, 'dist', 'src', 'cli', 'main.js'), 'serve', '--help'], {
    encoding: 'utf8',
  });
  return help.includes('--pool-size');
}

export async function pool({ sizes, repeats }: { sizes: number[]; repeats: number }) {
  if (!poolSupported()) {
    return {
      todo: 'TODO(pool): `dask-pmix serve --pool-size` has not landed on main yet; rerun `node dist/bench/scale.js --parts pool` once it has',
    };
  }
  const all: Record<
    number,
    {
      pool_size: number;
      start_to_listening_s: number;
      rss_start_kb: number;
      seat_all_s: number;
      rss_all_seated_kb: number;
    }[]
  > = {};
  // Sizes alternate within each repeat, so that the shared machine's load hits all alike.
  for (let r = 0; r < repeats; r++) {
    for (const size of [0, ...sizes]) {
      const t0 = performance.now();
      const s = await SidecarProcess.start(['--no-pmi', '--pool-size', String(size)]);
      const startS = (performance.now() - t0) / 1000;
      try {
        const rssStart = await s.settledRssKb();
        let seatS = NaN;
        let rssSeated = NaN;
        if (size > 0) {
          const t1 = performance.now();
          await inFlight(size, 8, async (i) => {
            const id = `tcp://10.1.${i >> 8}.${i & 255}:40000`;
            await s.must(
              'POST',
              '/v1/workers',
              { id, host: hostname(), pid: 1000 + i, uid: process.getuid!(), gid: process.getgid!() },
              201,
            );
            const seat = await s.call('POST', `/v1/workers/${encodeURIComponent(id)}/pool`, {
              host: hostname(),
              pid: 1000 + i,
            });
            if (seat.status >= 300) throw new Error(`pool seat for ${id}: ${seat.status} ${JSON.stringify(seat.body)}`);
          });
          seatS = (performance.now() - t1) / 1000;
          rssSeated = await s.settledRssKb();
        }
        (all[size] ??= []).push({
          pool_size: size,
          start_to_listening_s: round3(startS),
          rss_start_kb: rssStart,
          seat_all_s: round3(seatS),
          rss_all_seated_kb: rssSeated,
        });
      } finally {
        await s.stop();
      }
    }
  }
  const med = (xs: number[]) => (xs.some(Number.isNaN) ? null : round3(median(xs)));
  const runs = [0, ...sizes].map((size) => {
    const rs = all[size]!;
    return {
      pool_size: size,
      start_to_listening_s: med(rs.map((r) => r.start_to_listening_s))!,
      rss_start_kb: med(rs.map((r) => r.rss_start_kb))!,
      seat_all_s: med(rs.map((r) => r.seat_all_s)),
      rss_all_seated_kb: med(rs.map((r) => r.rss_all_seated_kb)),
    };
  });
  const base = runs[0]!;
  return {
    repeats,
    runs,
    every_run: all,
    per_pool_rank_kb: runs
      .slice(1)
      .map((r) => ({ pool_size: r.pool_size, kb: round3((r.rss_start_kb - base.rss_start_kb) / r.pool_size) })),
    notes: [
      'start_to_listening_s: from starting `dask-pmix serve --pool-size P` to its REST port listening (the first epoch registered in libpmix, if the sidecar opens it at start)',
      'seat_all_s: P workers registered and seated in the pool over REST (POST /v1/workers, POST /v1/workers/{id}/pool), 8 in flight',
      'RSS: VmRSS of the sidecar, median of 5 samples after 1 s of rest',
      'runs: medians over the repeats (the sizes alternate within each); every_run holds them all',
    ],
  };
}
