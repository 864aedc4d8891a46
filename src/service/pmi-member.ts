// One connected member of an MPICH / Intel MPI job, as the PMI wire server sees it: each PMI
// command the native engine passes up becomes the core's call (name service, abort, finalize,
// the job's state machine). The core's errors reach the client as PmiErrors (rc=-1 msg=...).
//
// The job's key-value space and its `fence` collective (PMI-1 barrier, PMI-2 kvs-fence) live in
// the native PMI engine (src/pmi/engine.ts), which answers those commands on its own thread;
// src/rm hands the collective over to it (pmi-backend.ts) and keeps deciding which ranks are gone
// and when the job ends.

import type { EngineJob } from '../pmi/engine.js';
import { type KvsLookup, PmiError, type PmiMember, type PmiMemberInfo } from '../pmi/index.js';
import { isActive, type Job, type ResourceManager } from '../rm/index.js';
import { core, lookupName, publishName, unpublishName } from './pmi-names.js';

/** The collective a PMI-1 barrier and a PMI-2 kvs-fence join: the same one a PMIx fence joins. */
export const FENCE = 'fence';

/** What the PMI backend keeps per job. */
export interface PmiJob {
  job: Readonly<Job>;
  /** Each rank's credential (src/pmi/credential.ts). */
  pmiIds: string[];
  hosts: string[];
  /** The uid each rank's worker was registered with: a peer on this host binds only as it. */
  uids: number[];
  /** The job in the native engine, made when its first member binds. */
  engine?: EngineJob;
  /** Which ranks have a live connection. */
  connected: boolean[];
  /** Released by the core: nothing of it is reported any more. */
  released: boolean;
}

/** The engine's part: never called on a member it serves. */
function servedByEngine(): never {
  throw new PmiError('internal error: this command belongs to the native PMI engine');
}

export class RmPmiMember implements PmiMember {
  readonly info: PmiMemberInfo;
  readonly engine: { readonly job: EngineJob; readonly rank: number };
  private readonly ns: string;

  constructor(
    private readonly rm: ResourceManager,
    private readonly pj: PmiJob,
    private readonly rank: number,
    engine: EngineJob,
    private readonly topologyFile: string | undefined,
    private readonly detach: () => void,
  ) {
    const job = pj.job;
    this.ns = job.namespace;
    this.engine = { job: engine, rank };
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

  put(): void {
    servedByEngine();
  }

  get(): KvsLookup {
    servedByEngine();
  }

  fence(): Promise<void> {
    servedByEngine();
  }

  jobAttr(key: string): string | undefined {
    this.live();
    return key === 'PMI_hwloc_xmlfile' ? this.topologyFile : undefined;
  }

  putNodeAttr(): void {
    servedByEngine();
  }

  getNodeAttr(): Promise<string | undefined> {
    servedByEngine();
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
