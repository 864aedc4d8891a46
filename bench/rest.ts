// REST benchmark: latency (p50/p99) and throughput of the sidecar's control plane over loopback
// HTTP — pset define/delete and job create/delete (an Open MPI job: PMIx namespace and client
// registration in libpmix, then teardown) — against a `dask-pmix serve` child process.
//
//   node dist/bench/rest.js [--iterations N] [--concurrency C] [--members M] [--quick]
//
// GET /v1/health, the cheapest route, is the baseline: right before and after each measurement,
// up to 200 health calls run at the same concurrency (`health_ops_per_s`, `health_p50_ms`: their
// means), and `guard.ratios` (for the perf guard, bench/guard.ts) is the baseline's median
// latency over the operation's, so a slower or busier machine moves both. --quick: 200
// iterations (a few seconds).
//
// Prints one JSON document on stdout. Every loop is bounded and targets 127.0.0.1 only.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { Agent, request as httpRequest } from 'node:http';
import { cpus, hostname, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { guardSection } from './lib/guard.js';
import { type ServeChild, startServe } from './lib/sidecar.js';

interface Stats {
  n: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
  max_ms: number;
  mean_ms: number;
}

function stats(samples: number[]): Stats {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0;
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return {
    n: s.length,
    p50_ms: r(q(0.5)),
    p90_ms: r(q(0.9)),
    p99_ms: r(q(0.99)),
    max_ms: r(s.at(-1) ?? 0),
    mean_ms: r(s.reduce((a, b) => a + b, 0) / (s.length || 1)),
  };
}

const TOKEN = randomBytes(24).toString('base64url');

// node:http with a keep-alive agent, not fetch: fetch costs the client several times the CPU per
// request that the sidecar spends, and both share the machine's two cores.
const agent = new Agent({ keepAlive: true, maxSockets: 64 });

function call(base: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  const url = new URL(path, base);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        agent,
        method,
        host: url.hostname,
        port: url.port,
        path: url.pathname + url.search,
        headers: {
          authorization: `Bearer ${TOKEN}`,
          ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString();
          resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : undefined });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

async function must(base: string, method: string, path: string, body: unknown, want: number): Promise<any> {
  const r = await call(base, method, path, body);
  if (r.status !== want) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.json)}`);
  return r.json;
}

/** Runs `op(i)` `n` times with `concurrency` in flight; per-op latencies and total throughput. */
async function run(
  n: number,
  concurrency: number,
  op: (i: number) => Promise<void>,
): Promise<{ latency: Stats; ops_per_s: number; seconds: number }> {
  const lat: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < n; i = next++) {
        const t = performance.now();
        await op(i);
        lat.push(performance.now() - t);
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  return {
    latency: stats(lat),
    ops_per_s: Math.round((n / seconds) * 10) / 10,
    seconds: Math.round(seconds * 1000) / 1000,
  };
}

/** The REST API's targets, per operation. */
const TARGETS = { pset_ops_per_s: 5000, pset_p99_ms: 5, job_ops_per_s: 1000 };

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      iterations: { type: 'string' },
      concurrency: { type: 'string', default: '8,64' },
      members: { type: 'string', default: '4' },
      quick: { type: 'boolean', default: false },
      memory: { type: 'boolean', default: false },
    },
  });
  const N = Math.min(100_000, Number(values.iterations ?? (values.quick ? 200 : 2000)));
  const concs = values.concurrency!.split(',').map((c) => Math.max(1, Math.min(64, Number(c))));
  const C = Math.max(...concs);
  const M = Math.max(1, Math.min(64, Number(values.members)));
  // As the plugin runs it: psets and job history written to SQLite as they change.
  const stateDir = values.memory ? undefined : mkdtempSync(join(tmpdir(), 'dask-pmix-bench-'));
  let serve: ServeChild | undefined;
  try {
    serve = await startServe({
      viaBin: true,
      logLevel: 'error',
      args: [
        '--max-jobs',
        '1000',
        '--max-psets',
        '1000000',
        '--no-pmi',
        '--pool-size',
        '0',
        ...(stateDir ? ['--state-dir', stateDir] : []),
      ],
      token: TOKEN,
      env: { DASK_PMIX_NO_SETUP: '1' },
      startMs: 30_000,
    });
    const base = serve.url;
    const host = hostname();
    const workers = Array.from({ length: M * C }, (_, i) => `tcp://bench:${i}`);
    for (const id of workers)
      await must(
        base,
        'POST',
        '/v1/workers',
        { id, host, pid: process.pid, uid: process.getuid!(), gid: process.getgid!() },
        201,
      );
    // Warm up the code paths and the connection pool.
    for (let i = 0; i < 200; i++) {
      await must(base, 'POST', '/v1/psets', { name: `warm${i}`, members: [workers[0]] }, 201);
      await must(base, 'DELETE', `/v1/psets/warm${i}`, undefined, 200);
    }

    const results: Record<
      string,
      { ops_per_s: number; latency: Stats; health_ops_per_s?: number; health_p50_ms?: number }
    > = {};
    const pset = (slot: number) => workers.slice(slot * M, slot * M + M);
    // Each measurement between two runs of its baseline (the cheapest route, same connections),
    // so that a burst of load on the shared machine during one of them weighs half.
    const health = (n: number, conc: number) =>
      run(Math.min(n, 200), conc, () => must(base, 'GET', '/v1/health', undefined, 200));
    const measure = async (name: string, n: number, conc: number, op: (i: number) => Promise<void>) => {
      const before = await health(n, conc);
      const r = await run(n, conc, op);
      const after = await health(n, conc);
      results[name] = {
        ...r,
        health_ops_per_s: Math.round((before.ops_per_s + after.ops_per_s) * 5) / 10,
        health_p50_ms: Math.round((before.latency.p50_ms + after.latency.p50_ms) * 500) / 1000,
      };
    };
    const labels: [string, number][] = [
      ['sequential', 1],
      ...concs.map((c): [string, number] => [`concurrency_${c}`, c]),
    ];
    // Sequential: latency without queueing; in flight: throughput.
    for (const [label, conc] of labels) {
      await measure(`pset_define_${label}`, N, conc, (i) =>
        must(base, 'POST', '/v1/psets', { name: `b${label}${i}`, members: pset(i % C) }, 201),
      );
      await measure(`pset_delete_${label}`, N, conc, (i) =>
        must(base, 'DELETE', `/v1/psets/b${label}${i}`, undefined, 200),
      );
    }
    // Jobs: each worker is in at most one active job, so each in-flight slot owns M workers.
    const jobN = Math.max(1, Math.floor(N / 4));
    for (const [label, conc] of labels) {
      const free: number[] = Array.from({ length: conc }, (_, s) => s);
      await measure(`job_create_delete_${label}`, jobN, conc, async () => {
        const slot = free.pop()!;
        const job = await must(base, 'POST', '/v1/jobs', { impl: 'openmpi', members: pset(slot) }, 201);
        await must(base, 'DELETE', `/v1/jobs/${job.id}`, undefined, 200);
        free.push(slot);
      });
    }
    // The member environment (PMIx_server_setup_fork + overrides), as every joining worker asks.
    const job = await must(base, 'POST', '/v1/jobs', { impl: 'openmpi', members: pset(0) }, 201);
    await measure('member_env_sequential', N, 1, (i) =>
      must(base, 'GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(pset(0)[i % M]!)}`, undefined, 200),
    );
    await measure('job_get_sequential', N, 1, () => must(base, 'GET', `/v1/jobs/${job.id}`, undefined, 200));
    await must(base, 'DELETE', `/v1/jobs/${job.id}`, undefined, 200);

    // Against the targets: ratio = ours / target for throughput, target / ours for p99 (>= 1 is met).
    const r2 = (x: number) => Math.round(x * 100) / 100;
    const targets: Record<string, unknown> = {};
    for (const [label] of labels) {
      for (const op of ['pset_define', 'pset_delete']) {
        const r = results[`${op}_${label}`]!;
        targets[`${op}_${label}`] = {
          ops_per_s: r.ops_per_s,
          target_ops_per_s: TARGETS.pset_ops_per_s,
          ratio: r2(r.ops_per_s / TARGETS.pset_ops_per_s),
          p99_ms: r.latency.p99_ms,
          target_p99_ms: TARGETS.pset_p99_ms,
          p99_ratio: r2(TARGETS.pset_p99_ms / r.latency.p99_ms),
        };
      }
      const j = results[`job_create_delete_${label}`]!;
      // Each pair is two job operations (a create and a delete).
      targets[`job_ops_${label}`] = {
        ops_per_s: r2(j.ops_per_s * 2),
        target_ops_per_s: TARGETS.job_ops_per_s,
        ratio: r2((j.ops_per_s * 2) / TARGETS.job_ops_per_s),
      };
    }

    process.stdout.write(
      `${JSON.stringify(
        {
          benchmark: 'rest',
          when: new Date().toISOString(),
          machine: {
            cpus: cpus().length,
            model: cpus()[0]?.model ?? '',
            node: process.version,
            load: loadavg().map(r2),
          },
          params: {
            iterations: N,
            job_iterations: jobN,
            concurrency: concs,
            job_members: M,
            state_dir: Boolean(stateDir),
            transport: 'HTTP/1.1 keep-alive over 127.0.0.1',
          },
          notes: {
            pset_define: 'POST /v1/psets with an explicit member list (written to SQLite with --state-dir)',
            pset_delete: 'DELETE /v1/psets/{name}',
            job_create_delete: `one op = POST /v1/jobs (impl openmpi, ${M} members: a PMIx namespace and ${M} clients registered in libpmix) + DELETE /v1/jobs/{id} (abort, deregister, unfreeze)`,
            job_ops: 'job operations per second: two per create+delete pair',
            member_env: 'GET /v1/jobs/{id}/env/{workerId} (PMIx_server_setup_fork + overrides)',
            health_ops_per_s:
              'GET /v1/health at the same concurrency right before and after the measurement (means of ops/s and of p50): the baseline of guard.ratios (health_p50_ms / latency.p50_ms)',
            client: 'the benchmark client (node:http with a keep-alive agent) runs on the same 2 cores as the sidecar',
          },
          results,
          targets,
          // Medians, not throughput: one stall of the shared machine in a short run moves ops/s a lot.
          guard: guardSection(
            Object.fromEntries(Object.entries(results).map(([k, r]) => [k, r.health_p50_ms! / r.latency.p50_ms])),
          ),
        },
        null,
        2,
      )}\n`,
    );
  } finally {
    const child = serve?.child;
    if (child) {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
    agent.destroy();
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench/rest: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exitCode = 1;
});
