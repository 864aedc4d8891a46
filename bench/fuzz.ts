// REST fuzzing, the long run: schemathesis (PyPI, in .venv-fuzz) drives every operation of the
// sidecar's OpenAPI document (examples, coverage, fuzzing and stateful phases) against a real
// `dask-pmix serve` with a state directory, with more examples per operation than the test
// command's run (test/api/schemathesis.test.ts), and with 16 workers registered first (so that
// generated jobs and psets can succeed and reach the PMIx and PMI backends, not only validation).
// Every response schemathesis got is read back from its HAR report and counted by status, per
// operation of the document: the result is the count of 5xx (the target: 0), which operations
// never answered 2xx (the fuzz did not reach their logic), whether the sidecar still answers, and
// its RSS before and after.
//
//   node dist/bench/fuzz.js [--max-examples N] [--seed S] > bench/results/fuzz.json
//
// The event stream is left out (it never ends); its errors are fuzzed in test/api.
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, hostname, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs, promisify } from 'node:util';
import { ROOT } from './lib/run.js';
import { SidecarProcess } from './lib/sidecar.js';

const SCHEMATHESIS = join(ROOT, '.venv-fuzz', 'bin', 'schemathesis');

interface HarEntry {
  request: { method: string; url: string };
  response: { status: number };
}

type Operation = { method: string; template: string; match: RegExp };

function operationsOf(doc: { paths: Record<string, Record<string, unknown>> }): Operation[] {
  const ops: Operation[] = [];
  for (const [template, methods] of Object.entries(doc.paths)) {
    const re = new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^}]+\\?\}/g, '[^/]+')}$`);
    for (const method of Object.keys(methods)) ops.push({ method: method.toUpperCase(), template, match: re });
  }
  return ops;
}

/** Status counts per operation of the document ("other": requests to no documented operation). */
function byOperation(entries: HarEntry[], ops: Operation[]): Record<string, Record<string, number>> {
  const out: Record<string, Record<string, number>> = {};
  for (const e of entries) {
    const path = new URL(e.request.url).pathname;
    const op = ops.find((o) => o.method === e.request.method && o.match.test(path));
    const key = op ? `${op.method} ${op.template}` : 'other';
    const status = String(e.response.status);
    (out[key] ??= {})[status] = (out[key]![status] ?? 0) + 1;
  }
  return out;
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: { 'max-examples': { type: 'string', default: '100' }, seed: { type: 'string' } },
  });
  const maxExamples = Number(values['max-examples']);
  const seed = Number(values.seed ?? Date.now() % 1_000_000);
  const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-fuzz-'));
  const sidecar = await SidecarProcess.start(['--pool-size', '0', '--state-dir', join(dir, 'state')]);
  try {
    const host = hostname();
    for (let i = 0; i < 16; i++) {
      await sidecar.must(
        'POST',
        '/v1/workers',
        {
          id: `tcp://fuzz:${i}`,
          host,
          pid: process.pid,
          uid: process.getuid!(),
          gid: process.getgid!(),
          tags: [i % 2 ? 'odd' : 'even'],
        },
        201,
      );
    }
    // Operations on a job or a pool seat need ids that exist, which nothing in the document links to
    // (schemathesis reports them as "missing test data"): a job of four workers is created first and
    // its id and a member's are given for those operations; their bodies and queries stay generated.
    const job = await sidecar.must(
      'POST',
      '/v1/jobs',
      { impl: 'openmpi', members: ['tcp://fuzz:0', 'tcp://fuzz:1', 'tcp://fuzz:2', 'tcp://fuzz:3'] },
      201,
    );
    writeFileSync(
      join(dir, 'schemathesis.toml'),
      [
        '[[operations]]',
        "include-path-regex = '^/v1/jobs/[{]id[}]/(members|env)/'",
        `parameters = { "path.id" = "${job.id}", "path.workerId" = "tcp://fuzz:1" }`,
        '',
        '[[operations]]',
        "include-path-regex = '^/v1/workers/[{]id[}]/pool'",
        'parameters = { "path.id" = "tcp://fuzz:5" }',
        '',
      ].join('\n'),
    );
    const doc = (await sidecar.must('GET', '/openapi.json', undefined, 200)) as {
      paths: Record<string, Record<string, unknown>>;
    };
    const rssBefore = await sidecar.settledRssKb();
    const t0 = performance.now();
    // Asynchronously: the sidecar's keep-alive sockets must be seen closing meanwhile.
    const run = await promisify(execFile)(
      SCHEMATHESIS,
      [
        'run',
        `${sidecar.url}/openapi.json`,
        '-H',
        `Authorization: Bearer ${sidecar.token}`,
        '--checks',
        'not_a_server_error',
        '--exclude-path',
        '/v1/events',
        '--max-examples',
        String(maxExamples),
        '--seed',
        String(seed),
        '--workers',
        '1',
        '--request-timeout',
        '20',
        '--no-color',
        '--suppress-health-check',
        'filter_too_much',
        '--report',
        'har',
        '--report-har-path',
        join(dir, 'run.har'),
      ],
      {
        encoding: 'utf8',
        timeout: 3_600_000,
        cwd: dir,
        env: { ...process.env, SCHEMATHESIS_HOOKS: '' },
        maxBuffer: 64 << 20,
      },
    ).then(
      (r) => ({ status: 0, ...r }),
      (e: { code?: number; stdout?: string; stderr?: string }) => ({
        status: e.code ?? null,
        stdout: e.stdout ?? '',
        stderr: e.stderr ?? '',
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const text = `${run.stdout}\n${run.stderr}`;
    const summary = /(\d+) generated, (\d+) passed/.exec(text);
    if (!existsSync(join(dir, 'run.har')))
      throw new Error(`schemathesis ran nothing (exit ${run.status}): ${text.slice(-3000)}`);
    const har = JSON.parse(readFileSync(join(dir, 'run.har'), 'utf8')) as { log: { entries: HarEntry[] } };
    const perOp = byOperation(har.log.entries, operationsOf(doc));
    const serverErrors = har.log.entries
      .filter((e) => e.response.status >= 500 || e.response.status === 0)
      .map((e) => ({ method: e.request.method, path: new URL(e.request.url).pathname, status: e.response.status }));
    const classes: Record<string, number> = {};
    for (const e of har.log.entries)
      classes[`${Math.floor(e.response.status / 100)}xx`] =
        (classes[`${Math.floor(e.response.status / 100)}xx`] ?? 0) + 1;
    const documented = Object.keys(perOp).filter((k) => k !== 'other');
    const health = await sidecar.call('GET', '/v1/health');
    const report = {
      benchmark: 'fuzz',
      tool:
        /schemathesis, version (\S+)/.exec(
          (await promisify(execFile)(SCHEMATHESIS, ['--version'], { encoding: 'utf8' })).stdout,
        )?.[1] ?? null,
      seed,
      max_examples: maxExamples,
      cpus: cpus().length,
      load_average: loadavg(),
      workers_registered_first: 16,
      schemathesis_exit: run.status,
      test_cases: summary ? { generated: Number(summary[1]), passed: Number(summary[2]) } : null,
      requests: har.log.entries.length,
      responses_by_class: classes,
      server_errors: serverErrors.length,
      server_error_samples: serverErrors.slice(0, 20),
      operations_in_document: operationsOf(doc).filter((o) => o.template !== '/v1/events').length,
      operations_requested: documented.length,
      operations_never_2xx: documented.filter((k) => !Object.keys(perOp[k]!).some((st) => st.startsWith('2'))),
      statuses_by_operation: perOp,
      seconds: Math.round(seconds * 10) / 10,
      sidecar_answers_after: health.status === 200,
      sidecar_rss_mb: {
        before: Math.round(rssBefore / 102.4) / 10,
        after: Math.round((await sidecar.settledRssKb()) / 102.4) / 10,
      },
      warnings: text
        .split('\n')
        .filter((l) => l.includes('⚠️'))
        .map((l) => l.trim()),
    };
    console.log(JSON.stringify(report, null, 2));
    return run.status === 0 && serverErrors.length === 0 && report.sidecar_answers_after ? 0 : 1;
  } finally {
    await sidecar.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
