// Encodes where a namespace's ranks live into the job information PMIx clients read at init.
//
// Every rank is a client of this one server, wherever its host is, so nlocalprocs is the job
// size (libpmix then completes fences itself). What the MPI library is told about locality comes
// from the per-node and per-rank keys below, which describe the real hosts: ranks on different
// hosts must not believe they can share memory.
import { Keys } from './keys.js';
import { type Info, info, type Proc, v } from './values.js';

export interface RankPlacement {
  rank: number;
  host: string;
  /** Rank among this namespace's ranks on the same host. */
  localRank: number;
  /** Rank among all ranks on the host (equal to localRank: one namespace per job). */
  nodeRank: number;
  /** Index of the host in the namespace's host list. */
  nodeId: number;
  /** The one process-set name this rank belongs to (Open MPI 5.0 resolves psets this way). */
  psetName?: string;
  /** Its app (index into NamespaceLayout.apps; default 0). */
  appnum?: number;
}

export interface NamespaceLayout {
  nspace: string;
  ranks: RankPlacement[];
  /** Directory for the job's session files; Open MPI invents its own when absent. */
  tmpdir?: string;
  universeSize?: number;
  /** The sizes of the namespace's apps in rank order (default: one app of every rank). */
  apps?: number[];
  /** The process whose MPI_Comm_spawn started this namespace. */
  parent?: Proc;
}

export interface RegexGenerator {
  generateRegex(input: string): Buffer;
  generatePpn(input: string): Buffer;
}

/** Hosts in node-id order, each with its ranks in rank order. */
export function hostsOf(layout: NamespaceLayout): { host: string; nodeId: number; ranks: number[] }[] {
  const byNode = new Map<number, { host: string; nodeId: number; ranks: number[] }>();
  for (const r of [...layout.ranks].sort((a, b) => a.rank - b.rank)) {
    let node = byNode.get(r.nodeId);
    if (!node) byNode.set(r.nodeId, (node = { host: r.host, nodeId: r.nodeId, ranks: [] }));
    node.ranks.push(r.rank);
  }
  return [...byNode.values()].sort((a, b) => a.nodeId - b.nodeId);
}

export function encodeNamespace(layout: NamespaceLayout, regex: RegexGenerator): Info[] {
  const size = layout.ranks.length;
  const hosts = hostsOf(layout);
  const apps = layout.apps ?? [size];
  // Each app's ranks follow the previous app's: its leader is the first of them.
  const appStart = apps.map((_, i) => apps.slice(0, i).reduce((a, b) => a + b, 0));
  const out: Info[] = [
    info(Keys.JOBID, v.string(layout.nspace)),
    info(Keys.NPROC_OFFSET, v.rank(0)),
    info(Keys.JOB_SIZE, v.uint32(size)),
    info(Keys.UNIV_SIZE, v.uint32(layout.universeSize ?? size)),
    info(Keys.MAX_PROCS, v.uint32(layout.universeSize ?? size)),
    info(Keys.JOB_NUM_APPS, v.uint32(apps.length)),
    info(Keys.NUM_NODES, v.uint32(hosts.length)),
    info(Keys.NODE_MAP, v.regex(regex.generateRegex(hosts.map((h) => h.host).join(',')))),
    info(Keys.PROC_MAP, v.regex(regex.generatePpn(hosts.map((h) => h.ranks.join(',')).join(';')))),
    info(Keys.SPAWNED, v.bool(layout.parent !== undefined)),
    ...apps.map((appSize, k) =>
      info(
        Keys.APP_INFO_ARRAY,
        v.infos([
          info(Keys.APPNUM, v.uint32(k)),
          info(Keys.APP_SIZE, v.uint32(appSize)),
          info(Keys.APPLDR, v.rank(appStart[k] ?? 0)),
        ]),
      ),
    ),
  ];
  if (layout.parent) out.push(info(Keys.PARENT_ID, v.proc(layout.parent)));
  if (layout.tmpdir) {
    out.push(info(Keys.TMPDIR, v.string(layout.tmpdir)), info(Keys.NSDIR, v.string(layout.tmpdir)));
  }
  for (const h of hosts) {
    out.push(
      info(
        Keys.NODE_INFO_ARRAY,
        v.infos([
          info(Keys.HOSTNAME, v.string(h.host)),
          info(Keys.NODEID, v.uint32(h.nodeId)),
          info(Keys.LOCAL_PEERS, v.string(h.ranks.join(','))),
          // Per node, as one server holds every node's ranks: a rank reads its own node's.
          info(Keys.LOCAL_PROCS, v.procs(h.ranks.map((rank) => ({ nspace: layout.nspace, rank })))),
          info(Keys.LOCAL_SIZE, v.uint32(h.ranks.length)),
          info(Keys.NODE_SIZE, v.uint32(h.ranks.length)),
          info(Keys.LOCALLDR, v.rank(h.ranks[0] ?? 0)),
        ]),
      ),
    );
  }
  for (const r of layout.ranks) {
    const appnum = r.appnum ?? 0;
    const proc: Info[] = [
      info(Keys.RANK, v.rank(r.rank)),
      info(Keys.GLOBAL_RANK, v.rank(r.rank)),
      info(Keys.APP_RANK, v.rank(r.rank - (appStart[appnum] ?? 0))),
      info(Keys.LOCAL_RANK, v.uint16(r.localRank)),
      info(Keys.NODE_RANK, v.uint16(r.nodeRank)),
      info(Keys.NODEID, v.uint32(r.nodeId)),
      info(Keys.HOSTNAME, v.string(r.host)),
      info(Keys.APPNUM, v.uint32(appnum)),
      info(Keys.REINCARNATION, v.uint32(0)),
    ];
    if (layout.tmpdir) proc.push(info(Keys.PROCDIR, v.string(`${layout.tmpdir}/${r.rank}`)));
    if (r.psetName) proc.push(info(Keys.PSET_NAME, v.string(r.psetName)));
    out.push(info(Keys.PROC_DATA, v.infos(proc)));
  }
  return out;
}

/** A layout with every rank on one host, for tests and single-machine use. */
export function singleHostLayout(nspace: string, size: number, host: string, tmpdir?: string): NamespaceLayout {
  const ranks = Array.from({ length: size }, (_, rank) => ({ rank, host, localRank: rank, nodeRank: rank, nodeId: 0 }));
  return tmpdir ? { nspace, ranks, tmpdir } : { nspace, ranks };
}
