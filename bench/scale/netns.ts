// 256 real PMIx client processes in one job, spread over network-namespace "hosts" on a bridge
// (as test/integration/netns.test.ts makes them; names derived from this pid, removed after),
// each reaching the sidecar over TCP: PMIx_Init and fence times, timed inside the clients. For
// reference, the same clients on the host itself under the sidecar and under prterun.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { makeNetwork, type NetnsNetwork, removeNetwork } from '../lib/netns.js';
import { buildPmixClient, PMIX_CLIENT, pmixFiguresOf, VENV } from '../lib/pmix-client.js';
import { baseEnv, collectLines, type Line, median, round3 } from '../lib/run.js';
import { SidecarProcess } from '../lib/sidecar.js';

const TAG = `bp${process.pid % 100000}`;
const SUBNET = `10.${150 + (process.pid % 100)}.9`;

function network(count: number): NetnsNetwork {
  return {
    bridge: `br-${TAG}`,
    serverIp: `${SUBNET}.1`,
    hosts: Array.from({ length: count }, (_, i) => ({
      ns: `${TAG}h${i}`,
      host: `node-${i}`,
      ip: `${SUBNET}.${i + 2}`,
    })),
  };
}

export function netnsAvailable(): boolean {
  try {
    execFileSync('ip', ['netns', 'list'], { stdio: 'pipe' });
    return process.getuid?.() === 0;
  } catch {
    return false;
  }
}

const FIELDS = 'fence,fence_data';

function summary(lines: Line[], n: number, wallS: number) {
  const f = pmixFiguresOf(lines, n);
  const init = lines.map((l) => Number(l.init_us));
  return {
    ranks: n,
    fence_us: f.fence_us,
    fence_data_us: f.fence_data_us,
    init_median_us: median(init),
    init_max_us: Math.max(...init),
    start_to_exit_s: round3(wallS),
  };
}

/** One job of `n` clients under the sidecar; `place(i)` says where rank i runs. */
async function sidecarRun(
  s: SidecarProcess,
  n: number,
  iters: number,
  place: (i: number) => { host: string; ip: string; ns?: string },
  tag: string,
) {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const p = place(i);
    const id = `tcp://${p.ip}:${5000 + i}/${tag}`;
    await s.must(
      'POST',
      '/v1/workers',
      { id, host: p.host, pid: 1, uid: process.getuid!(), gid: process.getgid!() },
      201,
    );
    ids.push(id);
  }
  const job = await s.job('openmpi', ids);
  const procs = job.envs.map((env, i) => {
    const ns = place(i).ns;
    return ns
      ? { cmd: 'ip', args: ['netns', 'exec', ns, PMIX_CLIENT, String(iters), FIELDS], env: { ...baseEnv(), ...env } }
      : { cmd: PMIX_CLIENT, args: [String(iters), FIELDS], env: { ...baseEnv(), ...env } };
  });
  const cpu0 = s.cpuSeconds();
  const t0 = performance.now();
  const lines = await collectLines(procs, 300_000);
  const wall = (performance.now() - t0) / 1000;
  const cpu = s.cpuSeconds() - cpu0;
  await s.ended(job.id);
  for (const id of ids) await s.must('DELETE', `/v1/workers/${encodeURIComponent(id)}`, undefined, 200);
  // Every client makes 2 * iterations + 13 fences (10 warm-up barriers, one before each section and
  // one before finalize), and half of the timed ones carry a put and a commit.
  const fences = n * (2 * iters + 13);
  return {
    ...summary(lines, n, wall),
    sidecar_cpu_s: round3(cpu),
    sidecar_cpu_us_per_rank_fence: round3((cpu * 1e6) / fences),
  };
}

/** Per field, the median over repeats (runs is never empty). */
function medians<T extends Record<string, number | undefined>>(runs: T[]): T {
  return Object.fromEntries(
    Object.keys(runs[0]!).map((k) => [k, round3(median(runs.map((r) => r[k] as number)))]),
  ) as T;
}

export async function netnsFence({
  ranks,
  hosts,
  iterations,
  repeats,
}: {
  ranks: number;
  hosts: number;
  iterations: number;
  repeats: number;
}) {
  await buildPmixClient();
  const net = network(hosts);
  removeNetwork(net);
  if (!makeNetwork(net)) throw new Error('could not make a bridge (needs root and iproute2)');
  const made = net.hosts;
  try {
    // The sidecar listens for PMIx clients on the bridge (remote connections over TCP).
    const s = await SidecarProcess.start(['--no-pmi', '--pmix-if', net.serverIp]);
    const across = [];
    const onHost = [];
    const prrte = [];
    try {
      // The three alternate, so that the shared machine's load hits all alike.
      for (let r = 0; r < repeats; r++) {
        across.push(await sidecarRun(s, ranks, iterations, (i) => made[i % hosts]!, `netns${r}`));
        onHost.push(await sidecarRun(s, ranks, iterations, () => ({ host: 'node-0', ip: net.serverIp }), `host${r}`));
        const t0 = performance.now();
        const lines = await collectLines(
          [
            {
              cmd: join(VENV, 'bin', 'prterun'),
              args: [
                '--allow-run-as-root',
                '--map-by',
                ':OVERSUBSCRIBE',
                '-n',
                String(ranks),
                PMIX_CLIENT,
                String(iterations),
                FIELDS,
              ],
              env: baseEnv(),
            },
          ],
          300_000,
        );
        prrte.push(summary(lines, ranks, (performance.now() - t0) / 1000));
      }
    } finally {
      await s.stop();
    }
    const a = medians(across);
    const p = medians(prrte);
    return {
      hosts,
      ranks,
      iterations,
      repeats,
      sidecar_across_hosts: a,
      sidecar_one_host: medians(onHost),
      prrte_one_host: p,
      ratio_to_prrte: {
        fence_us: round3(a.fence_us! / p.fence_us!),
        fence_data_us: round3(a.fence_data_us! / p.fence_data_us!),
      },
      runs: { sidecar_across_hosts: across, sidecar_one_host: onHost, prrte_one_host: prrte },
      notes: [
        `sidecar_across_hosts: ${ranks} clients, round-robin over ${hosts} network namespaces on a bridge, each connected to the sidecar over TCP (--pmix-if on the bridge); rank env from GET /v1/jobs/{id}/env/{worker}`,
        'sidecar_one_host: the same clients in the root namespace (the sidecar still serves them over TCP); prrte_one_host: prterun -n N on the host (PRRTE cannot span these namespaces without a remote launcher)',
        'fence_us / fence_data_us: medians (iterations, then ranks) of PMIx_Fence without data / Put 64 B + Commit + Fence(collect), timed inside the clients; init: PMIx_Init; start_to_exit_s: from starting the processes to the last exit',
        'each figure is the median over the repeats (the three configurations alternate); runs holds every repeat',
        'all processes share 2 cores: a fence waits for every one of them to be scheduled',
        'sidecar_cpu_s: CPU time (all threads) the sidecar used while the clients ran, including their connect and finalize; sidecar_cpu_us_per_rank_fence divides it by ranks x fences (an upper bound on the server cost of one rank in one fence)',
      ],
    };
  } finally {
    removeNetwork(net);
  }
}
