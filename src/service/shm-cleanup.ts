// The /dev/shm segments Open MPI's shared-memory transport leaves when its ranks die with their
// job (a sidecar killed mid-job): sm_segment.<node>.<uid>.<jobid>.<local rank>, where Open MPI
// derives the jobid of a namespace it did not launch from a hash of the namespace's name
// (opal_pmix_convert_nspace: Jenkins one-at-a-time, folded to 16 bits, in the upper half).
import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';

function oneAtATime(s: string): number {
  let h = 0;
  for (const c of Buffer.from(s, 'utf8')) {
    h = (h + c) >>> 0;
    h = (h + (h << 10)) >>> 0;
    h = (h ^ (h >>> 6)) >>> 0;
  }
  h = (h + (h << 3)) >>> 0;
  h = (h ^ (h >>> 11)) >>> 0;
  return (h + (h << 15)) >>> 0;
}

/** The jobid Open MPI gives the ranks of `namespace`, as it prints it (hex). */
export function ompiJobId(namespace: string): string {
  const at = namespace.lastIndexOf('@');
  const hash = oneAtATime(at >= 0 ? namespace.slice(0, at) : namespace);
  const family = ((hash >>> 16) ^ (hash & 0xffff)) & 0xffff;
  const local = at >= 0 ? Number.parseInt(namespace.slice(at + 1), 10) & 0xffff || 0 : 0;
  return (((family << 16) | local) >>> 0).toString(16);
}

/** Removes the segments of these namespaces' ranks; returns the files removed. */
export function removeShmSegments(namespaces: readonly string[], dir = '/dev/shm'): string[] {
  if (!namespaces.length) return [];
  const ids = new Set(namespaces.map(ompiJobId));
  const removed: string[] = [];
  let files: string[];
  try {
    files = readdirSync(dir);
  } catch {
    return removed;
  }
  for (const f of files) {
    const m = /^sm_segment\..+\.\d+\.([0-9a-f]+)\.\d+$/.exec(f);
    if (!m || !ids.has(m[1]!)) continue;
    try {
      rmSync(join(dir, f), { force: true });
      removed.push(f);
    } catch {
      // Another user's, or gone already.
    }
  }
  return removed;
}
