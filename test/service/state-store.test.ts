// The state store's files (issue 31): state.db and SQLite's -wal and -shm hold the PMIx
// namespaces of running jobs, so they are 0600 whatever the state directory's mode, and a
// directory that others can read is warned about.
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultPolicy } from '../../src/policy/index.js';
import { ManualClock, ResourceManager } from '../../src/rm/index.js';
import type { Job } from '../../src/rm/types.js';
import { persist } from '../../src/service/persistence.js';
import { ompiJobId } from '../../src/service/shm-cleanup.js';
import { StateStore } from '../../src/store/state-store.js';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function capture(): { log: pino.Logger; lines: { level: number; msg: string; mode?: string }[] } {
  const lines: { level: number; msg: string; mode?: string }[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l));
      done();
    },
  });
  return { log: pino({ level: 'info' }, stream), lines };
}

function modes(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const f of ['state.db', 'state.db-wal', 'state.db-shm'])
    out[f] = (statSync(join(dir, f)).mode & 0o777).toString(8);
  return out;
}

function write(store: StateStore): void {
  store.savePset({ name: 'p', members: ['w1'] } as never);
  store.saveJob({ id: 'j1', namespace: 'dask-pmix.j1', state: 'running' } as unknown as Job);
}

describe('the state store', () => {
  it('keeps state.db, -wal and -shm 0600 in an existing 0755 directory, and warns about the directory', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'state-'));
    dirs.push(dir);
    chmodSync(dir, 0o755);
    const { log, lines } = capture();
    const store = StateStore.open(dir, log);
    write(store);
    expect(modes(dir)).toEqual({ 'state.db': '600', 'state.db-wal': '600', 'state.db-shm': '600' });
    store.close();
    await new Promise((r) => setImmediate(r));
    const warn = lines.filter((l) => l.level === 40);
    expect(warn).toHaveLength(1);
    expect(warn[0]!.mode).toBe('0755');
    expect(warn[0]!.msg).toContain(`the state directory ${dir} is open to other users (mode 0755)`);
  });

  it('makes files an earlier run left 0644 0600, and says nothing of a 0700 directory', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'state-')), 'new');
    dirs.push(dir);
    const first = StateStore.open(dir);
    write(first);
    first.close();
    expect((statSync(dir).mode & 0o777).toString(8)).toBe('700');
    chmodSync(join(dir, 'state.db'), 0o644);
    writeFileSync(join(dir, 'state.db-wal'), '');
    chmodSync(join(dir, 'state.db-wal'), 0o644);
    const { log, lines } = capture();
    const store = StateStore.open(dir, log);
    write(store);
    expect(modes(dir)).toEqual({ 'state.db': '600', 'state.db-wal': '600', 'state.db-shm': '600' });
    expect(store.jobs().map((j) => j.id)).toEqual(['j1']);
    store.close();
    await new Promise((r) => setImmediate(r));
    expect(lines.filter((l) => l.level >= 40)).toEqual([]);
  });

  it('creates a missing directory 0700', () => {
    const parent = mkdtempSync(join(tmpdir(), 'state-'));
    dirs.push(parent);
    mkdirSync(join(parent, 'a'));
    const store = StateStore.open(join(parent, 'a', 'b'));
    store.close();
    expect((statSync(join(parent, 'a', 'b')).mode & 0o777).toString(8)).toBe('700');
  });

  it("removes the shared memory of an earlier run's pool epochs at a restart, whatever ran then", async () => {
    // A sidecar killed with no in-process job running: its pool's workers are all replaced and
    // cannot finalize (their PMIx server is gone), so their segments are the restart's to remove.
    const dir = mkdtempSync(join(tmpdir(), 'state-'));
    const shm = mkdtempSync(join(tmpdir(), 'shm-'));
    dirs.push(dir, shm);
    const rm = () => new ResourceManager({ clock: new ManualClock(), policy: defaultPolicy() });
    const pool = 'dask-pmix.pool-78f2.0';
    const seat = { epoch: 0, namespace: pool, rank: 0, state: 'ready' as const };
    const r1 = rm();
    const again = await persist(r1, dir, undefined, shm);
    if (again instanceof Error) throw again;
    r1.events.emit({ kind: 'workerPoolChanged', workerId: 'w0', pool: seat });
    r1.events.emit({ kind: 'workerPoolChanged', workerId: 'w1', pool: { ...seat, rank: 1 } });
    again.stop();
    const id = ompiJobId(pool);
    const files = [`sm_segment.dask-pmix-cohort0.0.${id}.0`, `sm_segment.dask-pmix-cohort0.0.${id}.1`];
    const other = `sm_segment.dask-pmix-cohort0.0.${ompiJobId('dask-pmix.pool-aaaa.0')}.0`;
    for (const f of [...files, other]) writeFileSync(join(shm, f), '');
    const restarted = await persist(rm(), dir, undefined, shm);
    if (restarted instanceof Error) throw restarted;
    expect(restarted.restored.shmRemoved.sort()).toEqual(files);
    expect(restarted.store.pools()).toEqual([]); // each run's epochs are removed once
    restarted.stop();
    expect(statSync(join(shm, other)).isFile()).toBe(true);
  });
});
