// One connected member of an MPICH / Intel MPI job, as the PMI wire server sees it: each PMI
// command becomes the core's call (the job's collective, key-value store, name service and
// state machine). The core's errors reach the client as PmiErrors (rc=-1 msg=...).
//
// The one thing PMI adds on top of the core is when a put becomes visible: PMI says at the next
// barrier / kvs-fence (hydra caches puts until then), so a member's puts are staged
// (pmi-job-store.ts) and committed to the job's store when that member's fence completes. All
// members' fences complete in one synchronous step in the core, and each commit runs before any
// further command can be read, so no rank sees a half-committed epoch.
import { PmiError, type KvsLookup, type PmiMember, type PmiMemberInfo } from '../pmi/index.js';
import { isActive, type Job, type ResourceManager } from '../rm/index.js';
import type { PmiJobStore } from './pmi-job-store.js';
import { asPmiError, core, coreAsync, lookupName, publishName, unpublishName } from './pmi-names.js';

/** The collective a PMI-1 barrier and a PMI-2 kvs-fence join: the same one a PMIx fence joins. */
export const FENCE = 'fence';

/** What the PMI backend keeps per job. */
export interface PmiJob {
  job: Readonly<Job>;
  /** Each rank's credential (src/pmi/credential.ts). */
  pmiIds: string[];
  hosts: string[];
  /** Staged and committed puts, within the job's limits. */
  store: PmiJobStore;
  /** Which ranks have a live connection. */
  connected: boolean[];
  /** Released by the core: nothing of it is reported any more. */
  released: boolean;
}

/** Keys of node attributes inside the job's store: control characters never occur in PMI keys. */
const nodeKey = (host: string, key: string) => `\u0001node\u0001${host}\u0001${key}`;

export class RmPmiMember implements PmiMember {
  readonly info: PmiMemberInfo;
  private readonly ns: string;
  private readonly host: string;

  constructor(
    private readonly rm: ResourceManager,
    private readonly pj: PmiJob,
    private readonly rank: number,
    private readonly topologyFile: string | undefined,
    private readonly detach: () => void,
  ) {
    const job = pj.job;
    this.ns = job.namespace;
    this.host = pj.hosts[rank]!;
    this.info = {
      jobId: job.id,
      kvsname: job.namespace,
      rank,
      size: job.members.length,
      appnum: 0,
      universeSize: job.members.length,
      hosts: pj.hosts,
    };
  }

  /** Throws the job's end as the client's error once it failed, was aborted or completed. */
  private live(): void {
    if (this.pj.released) throw new PmiError(`job ${this.info.jobId} has ended and been released`);
    const job = this.rm.jobByNamespace(this.ns);
    if (!job) throw new PmiError(`job ${this.info.jobId} has been released`);
    if (!isActive(job.state)) throw new PmiError(`job ${job.id} ${job.state}${job.error ? `: ${job.error}` : ''}`);
  }

  private get publisher() {
    return { jobId: this.info.jobId, namespace: this.ns, rank: this.rank };
  }

  put(key: string, value: string): void {
    this.live();
    core(() => this.pj.store.stage(this.rank, key, value));
  }

  get(key: string): KvsLookup {
    this.live();
    return core(() => this.pj.store.lookup(this.rank, key));
  }

  fence(): Promise<void> {
    this.live();
    // One continuation, no async frames: every member's wake-up runs this in the same
    // microtask drain, commit included (see the file comment).
    return this.rm.collective(this.ns, { name: FENCE, participants: 'all', contributors: [this.rank] }).then(
      () => core(() => this.pj.store.commit(this.rank)),
      (e: unknown) => {
        throw asPmiError(e);
      },
    );
  }

  jobAttr(key: string): string | undefined {
    this.live();
    return key === 'PMI_hwloc_xmlfile' ? this.topologyFile : undefined;
  }

  putNodeAttr(key: string, value: string): void {
    this.live();
    core(() => this.pj.store.putShared(this.rank, nodeKey(this.host, key), value));
  }

  async getNodeAttr(key: string, wait: boolean): Promise<string | undefined> {
    this.live();
    const k = nodeKey(this.host, key);
    return coreAsync(async () => {
      const kv = this.rm.kv(this.ns);
      return wait ? kv.waitFor(k) : kv.get(k);
    });
  }

  publish(service: string, port: string): void {
    this.live();
    publishName(this.rm, this.publisher, service, port);
  }

  lookup(service: string): Promise<string> {
    this.live();
    return lookupName(this.rm, this.publisher, service);
  }

  unpublish(service: string): void {
    this.live();
    unpublishName(this.rm, this.publisher, service);
  }

  abort(exitCode: number, message: string): void {
    core(() => this.rm.abort(this.ns, this.rank, exitCode, message));
  }

  finalize(): void {
    this.pj.store.drop(this.rank);
    if (!this.pj.released) core(() => this.rm.memberFinalized(this.ns, this.rank));
  }

  disconnected(reason: string): void {
    this.detach();
    if (this.pj.released) return;
    const job = this.rm.jobByNamespace(this.ns);
    if (!job) return;
    const m = job.members[this.rank];
    if (m && m.state === 'connected') this.rm.memberLost(this.ns, this.rank, reason);
  }
}
