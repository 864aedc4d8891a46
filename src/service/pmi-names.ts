// PMI's name service (PMI_Publish_name / Lookup_name / Unpublish_name, PMI-2 Nameserv_*) over the
// core's, for a job's ranks and for the MPICH worlds alike: one session-wide range, ports as
// strings, and the core's errors as PMI errors.
import { PmiError } from '../pmi/index.js';
import { isRmError, type ResourceManager } from '../rm/index.js';

type Publisher = Parameters<ResourceManager['names']['publish']>[0];

/** The core's errors are the client's to hear; anything else stays a bug for the server to report. */
export function asPmiError(e: unknown): unknown {
  return isRmError(e) ? new PmiError(e.message) : e;
}

/** Runs a call into the core, turning its errors into PMI errors. */
export function core<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw asPmiError(e);
  }
}

export async function coreAsync<T>(p: () => Promise<T>): Promise<T> {
  try {
    return await p();
  } catch (e) {
    throw asPmiError(e);
  }
}

export function publishName(rm: ResourceManager, publisher: Publisher, service: string, port: string): void {
  core(() => rm.names.publish(publisher, [{ key: service, value: port }], { range: 'session' }));
}

export async function lookupName(rm: ResourceManager, publisher: Publisher, service: string): Promise<string> {
  const [d] = await coreAsync(() => rm.names.lookup(publisher, [service], { range: 'session' }));
  const v = d?.value as unknown;
  if (typeof v === 'string') return v;
  // Published through PMIx by an Open MPI job: a typed value.
  if (v && typeof v === 'object' && typeof (v as { value?: unknown }).value === 'string')
    return (v as { value: string }).value;
  throw new PmiError(`service ${service} was published with a value PMI cannot carry`);
}

export function unpublishName(rm: ResourceManager, publisher: Publisher, service: string): void {
  if (core(() => rm.names.unpublish(publisher, [service])) === 0) {
    throw new PmiError(`service ${service} is not published by this process`);
  }
}
