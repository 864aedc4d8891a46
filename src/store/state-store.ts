// What outlives the sidecar process: process set definitions, the job history and the namespaces
// of the in-process pool's epochs (whose ranks' shared memory a restart cleans up), in SQLite
// (better-sqlite3) in the state directory. Each change is its own transaction, written before the
// REST answer leaves, so a kill -9 loses nothing that was acknowledged: a committed write is in
// the kernel's page cache at once. No fsync (synchronous=OFF): a power cut may lose the last
// changes, a process crash does not, and an fsync under load stalled requests for tens of ms.
//
// The store holds the PMIx namespaces of running jobs: state.db and its -wal and -shm are 0600
// whatever the directory's mode. SQLite creates a database 0644 (less the umask) and gives the
// -wal and -shm it creates later the database's own mode, so state.db is created 0600 before
// SQLite opens it, and every file of the store left by an earlier run is made 0600. A directory
// that others can read or write is said in a warning (its mode is the operator's to choose).

import { chmodSync, closeSync, existsSync, mkdirSync, openSync, statSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import type { Job, ProcessSet } from '../rm/types.js';

const SCHEMA = `
CREATE TABLE IF NOT EXISTS psets (name TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pools (namespace TEXT PRIMARY KEY);
`;

/** What the store tells its operator (a pino logger fits). */
export interface StoreLog {
  warn(fields: Record<string, unknown>, msg: string): void;
}

/** The store's files: the database, and SQLite's write-ahead log and its shared-memory index. */
const SUFFIXES = ['', '-wal', '-shm'] as const;

export class StateStore {
  private readonly db: Database.Database;
  private readonly putPset: Database.Statement<[string, string]>;
  private readonly dropPset: Database.Statement<[string]>;
  private readonly putJob: Database.Statement<[string, string]>;
  private readonly dropJob: Database.Statement<[string]>;
  private readonly putPool: Database.Statement<[string]>;

  private constructor(readonly path: string) {
    this.db = new Database(path);
    this.db.pragma('journal_mode = WAL');
    this.db.pragma('synchronous = OFF');
    this.db.exec(SCHEMA);
    // The -wal and -shm now exist (WAL mode opened them) with the database's mode; once more in
    // case another mode came from elsewhere (an ACL, a file left by an older version).
    onlyOwner(path);
    this.putPset = this.db.prepare(
      'INSERT INTO psets (name, record) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET record = excluded.record',
    );
    this.dropPset = this.db.prepare('DELETE FROM psets WHERE name = ?');
    this.putJob = this.db.prepare(
      'INSERT INTO jobs (id, record) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET record = excluded.record',
    );
    this.dropJob = this.db.prepare('DELETE FROM jobs WHERE id = ?');
    this.putPool = this.db.prepare('INSERT OR IGNORE INTO pools (namespace) VALUES (?)');
  }

  /** Opens (or creates) `dir`/state.db, its files readable by this user only. */
  static open(dir: string, log?: StoreLog): StateStore {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const mode = statSync(dir).mode & 0o777;
    if (mode & 0o066) {
      log?.warn(
        { stateDir: dir, mode: `0${mode.toString(8)}` },
        `the state directory ${dir} is open to other users (mode 0${mode.toString(8)}): its files are kept 0600, but others can list them (or, if it is writable, replace them); make it 0700 (chmod 700 ${dir})`,
      );
    }
    const path = join(dir, 'state.db');
    closeSync(openSync(path, 'a', 0o600));
    onlyOwner(path);
    return new StateStore(path);
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

  /** The pool epochs' namespaces recorded since the last forgetPools(). */
  pools(): string[] {
    return this.db
      .prepare<[], { namespace: string }>('SELECT namespace FROM pools ORDER BY rowid')
      .all()
      .map((r) => r.namespace);
  }

  savePool(namespace: string): void {
    this.putPool.run(namespace);
  }

  forgetPools(): void {
    this.db.exec('DELETE FROM pools');
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

/** Makes each of the store's files that exists 0600. */
function onlyOwner(path: string): void {
  for (const suffix of SUFFIXES) {
    const f = path + suffix;
    if (existsSync(f) && (statSync(f).mode & 0o777) !== 0o600) chmodSync(f, 0o600);
  }
}
