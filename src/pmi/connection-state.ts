// What one client connection knows, shared by its PMI-1 and PMI-2 command handlers (a PMI-2
// client speaks one PMI-1 line before switching), plus the checks both protocols make.
import { checkPmiId } from './credential.js';
import { errorMessage, PmiError } from './errors.js';
import type { PmiConnectionInfo, PmiJobCore, PmiMember } from './job-core.js';
import { LIMITS } from './limits.js';
import { clip } from './pmi1-codec.js';
import { processMapping } from './process-mapping.js';

/** Keys the process manager answers itself; clients may not put them (as hydra). */
export const RESERVED_KEY_PREFIX = 'PMI_';

/** refused: a bind failed; the connection is closing and reads nothing more. */
export type Phase = 'new' | 'bound' | 'finalized' | 'aborted' | 'refused';

export class ConnectionState {
  phase: Phase = 'new';
  member: PmiMember | undefined;
  /** Wire version the client asked for with `cmd=init`; PMI-2 frames also set it. */
  version: 1 | 2 | undefined;
  /**
   * A PMI-2 client of the older dialect (MPICH 4.0 simple2pmi, Slurm's libpmi2, so Intel MPI
   * with I_MPI_PMI=pmi2): it sends `threaded=` in fullinit and unescapes `;;` in values.
   */
  pmi2Escapes = false;
  /**
   * How the connection was bound. After an initack (the starter's handshake, see credential.ts)
   * a PMI-2 client's own fullinit is still to come, naming its rank.
   */
  boundBy: 'initack' | 'fullinit' | undefined;
  private mapping: string | undefined;

  constructor(
    readonly core: PmiJobCore,
    readonly conn: PmiConnectionInfo,
    private readonly onError?: (what: string, err: unknown) => void,
  ) {}

  /**
   * The error to answer a failed command with. A PmiError is the expected kind (the core's
   * adapter turns the core's errors into them); anything else is a bug, answered all the same
   * but reported.
   */
  replyError(what: string, e: unknown): PmiError {
    if (e instanceof PmiError) return e;
    this.onError?.(what, e);
    return new PmiError(errorMessage(e));
  }

  /** The bound member, or a PmiError saying why there is none. */
  requireMember(): PmiMember {
    if (this.phase === 'finalized') throw new PmiError('this connection has already finalized');
    if (this.phase === 'aborted') throw new PmiError('this connection has already aborted');
    if (!this.member) {
      throw new PmiError(
        'no PMI_ID: bind the connection with the PMI_ID credential (PMI-1 initack / PMI-2 fullinit) before other commands',
      );
    }
    return this.member;
  }

  bind(pmiId: string | undefined): PmiMember {
    if (this.phase !== 'new')
      throw new PmiError(`already ${this.phase === 'bound' ? 'initialized' : this.phase} on this connection`);
    let member: PmiMember;
    try {
      member = this.core.attach(checkPmiId(pmiId), this.conn);
    } catch (e) {
      // Set before any further frame of this connection is looked at (see PmiConnection).
      this.phase = 'refused';
      throw e;
    }
    this.member = member;
    this.phase = 'bound';
    return member;
  }

  /** PMI_process_mapping of the bound member's job ('' when the core gave no hosts). */
  processMapping(member: PmiMember): string {
    this.mapping ??= member.info.hosts.length === member.info.size ? processMapping(member.info.hosts) : '';
    return this.mapping;
  }

  /**
   * Job attributes the server derives itself, then the core's. PMI-1 clients read them with
   * `get`, PMI-2 clients with `info-getjobattr`.
   */
  jobAttr(member: PmiMember, key: string): string | undefined {
    if (key === 'PMI_process_mapping') {
      const m = this.processMapping(member);
      // Longer than a reply line can carry: let MPICH fall back to exchanging host names.
      return m !== '' && m.length <= LIMITS.valueMax - 64 ? m : undefined;
    }
    if (key === 'universeSize' || key === 'PMI_universe_size') return String(member.info.universeSize);
    return member.jobAttr(key);
  }
}

export function checkKvsname(member: PmiMember, kvsname: string | undefined): void {
  if (kvsname === undefined) throw new PmiError('missing kvsname=');
  if (kvsname !== member.info.kvsname) {
    throw new PmiError(`wrong kvsname ${clip(kvsname)}: this member belongs to ${member.info.kvsname}`);
  }
}

export function checkKey(key: string | undefined, forPut: boolean): string {
  if (key === undefined || key === '') throw new PmiError('missing key=');
  // Control characters never occur in MPICH's keys; refusing them keeps keys printable and
  // leaves the core free to build its own internal keys with them.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it refuses
  if (/[\x00-\x1f\x7f]/.test(key)) throw new PmiError('key contains control characters');
  if (key.length > LIMITS.keyMax) throw new PmiError(`key longer than ${LIMITS.keyMax} characters`);
  if (forPut && key.startsWith(RESERVED_KEY_PREFIX)) {
    throw new PmiError(`keys beginning with ${RESERVED_KEY_PREFIX} are reserved for the process manager`);
  }
  return key;
}

export function checkValue(value: string | undefined, what = 'value'): string {
  if (value === undefined) throw new PmiError(`missing ${what}=`);
  if (value.length > LIMITS.valueMax) throw new PmiError(`${what} longer than ${LIMITS.valueMax} characters`);
  return value;
}

/** A name-service name (MPI_Publish_name's service): held to the kvsname maximum. */
export function checkService(args: ReadonlyMap<string, string>, key: string): string {
  const v = requireArg(args, key);
  if (v.length > LIMITS.kvsnameMax) throw new PmiError(`${key} longer than ${LIMITS.kvsnameMax} characters`);
  return v;
}

export function requireArg(args: ReadonlyMap<string, string>, key: string): string {
  const v = args.get(key);
  if (v === undefined || v === '') throw new PmiError(`missing ${key}=`);
  return v;
}

/** A decimal int32 as MPICH prints them with %d. */
export function parseIntArg(s: string | undefined, what: string): number {
  if (s === undefined || !/^-?\d{1,10}$/.test(s)) throw new PmiError(`${what} must be an integer`);
  const n = Number(s);
  if (n < -(2 ** 31) || n >= 2 ** 31) throw new PmiError(`${what} out of range`);
  return n;
}
