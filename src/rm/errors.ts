// The one error type of the core. Each boundary maps `kind` to its own vocabulary:
// REST status codes, PMIx statuses, PMI rc/msg.

export type RmErrorKind =
  | 'bad_request' // malformed input the schema could not catch
  | 'not_found' // an unknown id in a path or a protocol message
  | 'conflict' // the state forbids it now: duplicate, in use, already in a job
  | 'unprocessable' // refers to something that does not exist, or a selector that cannot be met
  | 'unavailable' // the sidecar is stopping or at capacity
  | 'limit' // one more would pass a configured bound (workers, psets, names, waiting jobs)
  | 'timeout' // a collective, lookup or wiring deadline expired
  | 'aborted'; // the job ended (member lost, MPI_Abort, deleted) while this was pending

export class RmError extends Error {
  readonly kind: RmErrorKind;
  constructor(kind: RmErrorKind, message: string) {
    super(message);
    this.name = 'RmError';
    this.kind = kind;
  }
}

export const isRmError = (e: unknown): e is RmError => e instanceof RmError;
