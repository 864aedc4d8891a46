// The PMI-1 / PMI-2 wire server for MPICH and Intel MPI.

export type { Trace, TraceEvent } from './connection.js';
export { checkPmiId, newPmiId } from './credential.js';
export { PMI_FAIL, PmiError } from './errors.js';
export type {
  KvsLookup,
  PmiConnectionInfo,
  PmiJobCore,
  PmiMember,
  PmiMemberInfo,
  SpawnApp,
  SpawnRequest,
} from './job-core.js';
export { LIMITS, PMI1_MAX_LINE, PMI2_MAX_BODY } from './limits.js';
export { PmiListener, type PmiListenerOptions } from './listener.js';
export { checkPeerUid, type PeerUid, peerUidRefusal } from './peer-uid.js';
export { type NodeLayout, nodeLayout, parseProcessMapping, processMapping } from './process-mapping.js';
