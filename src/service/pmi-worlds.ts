// The PMI side of the in-process worlds (src/rm/worlds.ts): each MPICH / Intel MPI worker
// process initialises MPI once, as the only rank of a PMI world of its own, over a connection
// bound with the world's credential on the shared PMI listener. A world of one needs little:
// its puts are its own, its barriers complete at once; its process mapping and topology file are
// a job's. The connection is also how the sidecar learns that the worker process died: it closes
// without PMI finalize (MPICH 5 finalizes PMI only at process exit), and the job the worker is in
// fails at once.
import {
  checkPeerUid,
  type KvsLookup,
  newPmiId,
  type PmiConnectionInfo,
  PmiError,
  type PmiMember,
  type PmiMemberInfo,
} from '../pmi/index.js';
import type { Impl, ResourceManager, Worker, WorldBackend } from '../rm/index.js';
import { LOCAL_HOSTS, type PmiBackend, workerUid } from './pmi-backend.js';
import { asPmiError, core, lookupName, publishName, unpublishName } from './pmi-names.js';

/**
 * What a world's process needs beyond a job member's settings. MPICH builds the job's
 * communicator with MPI_Open_port / Comm_accept / Comm_connect: with every UCX transport the
 * port name outgrows MPI_MAX_PORT_NAME (MPI_Open_port fails, under hydra too), so UCX keeps to
 * TCP (measured: init 25 ms; the ofi netmod takes 200 ms and, on its TCP provider, delivers a
 * finished send only while its sender keeps calling MPI). Intel MPI's default fabric selection
 * fails MPI_Open_port here, so it runs shared memory + libfabric's TCP provider.
 */
export const WORLD_ENV: Readonly<Record<'mpich' | 'intelmpi', Readonly<Record<string, string>>>> = {
  // UCX_LOG_LEVEL: at exit UCX lists every zero-copy send whose completion MPI never polled
  // for (MPI_Finalize of a long-lived world), a screenful of warnings per worker.
  mpich: { UCX_TLS: 'tcp,self', UCX_LOG_LEVEL: 'error' },
  intelmpi: { I_MPI_FABRICS: 'shm:ofi', FI_PROVIDER: 'tcp' },
};

/** Bounds on what one world's process may store (a world of one puts a few keys). */
const MAX_KEYS = 1024;
const MAX_BYTES = 1024 * 1024;

interface World {
  namespace: string;
  impl: Impl;
  host: string;
  pmiId: string;
  /** The uid its worker registered with: a peer on this host binds only as it. */
  uid: number;
  /** Bound to a connection (a credential binds once). */
  attached: boolean;
}

export class PmiWorlds implements WorldBackend {
  readonly impls = ['mpich', 'intelmpi'] as const;
  private readonly byPmiId = new Map<string, World>();
  private readonly byNamespace = new Map<string, World>();

  constructor(
    private readonly rm: ResourceManager,
    private readonly pmi: PmiBackend,
    /** Settings for every world's process, replacing WORLD_ENV (as --pmi-env replaces the defaults). */
    private readonly extraEnv?: Readonly<Record<string, string>>,
  ) {
    pmi.serveAlso((id, conn) => this.attach(id, conn));
  }

  open(namespace: string, impl: Impl, worker: Readonly<Worker>): Record<string, string> {
    const world: World = {
      namespace,
      impl,
      host: worker.host,
      pmiId: newPmiId(),
      uid: workerUid(worker),
      attached: false,
    };
    this.byPmiId.set(world.pmiId, world);
    this.byNamespace.set(namespace, world);
    return {
      ...(this.extraEnv ?? WORLD_ENV[impl === 'intelmpi' ? 'intelmpi' : 'mpich']),
      ...this.pmi.rankEnv(impl, world.pmiId, worker.host, 0, 1),
    };
  }

  close(namespace: string): void {
    const world = this.byNamespace.get(namespace);
    if (!world) return;
    this.byNamespace.delete(namespace);
    this.byPmiId.delete(world.pmiId);
    this.rm.names.jobEnded(namespace, `world ${namespace} ended`);
    this.rm.names.jobReleased(namespace);
  }

  private attach(pmiId: string, conn: PmiConnectionInfo): PmiMember | undefined {
    const world = this.byPmiId.get(pmiId);
    if (!world) return undefined;
    checkPeerUid(conn.peerUid(), world.uid);
    if (world.attached) throw new PmiError(`the PMI_ID of world ${world.namespace} is already connected`);
    const refusal = this.rm.worldRefusal(world.namespace);
    if (refusal) throw new PmiError(refusal);
    try {
      this.rm.worldConnected(world.namespace);
    } catch (e) {
      throw asPmiError(e);
    }
    world.attached = true;
    const local = LOCAL_HOSTS.has(world.host);
    return new WorldMember(this.rm, world, local ? this.pmi.topologyFile : undefined);
  }
}

/** The one member of a world, as its connection sees it. */
class WorldMember implements PmiMember {
  readonly info: PmiMemberInfo;
  private readonly kv = new Map<string, string>();
  private readonly nodeKv = new Map<string, string>();
  private bytes = 0;
  private ended = false;

  constructor(
    private readonly rm: ResourceManager,
    private readonly world: World,
    private readonly topologyFile: string | undefined,
  ) {
    this.info = {
      jobId: world.namespace,
      kvsname: world.namespace,
      rank: 0,
      size: 1,
      appnum: 0,
      universeSize: 1,
      hosts: [world.host],
    };
  }

  private get publisher() {
    return { jobId: this.world.namespace, namespace: this.world.namespace, rank: 0 };
  }

  private store(map: Map<string, string>, key: string, value: string): void {
    const old = map.get(key);
    const bytes = this.bytes + key.length + value.length - (old === undefined ? 0 : key.length + old.length);
    if (old === undefined && this.kv.size + this.nodeKv.size >= MAX_KEYS)
      throw new PmiError(`a world may hold at most ${MAX_KEYS} keys`);
    if (bytes > MAX_BYTES) throw new PmiError(`a world may hold at most ${MAX_BYTES} bytes of keys and values`);
    this.bytes = bytes;
    map.set(key, value);
  }

  put(key: string, value: string): void {
    this.store(this.kv, key, value);
  }

  get(key: string): KvsLookup {
    const value = this.kv.get(key);
    return value === undefined ? { found: false, why: 'unknown' } : { found: true, value };
  }

  fence(): Promise<void> {
    return Promise.resolve();
  }

  jobAttr(key: string): string | undefined {
    return key === 'PMI_hwloc_xmlfile' ? this.topologyFile : undefined;
  }

  putNodeAttr(key: string, value: string): void {
    this.store(this.nodeKv, key, value);
  }

  getNodeAttr(key: string): Promise<string | undefined> {
    // Nobody else is on the world's node: what is not there will never come.
    return Promise.resolve(this.nodeKv.get(key));
  }

  publish(service: string, port: string): void {
    publishName(this.rm, this.publisher, service, port);
  }

  lookup(service: string): Promise<string> {
    return lookupName(this.rm, this.publisher, service);
  }

  unpublish(service: string): void {
    unpublishName(this.rm, this.publisher, service);
  }

  abort(exitCode: number, message: string): void {
    core(() => this.rm.worldAbort(this.world.namespace, exitCode, message));
  }

  finalize(): void {
    this.end('its MPI library finalized (the worker process is exiting)');
  }

  disconnected(reason: string): void {
    this.end(`its worker process ended (its PMI connection closed: ${reason})`);
  }

  private end(reason: string): void {
    if (this.ended) return;
    this.ended = true;
    this.rm.worldGone(this.world.namespace, reason);
  }
}
