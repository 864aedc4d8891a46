// Errors the PMI server answers a client with. A PmiError becomes `rc=<code> msg=...` (PMI-1)
// or `rc=<code>;errmsg=...;` (PMI-2) in the reply to the command that caused it; it never
// closes the connection by itself.

/** PMI_FAIL in MPICH's pmi.h; MPICH clients only test rc != 0, the message says why. */
export const PMI_FAIL = -1;

export class PmiError extends Error {
  readonly rc: number;
  constructor(message: string, rc: number = PMI_FAIL) {
    super(message);
    this.name = 'PmiError';
    this.rc = rc;
  }
}

/** The message of anything thrown, for an error reply. */
export function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
