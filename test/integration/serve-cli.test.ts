// `bin/dask-pmix serve` as an operator runs it: flags and env, the token, and SIGTERM (refuse new
// jobs, abort running ones with notice, finalize PMIx, exit 0).
import { spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { bin } from '../helpers/build-clients.js';
import { restClient, until } from '../helpers/http.js';
import { ROOT } from '../helpers/paths.js';
import { startRank } from '../helpers/ranks.js';

describe('dask-pmix serve', () => {
  it('serves the routes with a token, and on SIGTERM aborts running jobs and exits 0', async () => {
    const child = spawn(join(ROOT, 'bin', 'dask-pmix'), ['serve', '--port', '0', '--log-level', 'warn', '--wiring-timeout', '30'], {
      env: { ...process.env, DASK_PMIX_TOKEN: 'tok' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    try {
      const url = await until(() => /listening on (http:\/\/\S+)/.exec(out)?.[1], 20_000, `the listening line (stderr: ${err})`);
      const anon = restClient(url);
      const api = restClient(url, 'tok');
      expect((await anon('GET', '/v1/health')).body).toMatchObject({ status: 'ok', impls: expect.arrayContaining(['openmpi']) });
      expect((await anon('POST', '/v1/workers', { id: 'w', host: hostname() })).status).toBe(401);
      expect((await api('POST', '/v1/workers', { id: 'w', host: hostname() })).status).toBe(201);
      const job = (await api('POST', '/v1/jobs', { impl: 'openmpi', members: ['w'] })).body;
      const env = (await api('GET', `/v1/jobs/${job.id}/env/w`)).body.env;
      const rank = startRank(bin('pmix_client'), ['hang'], env, 30_000);
      await rank.waitFor((l) => l.init === true);
      await until(async () => (await anon('GET', `/v1/jobs/${job.id}`)).body.state === 'running', 10_000, 'running');

      // Watch the event stream across the shutdown.
      const events = await fetch(`${url}/v1/events`);
      const reader = events.body!.getReader();
      let text = '';
      const drained = (async () => {
        for (;;) {
          const { done, value } = await reader.read().catch(() => ({ done: true, value: undefined }));
          if (done) break;
          text += Buffer.from(value!).toString();
        }
      })();
      child.kill('SIGTERM');
      expect(await exited, err).toBe(0);
      await drained;
      expect(text).toMatch(/"to":"aborted","reason":"the sidecar received SIGTERM"/);
      rank.kill();
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('exits non-zero with the reason when its port is taken', async () => {
    const { createServer } = await import('node:net');
    const blocker = createServer();
    await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', r));
    const port = (blocker.address() as { port: number }).port;
    try {
      const child = spawn(join(ROOT, 'bin', 'dask-pmix'), ['serve', '--port', String(port), '--log-level', 'silent'], { stdio: ['ignore', 'pipe', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
      expect(code).not.toBe(0);
      expect(err).toMatch(/EADDRINUSE/);
    } finally {
      blocker.close();
    }
  });

  it('rejects bad flags', async () => {
    const child = spawn(join(ROOT, 'bin', 'dask-pmix'), ['serve', '--port', 'many'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
    expect(code).not.toBe(0);
    expect(err).toMatch(/--port must be a non-negative number/);
  });

  it('with --parent-pid, stops when that process is gone', async () => {
    // A parent shell starts the sidecar and exits at once, as a scheduler killed outright would.
    const shell = spawn('bash', ['-c', `"${join(ROOT, 'bin', 'dask-pmix')}" serve --port 0 --log-level warn --parent-pid $$ >/dev/null 2>&1 & echo $!; sleep 1`], {
      env: { ...process.env, DASK_PMIX_NO_SETUP: '1' },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    shell.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise((r) => shell.on('exit', r));
    const pid = Number(out.trim());
    expect(pid).toBeGreaterThan(0);
    const alive = () => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    await until(() => (alive() ? undefined : true), 15_000, 'the orphaned sidecar to exit');
  });
});
