// The PMI-1 / PMI-2 wire server for MPICH and Intel MPI.
export { PmiListener, type PmiListenerOptions } from './listener.js';
export type { Trace, TraceEvent } from './connection.js';
export type {
  KvsLookup, PmiConnectionInfo, PmiJobCore, PmiMember, PmiMemberInfo, SpawnApp, SpawnRequest,
} from './job-core.js';
export { PmiError, PMI_FAIL } from './errors.js';
export { newPmiId, checkPmiId } from './credential.js';
export { LIMITS, PMI1_MAX_LINE, PMI2_MAX_BODY } from './limits.js';
export { nodeLayout, processMapping, parseProcessMapping, type NodeLayout } from './process-mapping.js';
