// Context ids for PMIx group construction (MPI_Comm_create_from_group). They must be unique
// across the whole PMIx server, whatever the job; like PRRTE we count down from UINT32_MAX.
import { RmError } from './errors.js';

export class ContextIds {
  private next = 0xffffffff;

  allocate(): number {
    if (this.next <= 0) throw new RmError('unavailable', 'context ids exhausted');
    return this.next--;
  }

  /** How many have been handed out. */
  get allocated(): number {
    return 0xffffffff - this.next;
  }
}
