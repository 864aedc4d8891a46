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
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { cpus, hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { guardSection } from './lib/guard.js';

function root(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || existsSync(join(dir, 'CMakeLists.txt'))) dir = dirname(dir);
  return dir;
}

interface Stats { n: number; p50_ms: number; p90_ms: number; p99_ms: number; max_ms: number; mean_ms: number }

function stats(samples: number[]): Stats {
  const s = [...samples].sort((a, b) => a - b);
  const q = (p: number) => s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? 0;
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return { n: s.length, p50_ms: r(q(0.5)), p90_ms: r(q(0.9)), p99_ms: r(q(0.99)), max_ms: r(s.at(-1) ?? 0), mean_ms: r(s.reduce((a, b) => a + b, 0) / (s.length || 1)) };
}

const TOKEN = randomBytes(24).toString('base64url');

async function call(base: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

async function must(base: string, method: string, path: string, body: unknown, want: number): Promise<any> {
  const r = await call(base, method, path, body);
  if (r.status !== want) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.json)}`);
  return r.json;
}

/** Runs `op(i)` `n` times with `concurrency` in flight; per-op latencies and total throughput. */
async function run(n: number, concurrency: number, op: (i: number) => Promise<void>): Promise<{ latency: Stats; ops_per_s: number; seconds: number }> {
  const lat: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < n; i = next++) {
      const t = performance.now();
      await op(i);
      lat.push(performance.now() - t);
    }
  }));
  const seconds = (performance.now() - t0) / 1000;
  return { latency: stats(lat), ops_per_s: Math.round((n / seconds) * 10) / 10, seconds: Math.round(seconds * 1000) / 1000 };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { iterations: { type: 'string' }, concurrency: { type: 'string', default: '8' }, members: { type: 'string', default: '4' }, quick: { type: 'boolean', default: false } },
  });
  const N = Math.min(100_000, Number(values.iterations ?? (values.quick ? 200 : 1000)));
  const C = Math.max(1, Math.min(64, Number(values.concurrency)));
  const M = Math.max(1, Math.min(64, Number(values.members)));
  const child = spawn(join(root(), 'bin', 'dask-pmix'), ['serve', '--port', '0', '--log-level', 'error', '--max-jobs', '1000', '--no-pmi'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, DASK_PMIX_NO_SETUP: '1', DASK_PMIX_TOKEN: TOKEN },
  });
  try {
    const base = await new Promise<string>((resolve, reject) => {
      let out = '';
      const t = setTimeout(() => reject(new Error('the sidecar did not start')), 30_000);
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        const m = /listening on (http:\/\/\S+)/.exec(out);
        if (m) { clearTimeout(t); resolve(m[1]!); }
      });
      child.on('exit', (code) => reject(new Error(`the sidecar exited with ${code}`)));
    });
    const host = hostname();
    const workers = Array.from({ length: M * C }, (_, i) => `tcp://bench:${i}`);
    for (const id of workers) await must(base, 'POST', '/v1/workers', { id, host, pid: process.pid, uid: process.getuid!(), gid: process.getgid!() }, 201);
    // Warm up the code paths and the connection pool.
    for (let i = 0; i < 50; i++) {
      await must(base, 'POST', '/v1/psets', { name: `warm${i}`, members: [workers[0]] }, 201);
      await must(base, 'DELETE', `/v1/psets/warm${i}`, undefined, 200);
    }

    const results: Record<string, { ops_per_s: number; latency: Stats; health_ops_per_s?: number; health_p50_ms?: number }> = {};
    const pset = (slot: number) => workers.slice(slot * M, slot * M + M);
    // Each measurement between two runs of its baseline (the cheapest route, same connections),
    // so that a burst of load on the shared machine during one of them weighs half.
    const health = (n: number, conc: number) => run(Math.min(n, 200), conc, () => must(base, 'GET', '/v1/health', undefined, 200));
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
    // Sequential: latency without queueing; concurrent: throughput.
    for (const [label, conc] of [['sequential', 1], [`concurrency_${C}`, C]] as const) {
      await measure(`pset_define_${label}`, N, conc, (i) => must(base, 'POST', '/v1/psets', { name: `b${label}${i}`, members: pset(i % C) }, 201));
      await measure(`pset_delete_${label}`, N, conc, (i) => must(base, 'DELETE', `/v1/psets/b${label}${i}`, undefined, 200));
    }
    // Jobs: each worker is in at most one active job, so each in-flight slot owns M workers.
    const jobN = Math.max(1, Math.floor(N / 4));
    for (const [label, conc] of [['sequential', 1], [`concurrency_${C}`, C]] as const) {
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
    await measure('member_env_sequential', N, 1, (i) => must(base, 'GET', `/v1/jobs/${job.id}/env/${encodeURIComponent(pset(0)[i % M]!)}`, undefined, 200));
    await measure('job_get_sequential', N, 1, () => must(base, 'GET', `/v1/jobs/${job.id}`, undefined, 200));
    await must(base, 'DELETE', `/v1/jobs/${job.id}`, undefined, 200);

    process.stdout.write(JSON.stringify({
      benchmark: 'rest',
      when: new Date().toISOString(),
      machine: { cpus: cpus().length, model: cpus()[0]?.model ?? '', node: process.version },
      params: { iterations: N, job_iterations: jobN, concurrency: C, job_members: M, transport: 'HTTP/1.1 keep-alive over 127.0.0.1' },
      notes: {
        pset_define: 'POST /v1/psets with an explicit member list',
        pset_delete: 'DELETE /v1/psets/{name}',
        job_create_delete: `one op = POST /v1/jobs (impl openmpi, ${M} members: a PMIx namespace and ${M} clients registered in libpmix) + DELETE /v1/jobs/{id} (abort, deregister, unfreeze)`,
        member_env: 'GET /v1/jobs/{id}/env/{workerId} (PMIx_server_setup_fork + overrides)',
        health_ops_per_s: 'GET /v1/health at the same concurrency right before and after the measurement (means of ops/s and of p50): the baseline of guard.ratios (health_p50_ms / latency.p50_ms)',
      },
      results,
      // Medians, not throughput: one stall of the shared machine in a short run moves ops/s a lot.
      guard: guardSection(Object.fromEntries(Object.entries(results).map(([k, r]) => [k, r.health_p50_ms! / r.latency.p50_ms]))),
    }, null, 2) + '\n');
  } finally {
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench/rest: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exitCode = 1;
});
