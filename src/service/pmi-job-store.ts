// The key-value space of one MPICH / Intel MPI job as PMI sees it: puts staged per rank until
// that rank's next fence (hydra caches them likewise), committed to the job's store in the
// core, and a budget that a hostile or broken client cannot exceed: distinct entries, bytes
// held (staged and committed), and puts over the job's life. Going past it is the client's
// error (rc=-1 msg=...), never the sidecar's memory.
import { PmiError, type KvsLookup } from '../pmi/index.js';
import type { KvStore } from '../rm/index.js';

export interface PmiJobLimits {
  /** Distinct keys held, staged and committed (node attributes included). */
  kvEntries: number;
  /** Bytes of keys and values held, staged and committed. */
  kvBytes: number;
  /** put / kvs-put / info-putnodeattr calls over the job's life (overwrites included). */
  puts: number;
}

/**
 * Far above what MPI needs (MPICH puts a few keys per rank, and a node root's business card
 * as nine 1 KiB segments: a 4,096-rank job on 256 hosts holds about 15,000 entries and 5 MB),
 * and far below what would hurt the sidecar.
 */
export const DEFAULT_PMI_JOB_LIMITS: Readonly<PmiJobLimits> = { kvEntries: 65_536, kvBytes: 32 * 1024 * 1024, puts: 1_048_576 };

export class PmiJobStore {
  /** Puts of each rank not yet committed by its fence. */
  private readonly staged: Map<string, string>[];
  private entries = 0;
  private bytes = 0;
  private puts = 0;

  constructor(
    private readonly jobId: string,
    size: number,
    /** The job's store in the core; throws once the job is gone. */
    private readonly kv: () => KvStore,
    private readonly limits: Readonly<PmiJobLimits>,
  ) {
    this.staged = Array.from({ length: size }, () => new Map());
  }

  /** Stages a put of `rank`: its own at once, everyone's after its next fence. */
  stage(rank: number, key: string, value: string): void {
    const mine = this.staged[rank]!;
    const old = mine.get(key);
    this.charge(old === undefined ? 1 : 0, key.length + value.length - (old === undefined ? 0 : key.length + old.length));
    mine.set(key, value);
  }

  lookup(rank: number, key: string): KvsLookup {
    const own = this.staged[rank]!.get(key);
    if (own !== undefined) return { found: true, value: own };
    const v = this.kv().get(key);
    if (v !== undefined) return { found: true, value: v };
    return this.staged.some((s) => s.has(key)) ? { found: false, why: 'unfenced' } : { found: false, why: 'unknown' };
  }

  /** The rank's fence completed: its staged puts become everyone's. */
  commit(rank: number): void {
    const mine = this.staged[rank]!;
    if (mine.size === 0) return;
    const kv = this.kv();
    for (const [k, v] of mine) {
      this.release(kv, k);
      kv.put(rank, k, v);
    }
    mine.clear();
  }

  /** A put straight into the committed store (node attributes: no fence makes them visible). */
  putShared(rank: number, key: string, value: string): void {
    const kv = this.kv();
    const old = kv.get(key);
    this.charge(old === undefined ? 1 : 0, key.length + value.length - (old === undefined ? 0 : key.length + old.length));
    kv.put(rank, key, value);
  }

  /** Forgets the rank's staged puts (it finalized). */
  drop(rank: number): void {
    const mine = this.staged[rank]!;
    for (const [k, v] of mine) {
      this.entries--;
      this.bytes -= k.length + v.length;
    }
    mine.clear();
  }

  /** A staged entry about to replace a committed one: the committed one stops counting. */
  private release(kv: KvStore, key: string): void {
    const old = kv.get(key);
    if (old === undefined) return;
    this.entries--;
    this.bytes -= key.length + old.length;
  }

  private charge(entries: number, bytes: number): void {
    const l = this.limits;
    if (this.puts >= l.puts) throw new PmiError(`job ${this.jobId} has made its limit of ${l.puts} puts`);
    if (this.entries + entries > l.kvEntries) throw new PmiError(`job ${this.jobId} holds its limit of ${l.kvEntries} keys`);
    if (this.bytes + bytes > l.kvBytes) throw new PmiError(`job ${this.jobId} would hold more than its limit of ${l.kvBytes} bytes of keys and values`);
    this.puts++;
    this.entries += entries;
    this.bytes += bytes;
  }
}
