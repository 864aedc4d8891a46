// PMI at scale on one machine: 1,024 ranks of one MPICH job, simulated by one separate process
// (bench/pmi-sim.c) speaking the real wire to the real resource manager and PMI backend (in this
// process, as in the sidecar). Each rank is its own connection bound with its own credential.
//
//   node dist/bench/pmi-scale.js [--ranks 1024] [--barriers 30] [--card 1022] [--repeats 3]
//
// Measures, per transport (the UNIX socket of ranks on the sidecar's host, and TCP as ranks on
// other hosts use):
//   - barrier: all ranks send barrier_in at once; from the first send to the last barrier_out
//     (median over --barriers, then median over repeats); target <= 50 ms at 1,024;
//   - all-to-all business-card exchange: every rank puts a card of --card hex characters (1022:
//     one 511-byte segment of an MPICH 5 card), barrier, every rank gets every other rank's card
//     (ranks x (ranks - 1) gets, each checked), as MPICH's ch4 does at MPI_Init;
//   - setup: connect, bind, init, get_maxes, get_my_kvsname for every rank, one after another;
//   - the sidecar's RSS before and after.
// Prints one JSON document; nothing is compared with hydra here (1,024 real ranks do not fit two
// cores), so it has no guard ratios.
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { cpus, hostname, loadavg } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { defaultPolicy } from '../src/policy/index.js';
import { ResourceManager } from '../src/rm/index.js';
import { PmiBackend } from '../src/service/pmi-backend.js';
import { BENCH_BIN, inOwnSession, median, ROOT, round3 } from './lib/run.js';

const SIM = join(BENCH_BIN, 'pmi-sim');

async function build(): Promise<void> {
  mkdirSync(BENCH_BIN, { recursive: true });
  const src = join(ROOT, 'bench', 'pmi-sim.c');
  const inputs = [src, join(ROOT, 'bench', 'pmi-wire.h'), join(ROOT, 'bench', 'timing.h')];
  if (existsSync(SIM) && inputs.every((i) => statSync(SIM).mtimeMs > statSync(i).mtimeMs)) return;
  await promisify(execFile)('gcc', ['-O2', '-Wall', '-o', SIM, src]);
}

type SimResult = Record<string, unknown> & {
  ok: boolean;
  barrier_ms_median: number;
  setup_ms: number;
  exchange: Record<string, number>;
};

/** Runs the simulator as every rank of `ids` and resolves with its JSON line. */
function simulate(
  target: string[],
  ids: string[],
  barriers: number,
  card: number,
  timeoutMs = 600_000,
): Promise<SimResult> {
  return new Promise((resolve, reject) => {
    const c = spawn(SIM, [...target, String(barriers), String(card)], {
      stdio: ['pipe', 'pipe', 'pipe'],
      detached: true,
    });
    let out = '';
    let err = '';
    c.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
    c.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
    const timer = setTimeout(() => c.kill('SIGKILL'), timeoutMs);
    c.on('close', (code, sig) => {
      clearTimeout(timer);
      const line = out.trim().split('\n').pop() ?? '';
      let r: SimResult | undefined;
      try {
        r = JSON.parse(line) as SimResult;
      } catch {
        /* below */
      }
      if (code !== 0 || !r?.ok) return reject(new Error(`pmi-sim exited ${code ?? sig}: ${line} ${err.slice(-1000)}`));
      resolve(r);
    });
    c.stdin.end(`${ids.join('\n')}\n`);
  });
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      ranks: { type: 'string', default: '1024' },
      barriers: { type: 'string', default: '30' },
      card: { type: 'string', default: '1022' },
      repeats: { type: 'string', default: '3' },
      'in-session': { type: 'boolean', default: false },
    },
  });
  const n = Number(values.ranks);
  const barriers = Number(values.barriers);
  const card = Number(values.card);
  const repeats = Number(values.repeats);
  await build();
  const rm = new ResourceManager({ policy: defaultPolicy({ releaseGraceMs: 1000 }), wiringTimeoutSeconds: 600 });
  const backend = await PmiBackend.start({ rm, topology: false });
  rm.addBackend(backend);
  const rssBefore = process.memoryUsage().rss;
  let rssPeak = rssBefore;
  const runs: Record<'unix' | 'tcp', SimResult[]> = { unix: [], tcp: [] };
  const load: number[] = [];
  let w = 0;
  try {
    for (let r = 0; r < repeats; r++) {
      // Alternate the transports so that drift on the shared machine hits both alike.
      for (const transport of ['unix', 'tcp'] as const) {
        const workers = Array.from({ length: n }, () => `sim-w${++w}`);
        for (const id of workers) rm.registerWorker({ id, host: hostname() });
        const job = await rm.createJob({ impl: 'mpich', members: workers });
        const ids = workers.map((x) => rm.memberEnv(job.id, x).env.PMI_ID!);
        const target = transport === 'unix' ? ['--socket', backend.listener.socketPath!] : ['--port', backend.pmiPort];
        load.push(loadavg()[0]!);
        runs[transport].push(await simulate(target, ids, barriers, card));
        rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
        const state = rm.getJob(job.id).state;
        if (state !== 'completed') throw new Error(`job ${job.id} ended ${state}: ${rm.getJob(job.id).error}`);
        await rm.released(job.id);
        for (const id of workers) rm.removeWorker(id);
        process.stderr.write(
          `[pmi-scale] ${transport} run ${r + 1}: barrier ${runs[transport].at(-1)!.barrier_ms_median} ms\n`,
        );
      }
    }
  } finally {
    await rm.shutdown('benchmark done');
    await backend.close();
  }
  const summary = (xs: SimResult[]) => ({
    barrier_ms: round3(median(xs.map((x) => x.barrier_ms_median))),
    barrier_ms_runs: xs.map((x) => x.barrier_ms_median),
    setup_ms: round3(median(xs.map((x) => x.setup_ms))),
    exchange: Object.fromEntries(
      Object.keys(xs[0]!.exchange).map((k) => [k, round3(median(xs.map((x) => x.exchange[k]!)))]),
    ),
  });
  const unix = summary(runs.unix);
  const tcp = summary(runs.tcp);
  console.log(
    JSON.stringify(
      {
        benchmark: 'pmi-scale',
        host: hostname(),
        cpus: cpus().length,
        node: process.version,
        load_avg_1m: { min: round3(Math.min(...load)), max: round3(Math.max(...load)) },
        ranks: n,
        barriers_per_run: barriers,
        card_hex_chars: card,
        repeats,
        target: { barrier_ms: 50 },
        results: { unix, tcp },
        met: { barrier_unix: unix.barrier_ms <= 50, barrier_tcp: tcp.barrier_ms <= 50 },
        sidecar_rss_mb: { before: Math.round(rssBefore / 2 ** 20), peak: Math.round(rssPeak / 2 ** 20) },
        notes: [
          'one client process (bench/pmi-sim.c, one epoll loop) simulates every rank over the real wire, each rank its own connection bound with its PMI_ID credential',
          'barrier: from the first barrier_in sent to the last barrier_out received; median of the run, then median over repeats',
          'exchange: every rank puts its card, barrier, every rank gets all the others (ranks x (ranks - 1) gets, each checked), one request at a time per connection, all connections at once',
          "the client shares the 2 cores with the sidecar, so every figure includes the client's own work",
        ],
      },
      null,
      2,
    ),
  );
  process.exit(0);
}

// The sidecar side in a session of its own (as the embedded sidecar); the simulated ranks in
// another (as separate processes they would each have their own).
inOwnSession(import.meta.url, main);
