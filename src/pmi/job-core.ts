// What the PMI wire server needs from the job core, and nothing more.
//
// The wire server owns sockets, framing and the two protocols' state machines; the core
// (src/rm, reached through an adapter) owns jobs, members, the key-value store, collectives
// and the name service — the same ones PMIx clients use. The server calls in on behalf of one
// connected member; the core answers synchronously or with a promise, and reports anything
// the client should hear as a thrown/rejected Error whose message becomes the reply's msg.
//
// Lifecycle seen from here: attach (PMI-1 initack / PMI-2 fullinit) → any number of
// put/get/fence/... → finalize, or abort, or disconnect without finalize (the member is lost
// and the core fails the job, which rejects every pending fence and node-attribute wait of the
// job's other members and makes their later calls fail).

import type { EngineJob } from './engine.js';
import type { PeerUid } from './peer-uid.js';

export interface PmiMemberInfo {
  readonly jobId: string;
  /** The PMI kvsname (PMI-2 jobid) clients must quote; the job's namespace in the core. */
  readonly kvsname: string;
  readonly rank: number;
  readonly size: number;
  /** 0 unless the job has several apps (MPMD). */
  readonly appnum: number;
  /** MPI_UNIVERSE_SIZE: how many processes the job could grow to; at least size. */
  readonly universeSize: number;
  /** Host of every rank, in rank order: PMI_process_mapping and node scopes come from it. */
  readonly hosts: readonly string[];
  /** Set when the job was started by another job's MPI_Comm_spawn. */
  readonly spawnerJobId?: string;
}

export type KvsLookup =
  | { readonly found: true; readonly value: string }
  /** unknown: nobody put it; unfenced: put by another rank, visible after the next fence. */
  | { readonly found: false; readonly why: 'unknown' | 'unfenced' };

/** One app of an MPI_Comm_spawn request, as both protocols describe it. */
export interface SpawnApp {
  readonly command: string;
  readonly argv: readonly string[];
  readonly maxprocs: number;
  readonly info: readonly (readonly [string, string])[];
}

export interface SpawnRequest {
  readonly apps: readonly SpawnApp[];
  /** Key-value pairs to put into the children's store before they start (PARENT_ROOT_PORT_NAME). */
  readonly preput: readonly (readonly [string, string])[];
}

/**
 * A member as one connection sees it. Every call may throw an Error meant for the client.
 *
 * With `engine` set, the core runs the member's job in the native engine (engine.ts): once bound,
 * the connection is handed over, and the key-value and fence calls (put, get, fence, putNodeAttr,
 * getNodeAttr) are the engine's, never made here.
 */
export interface PmiMember {
  readonly info: PmiMemberInfo;
  readonly engine?: { readonly job: EngineJob; readonly rank: number };

  /** Stages a key; other ranks see it after the next fence, this rank at once. */
  put(key: string, value: string): void;
  get(key: string): KvsLookup;
  /** PMI-1 barrier / PMI-2 kvs-fence over all ranks: commits staged puts. Rejects if the job fails. */
  fence(): Promise<void>;
  /** Job attributes beyond those the wire server derives itself (process mapping, universe size). */
  jobAttr(key: string): string | undefined;

  /** Node-scoped attributes (PMI-2 info-putnodeattr), shared by the job's ranks on one host. */
  putNodeAttr(key: string, value: string): void;
  /** With wait, resolves once some rank on the node puts it; rejects if the job fails. */
  getNodeAttr(key: string, wait: boolean): Promise<string | undefined>;

  /** Name service (MPI_Publish_name / MPI_Lookup_name): throws if taken / not found. */
  publish(service: string, port: string): void;
  lookup(service: string): Promise<string>;
  unpublish(service: string): void;

  /** MPI_Comm_spawn; absent when the core's policy has no way to start processes. */
  spawn?(request: SpawnRequest): Promise<{ jobId: string; errcodes: readonly number[] }>;

  abort(exitCode: number, message: string): void;
  /** Clean end of this member (the client closes the connection afterwards). */
  finalize(): void;
  /** The connection closed. Before finalize this means the member is lost. */
  disconnected(reason: string): void;
}

/** Who is connecting, for the core's messages and its check of the peer's uid. */
export interface PmiConnectionInfo {
  /** Remote address and port. */
  readonly peer: string;
  /**
   * The uid owning the peer's socket when it is on this host (peer-uid.ts; over TCP as found when
   * the connection was accepted): the core holds a valid credential's bind to its worker's uid
   * with checkPeerUid.
   */
  peerUid(): PeerUid;
}

export interface PmiJobCore {
  /**
   * Binds a connection to the member a PMI_ID names. PMI_ID is what the member's env carried:
   * a listener-wide credential (credential.ts), not the rank (the rank comes back in the
   * reply). Throws if the id is unknown, already connected, or its job is not accepting
   * members any more, or if the connection's peer is on this host as another uid than the
   * member's worker (checkPeerUid(conn.peerUid(), uid)); a refusal changes nothing, so the
   * rightful rank can still bind with the same credential.
   */
  attach(pmiId: string, conn: PmiConnectionInfo): PmiMember;
}
