// PMIx status codes used by dask-pmix (values from the PMIx 5.0 headers, checked by the tests),
// and the error type that carries one.
export const Status = {
  SUCCESS: 0,
  ERROR: -1,
  ERR_PROC_ABORTED: -7,
  ERR_PROC_REQUESTED_ABORT: -8,
  ERR_PROC_ABORTING: -9,
  ERR_EXISTS: -11,
  ERR_INVALID_CRED: -12,
  ERR_WOULD_BLOCK: -15,
  ERR_TYPE_MISMATCH: -18,
  ERR_NO_PERMISSIONS: -23,
  ERR_TIMEOUT: -24,
  ERR_UNREACH: -25,
  ERR_BAD_PARAM: -27,
  ERR_OUT_OF_RESOURCE: -29,
  ERR_INIT: -31,
  ERR_NOMEM: -32,
  ERR_NOT_FOUND: -46,
  ERR_NOT_SUPPORTED: -47,
  ERR_COMM_FAILURE: -49,
  ERR_PARTIAL_SUCCESS: -52,
  ERR_DUPLICATE_KEY: -53,
  PROCESS_SET_DEFINE: -55,
  PROCESS_SET_DELETE: -56,
  ERR_LOST_CONNECTION: -61,
  ERR_NOT_AVAILABLE: -64,
  PROC_TERMINATED: -111,
  ERR_JOB_TERMINATED: -145,
  OPERATION_IN_PROGRESS: -156,
  OPERATION_SUCCEEDED: -157,
  GROUP_CONSTRUCT_ABORT: -165,
  GROUP_MEMBER_FAILED: -170,
  ERR_JOB_FAILED_TO_LAUNCH: -181,
  ERR_JOB_ABORTED: -182,
  ERR_JOB_TERM_WO_SYNC: -185,
  ERR_PROC_TERM_WO_SYNC: -200,
  EVENT_PROC_TERMINATED: -201,
  EVENT_NODE_DOWN: -231,
} as const;

export const StatusName: Readonly<Record<number, string>> = Object.fromEntries(
  Object.entries(Status).map(([name, code]) => [code, `PMIX_${name}`]),
);

export const Range = {
  UNDEF: 0,
  RM: 1,
  LOCAL: 2,
  NAMESPACE: 3,
  SESSION: 4,
  GLOBAL: 5,
  CUSTOM: 6,
  PROC_LOCAL: 7,
} as const;

export const Persistence = {
  INDEF: 0,
  FIRST_READ: 1,
  PROC: 2,
  APP: 3,
  SESSION: 4,
} as const;

export const Rank = {
  UNDEF: 0xffffffff,
  WILDCARD: 0xfffffffe,
  LOCAL_NODE: 0xfffffffd,
  INVALID: 0xfffffffc,
  LOCAL_PEERS: 0xfffffffb,
} as const;

/** A PMIx error status, as thrown by the server API and as upcall handlers answer clients. */
export class PmixError extends Error {
  readonly status: number;
  constructor(status: number, message?: string) {
    const name = StatusName[status] ?? `PMIx status ${status}`;
    super(message ? `${message} (${name})` : name);
    this.name = 'PmixError';
    this.status = status;
  }

  /** The status to answer a client with for any thrown value. */
  static statusOf(err: unknown): number {
    if (err instanceof PmixError) return err.status;
    if (err && typeof err === 'object' && typeof (err as { status?: unknown }).status === 'number') {
      return (err as { status: number }).status;
    }
    return Status.ERROR;
  }
}
