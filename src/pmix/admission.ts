// Who may connect to the PMIx server, decided on a connection's handshake before libpmix sees it.
//
// A client is admitted when libpmix itself would accept it: a registered (namespace, rank)
// whose "native" credential (and, if it sends one, its info blob) names the uid and gid it was
// registered with, speaking a wire format libpmix has. Those are exactly the refusals that hurt
// libpmix 5.0.11 when it makes them itself (see gate.ts). A tool is admitted by policy: one of
// this process's own uid and gid, or none.
//
// A "native" credential over TCP is the uid and gid the peer says it has. When the peer's socket
// is on this host, the kernel says whose it is (peerUid): a peer whose socket's owner is not the
// uid it claims is refused (root's excepted, which may start ranks as any user).

import type { Admission } from './gate.js';
import { BufferType, type Handshake, HandshakeError, nativeCredentialIds, PeerFlag } from './handshake.js';
import { type BlobInfo, decodeInfoBlob } from './handshake-blob.js';
import { Keys } from './keys.js';
import { Status } from './status.js';
import type { Proc } from './values.js';

export type ToolPolicy = 'same-uid' | 'refuse';

/** The bfrops and gds modules the wheel's libpmix 5.0.11 has (an unknown one corrupts it). */
const BFROPS = new Set(['v41', 'v4', 'v3', 'v21', 'v20']);
const GDS = new Set(['hash', 'ds12', 'ds21']);

const refuse = (status: number, reason: string): Admission => ({ ok: false, status, reason });

export interface AdmissionOptions {
  tools: ToolPolicy;
  /** This process's uid and gid: what a tool must run as under 'same-uid'. */
  self: { uid: number; gid: number };
  /** A further say on a registered client, e.g. that its job has ended: a reason to refuse. */
  client?(proc: Proc): string | undefined;
  /** The uid owning the peer's socket, when it is on this host. */
  peerUid?: number;
}

/** The uid and gid registered for each client of each namespace. */
export class ClientRegistry {
  private readonly byNspace = new Map<string, Map<number, { uid: number; gid: number }>>();

  add(proc: Proc, uid: number, gid: number): void {
    let ranks = this.byNspace.get(proc.nspace);
    if (!ranks) this.byNspace.set(proc.nspace, (ranks = new Map()));
    ranks.set(proc.rank, { uid, gid });
  }

  remove(proc: Proc): void {
    const ranks = this.byNspace.get(proc.nspace);
    ranks?.delete(proc.rank);
    if (ranks?.size === 0) this.byNspace.delete(proc.nspace);
  }

  removeNspace(nspace: string): void {
    this.byNspace.delete(nspace);
  }

  get(proc: Proc): { uid: number; gid: number } | undefined {
    return this.byNspace.get(proc.nspace)?.get(proc.rank);
  }

  hasNspace(nspace: string): boolean {
    return this.byNspace.has(nspace);
  }
}

function blobOf(h: Handshake): BlobInfo[] {
  if (h.blob.length === 0) return [];
  // Only the encoding of 4.x/5.x peers is understood; libpmix must not read what we could not.
  if (h.bfrops !== 'v41' || h.bufferType !== BufferType.NON_DESC) {
    throw new HandshakeError(`an info blob packed by '${h.bfrops}' in buffer type ${h.bufferType} is not accepted`);
  }
  return decodeInfoBlob(h.blob);
}

const numberIn = (blob: BlobInfo[], key: string) => {
  const v = blob.find((i) => i.key === key)?.value;
  return typeof v === 'number' ? v : undefined;
};

export function admit(h: Handshake, registry: ClientRegistry, opts: AdmissionOptions): Admission {
  const cred = nativeCredentialIds(h);
  if (!cred) {
    return refuse(
      Status.ERR_INVALID_CRED,
      `security module '${h.psec}' with a ${h.credential.length}-byte credential: only 'native' is accepted`,
    );
  }
  if (!BFROPS.has(h.bfrops)) return refuse(Status.ERR_NOT_SUPPORTED, `unknown bfrops module '${h.bfrops}'`);
  if (h.bufferType !== BufferType.NON_DESC && h.bufferType !== BufferType.FULLY_DESC) {
    return refuse(Status.ERR_NOT_SUPPORTED, `unknown buffer type ${h.bufferType}`);
  }
  if (!h.gds.split(',').some((g) => GDS.has(g.trim())))
    return refuse(Status.ERR_NOT_SUPPORTED, `no known gds module in '${h.gds}'`);
  let blob: BlobInfo[];
  try {
    blob = blobOf(h);
  } catch (err) {
    if (err instanceof HandshakeError) return refuse(Status.ERR_BAD_PARAM, err.message);
    throw err;
  }
  const claimed = { uid: numberIn(blob, Keys.USERID) ?? cred.uid, gid: numberIn(blob, Keys.GRPID) ?? cred.gid };
  const owner = opts.peerUid;
  if (owner !== undefined && owner !== 0) {
    for (const uid of [cred.uid, claimed.uid, h.uid ?? cred.uid]) {
      if (uid !== owner) return refuse(Status.ERR_INVALID_CRED, `a connection of uid ${owner} claims to be uid ${uid}`);
    }
  }

  switch (h.flag) {
    case PeerFlag.SIMPLE_CLIENT: {
      const proc = h.proc!;
      const who = `${proc.nspace}:${proc.rank}`;
      const reg = registry.get(proc);
      if (!reg) return refuse(Status.ERR_NOT_FOUND, `${who} is not a registered client`);
      for (const ids of [cred, claimed]) {
        if (ids.uid !== reg.uid || ids.gid !== reg.gid) {
          return refuse(
            Status.ERR_INVALID_CRED,
            `${who} runs as uid ${ids.uid} gid ${ids.gid}, registered as uid ${reg.uid} gid ${reg.gid}`,
          );
        }
      }
      const no = opts.client?.(proc);
      return no ? refuse(Status.ERR_NO_PERMISSIONS, `${who}: ${no}`) : { ok: true };
    }
    case PeerFlag.TOOL_NEEDS_ID:
    case PeerFlag.TOOL_GIVEN_ID: {
      if (opts.tools === 'refuse') return refuse(Status.ERR_NOT_SUPPORTED, 'this server accepts no tools');
      for (const ids of [cred, { uid: h.uid, gid: h.gid }, claimed]) {
        if (ids.uid !== opts.self.uid || ids.gid !== opts.self.gid) {
          return refuse(
            Status.ERR_NO_PERMISSIONS,
            `a tool of uid ${ids.uid} gid ${ids.gid}: only uid ${opts.self.uid} gid ${opts.self.gid} may connect`,
          );
        }
      }
      if (h.proc && registry.hasNspace(h.proc.nspace)) {
        return refuse(Status.ERR_NO_PERMISSIONS, `a tool may not claim the namespace '${h.proc.nspace}' of a job`);
      }
      return { ok: true };
    }
    default:
      return refuse(
        Status.ERR_NOT_SUPPORTED,
        `peers of kind ${h.flag} (launchers, singletons, legacy tools) are not accepted`,
      );
  }
}
