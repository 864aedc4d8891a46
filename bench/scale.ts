// Scale on one machine (beside bench/pmi-scale.ts's 1,024 simulated PMI ranks):
//   memory  sidecar RSS per registered worker (1,000 and 4,000 over REST) and per job rank
//   netns   256 real PMIx clients in one job over network-namespace hosts: init and fence times
//   pool    the in-process pool at P = 1,024 and 4,096: registration time and RSS
//
//   node dist/bench/scale.js [--parts memory,netns,pool] [--ranks 256] [--hosts 8] [--repeats 3]
//
// Prints one JSON document (recorded in bench/results/scale.json).
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { machine } from './lib/run.js';
import { memory } from './scale/memory.js';
import { netnsAvailable, netnsFence } from './scale/netns.js';
import { pool } from './scale/pool.js';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      parts: { type: 'string', default: 'memory,netns,pool' },
      ranks: { type: 'string', default: '256' },
      hosts: { type: 'string', default: '8' },
      iterations: { type: 'string', default: '20' },
      repeats: { type: 'string', default: '3' },
      workers: { type: 'string', default: '1000,4000' },
      'job-sizes': { type: 'string', default: '1000,4000' },
      'pool-sizes': { type: 'string', default: '1024,4096' },
    },
  });
  const parts = values.parts.split(',');
  const nums = (s: string) => s.split(',').map(Number);
  const out: Record<string, unknown> = {
    benchmark: 'scale',
    when: new Date().toISOString(),
    machine: {
      ...machine(),
      load_avg_at_start: loadavg(),
    },
  };
  if (parts.includes('memory')) {
    // As shipped (an in-process pool epoch of 1,024 ranks opened at start, a rank seated per
    // worker, the next epoch opened when a tenth is left), and without the pool.
    out.memory = {
      default_pool: await memory({ workers: nums(values.workers), jobSizes: nums(values['job-sizes']) }),
      no_pool: await memory({
        workers: nums(values.workers),
        jobSizes: nums(values['job-sizes']),
        serveArgs: ['--pool-size', '0'],
      }),
    };
    process.stderr.write('[bench/scale] memory done\n');
  }
  if (parts.includes('netns')) {
    out.netns = netnsAvailable()
      ? await netnsFence({
          ranks: Number(values.ranks),
          hosts: Number(values.hosts),
          iterations: Number(values.iterations),
          repeats: Number(values.repeats),
        })
      : { skipped: 'needs root and iproute2 to make network namespaces' };
    process.stderr.write('[bench/scale] netns done\n');
  }
  if (parts.includes('pool')) {
    out.pool = await pool({ sizes: nums(values['pool-sizes']), repeats: Number(values.repeats) });
    process.stderr.write('[bench/scale] pool done\n');
  }
  console.log(JSON.stringify(out, null, 2));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
