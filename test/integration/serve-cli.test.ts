// `bin/dask-pmix serve` as an operator runs it: flags and env, the token, and SIGTERM (refuse new
// jobs, abort running ones with notice, finalize PMIx, exit 0).
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { startServe } from '../../bench/lib/sidecar.js';
import { bin } from '../helpers/build-clients.js';
import { restClient, SERVE_START_MS, until } from '../helpers/http.js';
import { ROOT } from '../helpers/paths.js';
import { startRank } from '../helpers/ranks.js';

describe('dask-pmix serve', () => {
  it('serves the routes with a token, and on SIGTERM aborts running jobs and exits 0', async () => {
    const serve = await startServe({
      viaBin: true,
      args: ['--wiring-timeout', '30'],
      token: 'tok',
      stderr: 'pipe',
      startMs: SERVE_START_MS,
    });
    const { child, url } = serve;
    const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
    try {
      const anon = restClient(url);
      const api = restClient(url, 'tok');
      expect((await anon('GET', '/v1/health')).body).toMatchObject({
        status: 'ok',
        impls: expect.arrayContaining(['openmpi']),
      });
      const w = { id: 'w', host: hostname(), pid: process.pid, uid: process.getuid!(), gid: process.getgid!() };
      expect((await anon('POST', '/v1/workers', w)).status).toBe(401);
      expect((await api('POST', '/v1/workers', w)).status).toBe(201);
      const job = (await api('POST', '/v1/jobs', { impl: 'openmpi', members: ['w'] })).body;
      const env = (await api('GET', `/v1/jobs/${job.id}/env/w`)).body.env;
      const rank = startRank(bin('pmix_client'), ['hang'], env, 30_000);
      await rank.waitFor((l) => l.init === true);
      expect((await anon('GET', `/v1/jobs/${job.id}`)).status).toBe(401);
      await until(async () => (await api('GET', `/v1/jobs/${job.id}`)).body.state === 'running', 10_000, 'running');

      // Watch the event stream across the shutdown.
      const events = await fetch(`${url}/v1/events`, { headers: { authorization: 'Bearer tok' } });
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
      expect(await exited, serve.err).toBe(0);
      await drained;
      expect(text).toMatch(/"to":"aborted","reason":"the sidecar received SIGTERM"/);
      rank.kill();
    } finally {
      child.kill('SIGKILL');
    }
  }, 120_000);

  it('is never open by default: the token comes from a file (not argv), or is generated into the state dir', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-auth-'));
    const started: ChildProcess[] = [];
    const serve = async (args: string[]) => {
      const s = await startServe({
        viaBin: true,
        args: ['--no-pmi', ...args],
        token: '',
        env: { DASK_PMIX_NO_SETUP: '1' },
        stderr: 'pipe',
        startMs: SERVE_START_MS,
      });
      started.push(s.child);
      return s;
    };
    try {
      writeFileSync(join(dir, 'given'), 'from-a-file\n', { mode: 0o600 });
      const a = await serve(['--token-file', join(dir, 'given')]);
      expect((await restClient(a.url)('GET', '/v1/workers')).status).toBe(401);
      expect((await restClient(a.url, 'from-a-file')('GET', '/v1/workers')).status).toBe(200);
      expect(readFileSync(`/proc/${a.child.pid}/cmdline`, 'utf8')).not.toContain('from-a-file');

      const b = await serve(['--state-dir', join(dir, 'state')]);
      const file = join(dir, 'state', 'token');
      expect(statSync(file).mode & 0o777).toBe(0o600);
      const generated = readFileSync(file, 'utf8').trim();
      expect(generated.length).toBeGreaterThanOrEqual(32);
      expect((await restClient(b.url)('POST', '/v1/psets', { name: 'x', members: ['y'] })).status).toBe(401);
      expect((await restClient(b.url, generated)('GET', '/v1/psets')).status).toBe(200);

      const c = await serve(['--no-auth']);
      expect((await restClient(c.url)('GET', '/v1/psets')).status).toBe(200);
    } finally {
      for (const c of started) c.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);

  it('exits non-zero with the reason when its port is taken', async () => {
    const { createServer } = await import('node:net');
    const blocker = createServer();
    await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', r));
    const port = (blocker.address() as { port: number }).port;
    try {
      const child = spawn(join(ROOT, 'bin', 'dask-pmix'), ['serve', '--port', String(port), '--log-level', 'silent'], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
      expect(code).not.toBe(0);
      expect(err).toMatch(/EADDRINUSE/);
    } finally {
      blocker.close();
    }
  });

  it('rejects bad flags', async () => {
    const child = spawn(join(ROOT, 'bin', 'dask-pmix'), ['serve', '--port', 'many'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
    expect(code).not.toBe(0);
    expect(err).toMatch(/--port must be a non-negative number/);
  });

  it('with --parent-pid, stops when that process is gone', async () => {
    // A parent shell starts the sidecar and exits at once, as a scheduler killed outright would.
    const shell = spawn(
      'bash',
      [
        '-c',
        `"${join(ROOT, 'bin', 'dask-pmix')}" serve --port 0 --log-level warn --parent-pid $$ >/dev/null 2>&1 & echo $!; sleep 1`,
      ],
      {
        env: { ...process.env, DASK_PMIX_NO_SETUP: '1' },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
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
