// The info array at the end of a PMIx handshake, decoded as libpmix 5.0.x's "v41" bfrops module
// packs it into a non-described buffer (bfrop_pmix41.c; integers are LEB128 varints, signed ones
// zigzag-encoded; strings an int32 length with the NUL, then the bytes).
//
// Only the scalar types that clients and tools put there are understood. Anything else is refused,
// because the gate lets a blob through only if libpmix will read it as we did.
import { HandshakeError } from './handshake.js';

export interface BlobInfo {
  key: string;
  /** The PMIx data type id (PMIX_UINT32 = 14, ...). */
  type: number;
  value: string | number | bigint | boolean;
}

const T = {
  BOOL: 1,
  BYTE: 2,
  STRING: 3,
  SIZE: 4,
  PID: 5,
  INT: 6,
  INT8: 7,
  INT16: 8,
  INT32: 9,
  INT64: 10,
  UINT: 11,
  UINT8: 12,
  UINT16: 13,
  UINT32: 14,
  UINT64: 15,
  STATUS: 20,
  INFO_DIRECTIVES: 35,
  DATA_TYPE: 36,
  PROC_RANK: 40,
} as const;
const UNSIGNED = new Set<number>([
  T.SIZE,
  T.UINT,
  T.UINT16,
  T.UINT32,
  T.UINT64,
  T.PROC_RANK,
  T.INFO_DIRECTIVES,
  T.DATA_TYPE,
]);
const SIGNED = new Set<number>([T.INT, T.INT16, T.INT32, T.INT64, T.STATUS]);
const ONE_BYTE = new Set<number>([T.BYTE, T.INT8, T.UINT8]);

class Cursor {
  private at = 0;
  constructor(private readonly buf: Buffer) {}
  get done(): boolean {
    return this.at >= this.buf.length;
  }
  get rest(): number {
    return this.buf.length - this.at;
  }
  byte(): number {
    if (this.done) throw new HandshakeError('the handshake blob ends early');
    return this.buf[this.at++]!;
  }
  varint(): bigint {
    let v = 0n;
    for (let shift = 0n; shift < 70n; shift += 7n) {
      const b = this.byte();
      v |= BigInt(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw new HandshakeError('an integer in the handshake blob is too long');
  }
  signed(): bigint {
    const z = this.varint();
    return z & 1n ? -((z + 1n) >> 1n) : z >> 1n;
  }
  string(): string {
    const len = Number(this.signed());
    if (len < 0 || len > this.rest) throw new HandshakeError('a string length in the handshake blob is out of range');
    if (len === 0) return '';
    const s = this.buf.subarray(this.at, this.at + len);
    this.at += len;
    if (s[len - 1] !== 0) throw new HandshakeError('a string in the handshake blob is not NUL-terminated');
    return s.toString('utf8', 0, len - 1);
  }
}

const small = (v: bigint): number | bigint =>
  v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;

function value(c: Cursor, type: number): BlobInfo['value'] {
  if (type === T.BOOL) return c.byte() !== 0;
  if (type === T.STRING) return c.string();
  if (ONE_BYTE.has(type)) return c.byte();
  if (UNSIGNED.has(type)) return small(c.varint());
  if (SIGNED.has(type)) return small(c.signed());
  if (type === T.PID) {
    // pid_t is packed as the unsigned type of its width, with that type named first.
    const width = Number(c.varint());
    if (width !== T.UINT32 && width !== T.UINT64)
      throw new HandshakeError(`a pid in the handshake blob is packed as type ${width}`);
    return small(c.varint());
  }
  throw new HandshakeError(`the handshake blob holds a value of type ${type}, which the gate does not read`);
}

/** Decodes a handshake blob (empty: no infos); throws HandshakeError on anything unexpected. */
export function decodeInfoBlob(blob: Buffer): BlobInfo[] {
  if (blob.length === 0) return [];
  const c = new Cursor(blob);
  if (c.signed() !== 1n) throw new HandshakeError('the handshake blob does not start with one count');
  const n = c.varint();
  if (c.signed() !== n) throw new HandshakeError('the handshake blob counts its infos twice, differently');
  // Every info takes several bytes: a count beyond the blob's length is a lie.
  if (n > BigInt(c.rest)) throw new HandshakeError('the handshake blob claims more infos than it holds');
  const out: BlobInfo[] = [];
  for (let i = 0n; i < n; i++) {
    const key = c.string();
    if (key.length === 0 || key.length > 511)
      throw new HandshakeError('an info key in the handshake blob is empty or too long');
    c.varint(); // info directives
    const type = Number(c.varint());
    out.push({ key, type, value: value(c, type) });
  }
  if (!c.done) throw new HandshakeError('the handshake blob has bytes after its infos');
  return out;
}
