// What outlives the sidecar process: process set definitions and the job history, in SQLite
// (better-sqlite3) in the state directory. Each change is its own transaction, written before the
// REST answer leaves, so a kill -9 loses nothing that was acknowledged: a committed write is in
// the kernel's page cache at once. No fsync (synchronous=OFF): a power cut may lose the last
// changes, a process crash does not, and an fsync under load stalled requests for tens of ms.

import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import type { Job, ProcessSet } from '../rm/types.js';

const SCHEMA = `
CREATE TABLE IF NOT EXISTS psets (name TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, record TEXT NOT NULL);
`;

export class StateStore {
  private readonly db: Database.Database;
  private readonly putPset: Database.Statement<[string, string]>;
  private readonly dropPset: Database.Statement<[string]>;
  private readonly putJob: Database.Statement<[string, string]>;
  private readonly dropJob: Database.Statement<[string]>;

  private constructor(readonly path: string) {
    this.db = new Database(path);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = OFF');
    this.db.exec(SCHEMA);
    this.putPset = this.db.prepare(
      'INSERT INTO psets (name, record) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET record = excluded.record',
    );
    this.dropPset = this.db.prepare('DELETE FROM psets WHERE name = ?');
    this.putJob = this.db.prepare(
      'INSERT INTO jobs (id, record) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET record = excluded.record',
    );
    this.dropJob = this.db.prepare('DELETE FROM jobs WHERE id = ?');
  }

  /** Opens (or creates) `dir`/state.db. */
  static open(dir: string): StateStore {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    return new StateStore(join(dir, 'state.db'));
  }

  psets(): ProcessSet[] {
    return this.db
      .prepare<[], { record: string }>('SELECT record FROM psets ORDER BY rowid')
      .all()
      .map((r) => JSON.parse(r.record) as ProcessSet);
  }

  /** The job history, oldest first. */
  jobs(): Job[] {
    return this.db
      .prepare<[], { record: string }>('SELECT record FROM jobs ORDER BY rowid')
      .all()
      .map((r) => JSON.parse(r.record) as Job);
  }

  savePset(p: Readonly<ProcessSet>): void {
    const { jobId: _inUse, ...definition } = p;
    this.putPset.run(p.name, JSON.stringify(definition));
  }

  deletePset(name: string): void {
    this.dropPset.run(name);
  }

  saveJob(j: Readonly<Job>): void {
    this.putJob.run(j.id, JSON.stringify(j));
  }

  deleteJob(id: string): void {
    this.dropJob.run(id);
  }

  /** Writes every record in one transaction (after a restore). */
  saveAll(psets: readonly Readonly<ProcessSet>[], jobs: readonly Readonly<Job>[]): void {
    this.db.transaction(() => {
      for (const p of psets) this.savePset(p);
      for (const j of jobs) this.saveJob(j);
    })();
  }

  close(): void {
    this.db.close();
  }
}
