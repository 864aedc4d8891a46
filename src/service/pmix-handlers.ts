// The PMIx upcalls, answered by the resource manager. Each handler translates PMIx arguments
// into a call on the core and the core's answer (or RmError) back into PMIx values (or status).
import {
  findNumber,
  findString,
  findValue,
  type Info,
  info,
  Keys,
  PmixError,
  type Proc,
  type PublishedDatum,
  type Query,
  Range,
  Rank,
  Status,
  type UpcallHandlers,
  type Value,
  v,
  WithStatus,
} from '../pmix/index.js';
import { isActive, type Persistence, type PublishRange, type ResourceManager, RmError } from '../rm/index.js';
import type { PmixClients } from './pmix-clients.js';
import type { PmixSpawner } from './pmix-spawn.js';

export interface PmixHandlerOptions {
  rm: ResourceManager;
  /** Told which clients hold a connection, so that namespaces are torn down only after them. */
  clients?: PmixClients;
  /** What starts MPI_Comm_spawn's processes (made once the server runs); without one spawn is refused. */
  spawner?: () => PmixSpawner | undefined;
  log?: (level: 'debug' | 'info' | 'warn', msg: string, fields?: Record<string, unknown>) => void;
}

/** The PMIx status a client gets for an error of the core. */
export function pmixStatusOf(err: unknown): number {
  if (err instanceof PmixError) return err.status;
  if (!(err instanceof RmError)) return Status.ERROR;
  switch (err.kind) {
    case 'not_found':
      return Status.ERR_NOT_FOUND;
    case 'conflict':
      return Status.ERR_DUPLICATE_KEY;
    case 'timeout':
      return Status.ERR_TIMEOUT;
    case 'aborted':
      return Status.ERR_JOB_TERMINATED;
    case 'bad_request':
    case 'unprocessable':
      return Status.ERR_BAD_PARAM;
    case 'unavailable':
    case 'limit':
      return Status.ERR_NOT_AVAILABLE;
  }
}

/** Runs `f`, turning core errors into PmixErrors that keep their message. */
async function answer<T>(f: () => T | Promise<T>): Promise<T> {
  try {
    return await f();
  } catch (err) {
    if (err instanceof RmError) throw new PmixError(pmixStatusOf(err), err.message);
    throw err;
  }
}

function rangeOf(infos: Info[]): PublishRange {
  const r = findNumber(infos, Keys.RANGE);
  return r === Range.NAMESPACE || r === Range.LOCAL || r === Range.PROC_LOCAL ? 'namespace' : 'session';
}

function persistenceOf(infos: Info[]): Persistence {
  switch (findNumber(infos, Keys.PERSISTENCE)) {
    case 1:
      return 'first_read';
    case 2:
      return 'proc';
    case 4:
    case 0:
      return 'session';
    default:
      return 'app';
  }
}

/**
 * PMIX_WAIT as the standard has it: a count of keys to wait for (0: all of them), or a bool
 * (true: all). Absent or false: answer at once.
 */
function waitOf(dirs: Info[]): boolean | number {
  const val = findValue(dirs, Keys.WAIT);
  if (!val) return false;
  if (val.type === 'bool') return val.value;
  if (val.type === 'undef') return true;
  if (typeof val.value === 'number' || typeof val.value === 'bigint') return Math.max(0, Number(val.value));
  throw new PmixError(Status.ERR_BAD_PARAM, `PMIX_WAIT must be a count or a bool, not a ${val.type}`);
}

/** Groups procs by namespace, expanding a wildcard rank to the job's ranks. */
function ranksByNamespace(rm: ResourceManager, procs: Proc[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const p of procs) {
    const job = rm.jobByNamespace(p.nspace);
    if (!job) throw new RmError('not_found', `no job with namespace '${p.nspace}'`);
    const ranks = p.rank === Rank.WILDCARD ? job.members.map((m) => m.rank) : [p.rank];
    out.set(p.nspace, [...(out.get(p.nspace) ?? []), ...ranks]);
  }
  return out;
}

export function pmixHandlers({ rm, clients, spawner: spawnerOf, log }: PmixHandlerOptions): UpcallHandlers {
  const sp = () => spawnerOf?.();
  // A spawned process publishes and looks up for its parent's job (MPI_Comm_spawn's port exchange).
  const publisherOf = (proc: Proc) => ({
    jobId: sp()?.jobOf(proc.nspace) ?? rm.findMember(proc.nspace, proc.rank).job.id,
    namespace: proc.nspace,
    rank: proc.rank,
  });
  const spawned = (nspace: string) => sp()?.owns(nspace) ?? false;
  const psetNames = () =>
    v.string(
      rm
        .listPsets()
        .map((p) => p.name)
        .join(','),
    );
  /** The PMIx jobs this server serves now (what PRRTE reports as its active namespaces). */
  const pmixJobs = () => rm.activeJobs().filter((j) => j.impl === 'openmpi');

  /** The answers to one query key; none when this server does not know it. */
  function queryAnswer(key: string, q: Query): Info[] {
    switch (key) {
      case Keys.QUERY_NUM_PSETS:
        // Open MPI 5.0.x reads the names before the count and misreads the count without them.
        return [info(Keys.QUERY_PSET_NAMES, psetNames()), info(Keys.QUERY_NUM_PSETS, v.size(rm.listPsets().length))];
      case Keys.QUERY_PSET_NAMES:
        return [info(Keys.QUERY_PSET_NAMES, psetNames())];
      case Keys.QUERY_PSET_MEMBERSHIP: {
        const name = findString(q.qualifiers, Keys.PSET_NAME);
        if (!name)
          throw new PmixError(Status.ERR_BAD_PARAM, 'PMIX_QUERY_PSET_MEMBERSHIP needs a PMIX_PSET_NAME qualifier');
        return [
          info(
            Keys.QUERY_PSET_MEMBERSHIP,
            v.procs(rm.psetProcs(name).map((r) => ({ nspace: r.namespace, rank: r.rank }))),
          ),
        ];
      }
      case Keys.QUERY_NAMESPACES:
        return [
          info(
            Keys.QUERY_NAMESPACES,
            v.string(
              pmixJobs()
                .map((j) => j.namespace)
                .join(','),
            ),
          ),
        ];
      case Keys.QUERY_NAMESPACE_INFO:
        return [
          info(Keys.QUERY_NAMESPACE_INFO, {
            type: 'data_array',
            value: {
              type: 'info',
              items: pmixJobs().map((j) => ({
                key: Keys.QUERY_NAMESPACE_INFO,
                value: v.infos([
                  info(Keys.NSPACE, v.string(j.namespace)),
                  info(Keys.JOB_SIZE, v.uint32(j.members.length)),
                ]),
              })),
            },
          }),
        ];
      case Keys.JOB_SIZE: {
        const ns = findString(q.qualifiers, Keys.NSPACE);
        const job = ns ? rm.jobByNamespace(ns) : undefined;
        return job ? [info(Keys.JOB_SIZE, v.uint32(job.members.length))] : [];
      }
      default:
        return [];
    }
  }

  return {
    async clientConnected({ proc }) {
      if (spawned(proc.nspace)) {
        clients?.connected(proc.nspace, proc.rank);
        sp()!.connected(proc.nspace, proc.rank);
        return;
      }
      if (rm.isPoolNamespace(proc.nspace)) {
        clients?.connected(proc.nspace, proc.rank);
        return answer(() => rm.poolClientConnected(proc.nspace, proc.rank));
      }
      // A rank of an ended job is refused before libpmix sees it (PmixServer's admitClient). One
      // that connects while its job ends is kept (refusing it from here takes a libpmix 5.0.11
      // path that closes its socket twice) and counted, so that the namespace is torn down only
      // once it has gone too; it hears of its job's end from libpmix's cached event.
      clients?.connected(proc.nspace, proc.rank);
      const job = rm.jobByNamespace(proc.nspace);
      if (job && !isActive(job.state)) {
        log?.('warn', 'a rank connected as its job ended', { nspace: proc.nspace, rank: proc.rank, state: job.state });
        return;
      }
      return answer(() => rm.memberConnected(proc.nspace, proc.rank));
    },

    async clientFinalized({ proc }) {
      clients?.finalized(proc.nspace, proc.rank);
      if (spawned(proc.nspace)) return sp()!.finalized(proc.nspace, proc.rank);
      if (rm.isPoolNamespace(proc.nspace))
        return answer(() => rm.poolClientGone(proc.nspace, proc.rank, 'its worker finalized its MPI session'));
      return answer(() => rm.memberFinalized(proc.nspace, proc.rank));
    },

    async abort({ proc, status, message }) {
      // Open MPI's MPI_Abort names no procs: the caller's whole namespace, i.e. its job; from a
      // pool rank, the in-process job its worker is in; from a spawned process, its parent's job.
      if (spawned(proc.nspace)) return sp()!.abort(proc, status, message);
      if (rm.isPoolNamespace(proc.nspace)) return answer(() => rm.poolAbort(proc.nspace, proc.rank, status, message));
      return answer(() => rm.abort(proc.nspace, proc.rank, status, message));
    },

    async localEvent({ status, source, info: items }) {
      // Only libpmix's own word that a connection dropped says that a process is gone.
      // PROC_TERM_WO_SYNC (registered too) comes from Open MPI's fault tolerance in a *living*
      // process: one whose TCP link to a peer broke relays its verdict to every local client, as
      // the event's source, naming the peer (EVENT_AFFECTED_PROC). Counting that source as gone
      // took a living pool rank off the attached clients, and the next failed job's notice then
      // named it dead to the others, who marked it failed for good: a later job on the survivors
      // failed with MPI_ERR_PROC_FAILED naming it while it waited in MPI_Comm_dup forever.
      if (status !== Status.ERR_LOST_CONNECTION && status !== Status.ERR_UNREACH) return;
      // libpmix batches losses inside its event window: the first proc is the source, the
      // others come as PMIX_PROCID entries.
      const procs: Proc[] = source ? [source] : [];
      for (const i of items) if (i.key === Keys.PROCID && i.value.type === 'proc') procs.push(i.value.value);
      for (const p of procs) {
        clients?.lost(p.nspace, p.rank);
        if (rm.isPoolNamespace(p.nspace)) {
          // A pool rank's connection drops only when its worker process dies.
          if (status !== Status.ERR_LOST_CONNECTION) continue;
          log?.('warn', 'a worker process in the pool died', { nspace: p.nspace, rank: p.rank, status });
          try {
            rm.poolClientGone(p.nspace, p.rank, 'its worker process died (its connection to the PMIx server dropped)');
          } catch (err) {
            log?.('debug', 'lost connection of an unknown pool rank', {
              nspace: p.nspace,
              rank: p.rank,
              err: String(err),
            });
          }
          continue;
        }
        if (!rm.jobByNamespace(p.nspace)) continue;
        log?.('warn', 'PMIx client lost before it finalized', { nspace: p.nspace, rank: p.rank, status });
        try {
          rm.memberLost(p.nspace, p.rank, 'its connection to the PMIx server dropped before it finalized');
        } catch (err) {
          log?.('debug', 'lost connection of an unknown rank', { nspace: p.nspace, rank: p.rank, err: String(err) });
        }
      }
    },

    async fence({ procs, data }) {
      // With one central server libpmix completes fences itself; this runs only if a fence
      // spans clients it does not hold. Every local contribution arrives in this one call.
      return answer(async () => {
        if (procs.some((p) => rm.isPoolNamespace(p.nspace) || spawned(p.nspace))) return data;
        const byNs = ranksByNamespace(rm, procs);
        if (byNs.size !== 1) return data;
        const [[nspace, ranks]] = [...byNs.entries()] as [[string, number[]]];
        const res = await rm.collective(nspace, { name: 'fence', participants: ranks, contributors: ranks, data });
        return Buffer.concat(res.contributions.map((c) => Buffer.from(c.data ?? new Uint8Array())));
      });
    },

    async directModex({ proc }) {
      // Only reached for a proc that is not our client, which does not happen with one server.
      throw new PmixError(Status.ERR_NOT_FOUND, `no modex data for ${proc.nspace}:${proc.rank}`);
    },

    async publish({ proc, info: items }) {
      return answer(() => {
        const entries = items.filter((i) => !i.key.startsWith('pmix.')).map((i) => ({ key: i.key, value: i.value }));
        rm.names.publish(publisherOf(proc), entries, { range: rangeOf(items), persistence: persistenceOf(items) });
      });
    },

    async lookup({ proc, keys, info: dirs }) {
      return answer(async () => {
        const timeout = findNumber(dirs, Keys.TIMEOUT);
        const found = await rm.names.lookup(publisherOf(proc), keys, {
          range: rangeOf(dirs),
          wait: waitOf(dirs),
          ...(timeout && timeout > 0 ? { timeoutMs: timeout * 1000 } : {}),
        });
        return found.map(
          (d): PublishedDatum => ({
            proc: { nspace: d.publisher.namespace, rank: d.publisher.rank },
            key: d.key,
            value: d.value as Value,
          }),
        );
      });
    },

    async unpublish({ proc, keys, info: dirs }) {
      return answer(() => {
        rm.names.unpublish(publisherOf(proc), keys, findValue(dirs, Keys.RANGE) ? rangeOf(dirs) : undefined);
      });
    },

    async spawn(a) {
      const spawner = sp();
      if (!spawner) throw new PmixError(Status.ERR_NOT_SUPPORTED, 'MPI_Comm_spawn is not served by this sidecar');
      return answer(() => spawner.spawn(a));
    },

    // Reached only when a participant is not a local client; with one server all are.
    async connect() {},
    async disconnect() {},
    async registerEvents() {},
    async deregisterEvents() {},
    async notifyEvent({ status, source }) {
      log?.('debug', 'event from a client', { status, source });
    },

    async query({ queries }) {
      // libpmix answers what it can itself and asks about the rest. What we know is answered;
      // PMIX_ERR_PARTIAL_SUCCESS says that some keys were not (the standard's answer), and only
      // a query with no answer at all fails.
      return answer(() => {
        const out: Info[] = [];
        let unanswered = 0;
        for (const q of queries) {
          for (const key of q.keys) {
            const got = queryAnswer(key, q);
            if (got.length === 0) unanswered++;
            out.push(...got);
          }
        }
        if (out.length === 0) throw new PmixError(Status.ERR_NOT_FOUND, 'no answer to any query key');
        return unanswered > 0 ? new WithStatus(Status.ERR_PARTIAL_SUCCESS, out) : out;
      });
    },

    // Without a job_control upcall libpmix leaves a shared-memory segment per rank behind.
    async jobControl() {
      throw new PmixError(Status.ERR_NOT_SUPPORTED, 'job control is not supported');
    },

    async log({ proc, data }) {
      // The message goes to the sidecar's log, whatever channel the client named.
      const channels = [
        Keys.LOG_STDERR,
        Keys.LOG_STDOUT,
        Keys.LOG_SYSLOG,
        Keys.LOG_LOCAL_SYSLOG,
        Keys.LOG_GLOBAL_SYSLOG,
      ] as string[];
      const messages = data.filter((d) => channels.includes(d.key) && d.value.type === 'string');
      if (messages.length === 0)
        throw new PmixError(
          Status.ERR_NOT_SUPPORTED,
          `no log channel this server serves in ${data.map((d) => d.key).join(', ')}`,
        );
      for (const m of messages) {
        log?.('info', String(m.value.value).replace(/\n$/, ''), {
          pmixLog: m.key.replace('pmix.log.', ''),
          nspace: proc.nspace,
          rank: proc.rank,
        });
      }
    },

    async group({ op, group, procs, directives }) {
      log?.('debug', 'group upcall', { op, group, procs: procs.length });
      // libpmix answers a destruct itself (5.0.11 bug workaround in the binding); we only hear of it.
      if (op !== 'construct') return [];
      return answer(async () => {
        const pooled = procs.filter((p) => rm.isPoolNamespace(p.nspace));
        if (pooled.length > 0) {
          // Every pool rank is this server's client, so libpmix collected the whole group before
          // this upcall; an in-process job runs once its tagged communicator is built.
          const ns = pooled[0]!.nspace;
          if (pooled.length !== procs.length || pooled.some((p) => p.nspace !== ns || p.rank === Rank.WILDCARD)) {
            throw new PmixError(Status.ERR_BAD_PARAM, 'a group may not mix pool ranks with other processes');
          }
          rm.poolGroupConstructed(
            ns,
            group,
            procs.map((p) => p.rank),
          );
        }
        const byNs = ranksByNamespace(
          rm,
          procs.filter((p) => !rm.isPoolNamespace(p.nspace)),
        );
        for (const [nspace, ranks] of byNs) {
          await rm.collective(nspace, { name: `group:${group}`, participants: ranks, contributors: ranks });
        }
        const out: Info[] = [
          info(Keys.GROUP_CONTEXT_ID, v.size(rm.contextIds.allocate())),
          // Required: the 5.0.x client fails the construct without the final membership.
          info(Keys.GROUP_MEMBERSHIP, v.procs(procs)),
        ];
        // The members' endpoint data, collected by libpmix, goes back for it to store, qualified
        // by the new context id, for procs that do not have it yet. Pool ranks have theirs here
        // already (each is this server's client), and a copy per job under a context id never
        // used again is never freed: the pool namespace's hash grew by every in-process job's
        // data (about 50 KB for four ranks) and every store searched it (an in-process job took
        // 0.04 s at first and 1.3 s after 800, idle machine).
        const endpt = pooled.length > 0 ? undefined : findValue(directives, Keys.GROUP_ENDPT_DATA);
        if (endpt) out.push(info(Keys.GROUP_ENDPT_DATA, endpt));
        return out;
      });
    },
  };
}
