// What the PMIx backend (one namespace per job) and the in-process pool (one per epoch) do alike
// with a namespace of the embedded libpmix server: register it from its layout, tell its ranks a
// job ended, and tear it down.
import { rmSync } from 'node:fs';
import {
  encodeNamespace,
  type Info,
  info,
  Keys,
  type NamespaceLayout,
  type PmixServer,
  type Proc,
  Range,
  Rank,
  Status,
  v,
} from '../pmix/index.js';
import type { Job } from '../rm/index.js';

/**
 * Registers the namespace of `layout`. Every rank is a client of this one server, wherever it
 * runs: nlocalprocs is the namespace's size, so libpmix completes its fences itself.
 */
export function registerNamespace(server: PmixServer, layout: NamespaceLayout): Promise<void> {
  return server.registerNspace(layout.nspace, layout.ranks.length, encodeNamespace(layout, server));
}

/**
 * Deregisters the `ranks` of `nspace` (a failure is only reported), then the namespace, and
 * removes its session files under `dir`.
 */
export async function teardownNamespace(
  server: PmixServer,
  nspace: string,
  ranks: Iterable<number>,
  dir: string,
  onError?: (what: string, err: unknown) => void,
): Promise<void> {
  for (const rank of ranks) {
    await server.deregisterClient({ nspace, rank }).catch((e: unknown) => onError?.('deregisterClient', e));
  }
  await server.deregisterNspace(nspace);
  rmSync(dir, { recursive: true, force: true });
}

/**
 * Sends event `status` with `items` to the `targets` alone, all of `nspace` (a failure is only
 * reported). libpmix applies a range to clients only when it is a custom one with explicit
 * targets; the source, our namespace's undefined rank, matches none of them (a wildcard rank
 * would match all, and libpmix does not send an event back to its source).
 */
export async function notifyRanks(
  server: PmixServer,
  nspace: string,
  status: number,
  items: Info[],
  targets: Proc[],
  onError?: (what: string, err: unknown) => void,
): Promise<void> {
  const range = info(Keys.EVENT_CUSTOM_RANGE, v.procs(targets));
  await server
    .notifyEvent(status, { nspace, rank: Rank.UNDEF }, Range.CUSTOM, [...items, range])
    .catch((e: unknown) => onError?.('notifyEvent', e));
}

/**
 * The code a job's end is told to its ranks with. Open MPI 5 registers handlers for these two
 * (its errhandler then aborts the rank instead of letting it hang; with fault tolerance, its
 * handler reads each PMIX_PROC value as a failed process); any other code reaches its default
 * handler, which aborts.
 */
export function jobEndStatus(job: Readonly<Job>): number {
  return job.state === 'aborted' ? Status.ERR_PROC_ABORTED : Status.ERR_PROC_TERM_WO_SYNC;
}

/** The event's text: which job ended, how, and why. */
export function jobEndMessage(job: Readonly<Job>): Info {
  return info(Keys.EVENT_TEXT_MESSAGE, v.string(`dask-pmix: job ${job.id} ${job.state}: ${job.error ?? ''}`));
}
