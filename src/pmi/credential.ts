// PMI_ID is the credential a connection binds to its member with, the only secret between a
// rank and the server: 128 random bits, as 32 hex digits, never the rank.
//
// MPICH and Intel MPI cannot send it themselves: their clients read PMI_ID with atoi and write
// `cmd=initack pmiid=%d` (MPICH 5 src/pmi/src/pmi_v1.c and pmi_v2.c, MPICH 4.0.2 and Intel MPI
// 2021 libmpi.so strings). So the process that starts a rank (the Dask worker's side,
// dask_pmix.pmi_connect; for a plain program `dask-pmix exec`, native/exec) opens the
// connection, sends the credential in a PMI-1 initack, and hands the bound connection to MPI as
// PMI_FD with PMI_RANK / PMI_SIZE: the PMI_FD path all of them take for hydra's socketpair, with no
// handshake of their own. A wrong credential costs the guesser its connection.
import { randomBytes } from 'node:crypto';
import { PmiError } from './errors.js';
import { clip } from './pmi1-codec.js';

export const PMI_ID_BYTES = 16;
const PATTERN = /^[0-9a-f]{32}$/;

export function newPmiId(): string {
  return randomBytes(PMI_ID_BYTES).toString('hex');
}

/** Throws unless `id` has the credential's form (an int means MPI sent PMI_ID itself). */
export function checkPmiId(id: string | undefined): string {
  if (id === undefined || id === '') throw new PmiError('missing PMI_ID (pmiid= / pmirank=)');
  if (!PATTERN.test(id)) {
    throw new PmiError(
      `PMI_ID ${clip(id, 12)} is not a dask-pmix credential (32 hex digits): MPI clients send PMI_ID as an int, ` +
        'so start the rank through `dask-pmix-exec PROGRAM` (or dask_pmix.pmi_connect in Python), which authenticates and hands MPI the connection as PMI_FD',
    );
  }
  return id;
}
