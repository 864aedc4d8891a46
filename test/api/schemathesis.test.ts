// REST fuzzing driven by the OpenAPI document: schemathesis (PyPI, in .venv-fuzz) generates
// requests for every operation (examples, coverage, fuzzing and stateful phases) against a real
// `dask-pmix serve` with a state directory, and fails on any 5xx. The event stream is left out
// (it never ends); its errors are fuzzed in events.test.ts and fuzz.test.ts.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { type ServeChild, startServe } from '../../bench/lib/sidecar.js';
import { SERVE_START_MS } from '../helpers/http.js';
import { ROOT } from '../helpers/paths.js';

const SEED = Number(process.env.DASK_PMIX_FUZZ_SEED ?? Date.now() % 1_000_000);

it(`schemathesis finds no 5xx in the REST API (seed ${SEED})`, { timeout: 600_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-schemathesis-'));
  let serve: ServeChild | undefined;
  try {
    serve = await startServe({
      logLevel: 'error',
      args: ['--no-pmi', '--pool-size', '0', '--state-dir', dir],
      token: 'fuzz',
      startMs: SERVE_START_MS,
    });
    const { url } = serve;
    const run = spawnSync(
      join(ROOT, '.venv-fuzz', 'bin', 'schemathesis'),
      [
        'run',
        `${url}/openapi.json`,
        '-H',
        'Authorization: Bearer fuzz',
        '--checks',
        'not_a_server_error',
        '--exclude-path',
        '/v1/events',
        '--max-examples',
        '15',
        '--seed',
        String(SEED),
        '--workers',
        '1',
        '--request-timeout',
        '20',
        '--no-color',
      ],
      { encoding: 'utf8', timeout: 540_000, cwd: dir, env: { ...process.env, SCHEMATHESIS_HOOKS: '' } },
    );
    const text = `${run.stdout}\n${run.stderr}`;
    const m = /(\d+) generated, (\d+) passed/.exec(text);
    expect(run.status, text.slice(-4000)).toBe(0);
    expect(m, text.slice(-2000)).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThan(200);
    expect(m![2]).toBe(m![1]);
    // The sidecar is still there.
    expect((await fetch(`${url}/v1/health`)).status).toBe(200);
  } finally {
    serve?.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});
