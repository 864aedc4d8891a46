// The first message a PMIx client or tool sends on a new connection to the server, as libpmix
// 5.0.x writes it (src/mca/ptl/base/ptl_base_fns.c, construct_message) and reads it
// (ptl_base_connection_hdlr.c, pmix_ptl_base_connection_handler).
//
// The gate (gate.ts) reads this message before libpmix does, because libpmix's own reading of it
// is where a connection can hurt the server: it reads on its progress thread with a blocking
// recv and no deadline, and several of its refusals after that point corrupt its own lists.
//
//   header   int32 pindex, uint32 tag, uint32 nbytes, uint32 padding   host byte order
//   body     psec module   NUL-terminated string
//            credential    uint32 length (network order), then that many bytes
//            peer flag     uint8 (PeerFlag)
//            identity      per flag: nspace string + uint32 rank; uint32 uid + uint32 gid; or both
//            version       string, e.g. "5.0.11"
//            bfrops        string, e.g. "v41"   (absent, like what follows, for a 2.0 peer)
//            buffer type   uint8
//            gds           string, e.g. "hash"
//            blob          the rest: a bfrops-packed count and pmix_info_t array, or nothing

export const HEADER_BYTES = 16;
/** libpmix refuses a longer body (PMIX_MAX_CRED_SIZE). */
export const MAX_BODY_BYTES = 131072;

export const PeerFlag = {
  SIMPLE_CLIENT: 0,
  LEGACY_TOOL: 1,
  LEGACY_LAUNCHER: 2,
  TOOL_NEEDS_ID: 3,
  TOOL_GIVEN_ID: 4,
  TOOL_CLIENT: 5,
  LAUNCHER_NEEDS_ID: 6,
  LAUNCHER_GIVEN_ID: 7,
  LAUNCHER_CLIENT: 8,
  SINGLETON_CLIENT: 9,
  SCHEDULER_WITH_ID: 10,
} as const;

/** Buffer types of libpmix's bfrops (pmix_bfrop_buffer_type_t). */
export const BufferType = { NON_DESC: 1, FULLY_DESC: 2 } as const;

export interface Handshake {
  psec: string;
  credential: Buffer;
  flag: number;
  /** The identity the peer claims, when its flag carries one. */
  proc?: { nspace: string; rank: number };
  /** The uid and gid a tool or launcher states in clear. */
  uid?: number;
  gid?: number;
  version: string;
  bfrops: string;
  bufferType: number;
  gds: string;
  blob: Buffer;
}

export class HandshakeError extends Error {}

/** The total length of the handshake whose header is `header`, or an error if it is too long. */
export function handshakeLength(header: Buffer): number {
  const nbytes = header.readUInt32LE(8);
  if (nbytes > MAX_BODY_BYTES)
    throw new HandshakeError(`a handshake of ${nbytes} bytes is longer than libpmix accepts`);
  return HEADER_BYTES + nbytes;
}

class Reader {
  private at = 0;
  constructor(private readonly buf: Buffer) {}
  get rest(): number {
    return this.buf.length - this.at;
  }
  string(what: string): string {
    const end = this.buf.indexOf(0, this.at);
    if (end < 0) throw new HandshakeError(`the ${what} is not NUL-terminated`);
    const s = this.buf.toString('utf8', this.at, end);
    this.at = end + 1;
    return s;
  }
  u32(what: string): number {
    if (this.rest < 4) throw new HandshakeError(`the handshake ends before the ${what}`);
    const v = this.buf.readUInt32BE(this.at);
    this.at += 4;
    return v;
  }
  u8(what: string): number {
    if (this.rest < 1) throw new HandshakeError(`the handshake ends before the ${what}`);
    return this.buf[this.at++]!;
  }
  bytes(n: number, what: string): Buffer {
    if (this.rest < n) throw new HandshakeError(`the handshake ends inside the ${what}`);
    const b = this.buf.subarray(this.at, this.at + n);
    this.at += n;
    return b;
  }
  remaining(): Buffer {
    return this.bytes(this.rest, 'blob');
  }
}

/** Parses a whole handshake (header and body), as libpmix would; throws HandshakeError. */
export function parseHandshake(msg: Buffer): Handshake {
  if (msg.length < HEADER_BYTES) throw new HandshakeError('the handshake is shorter than its header');
  const total = handshakeLength(msg);
  if (msg.length !== total) throw new HandshakeError(`the handshake has ${msg.length} bytes, its header says ${total}`);
  const r = new Reader(msg.subarray(HEADER_BYTES));
  const psec = r.string('security module');
  const credential = Buffer.from(r.bytes(r.u32('credential length'), 'credential'));
  const flag = r.u8('peer flag');
  const out: Partial<Handshake> = { psec, credential, flag };
  const procId = () => {
    const nspace = r.string('namespace');
    out.proc = { nspace, rank: r.u32('rank') };
  };
  const ids = () => {
    out.uid = r.u32('uid');
    out.gid = r.u32('gid');
  };
  switch (flag) {
    case PeerFlag.SIMPLE_CLIENT:
      procId();
      break;
    case PeerFlag.LEGACY_TOOL:
    case PeerFlag.LEGACY_LAUNCHER:
    case PeerFlag.TOOL_NEEDS_ID:
    case PeerFlag.LAUNCHER_NEEDS_ID:
      ids();
      break;
    case PeerFlag.TOOL_GIVEN_ID:
    case PeerFlag.LAUNCHER_GIVEN_ID:
    case PeerFlag.SINGLETON_CLIENT:
    case PeerFlag.SCHEDULER_WITH_ID:
    case PeerFlag.TOOL_CLIENT:
    case PeerFlag.LAUNCHER_CLIENT:
      ids();
      procId();
      break;
    default:
      throw new HandshakeError(`unknown peer flag ${flag}`);
  }
  out.version = r.string('version');
  if (/^2\.0(\.|$)/.test(out.version)) throw new HandshakeError(`PMIx ${out.version} peers are not supported`);
  out.bfrops = r.string('bfrops module');
  out.bufferType = r.u8('buffer type');
  out.gds = r.string('gds module');
  out.blob = Buffer.from(r.remaining());
  return out as Handshake;
}

/** The uid and gid in a "native" security credential over TCP: two host-order 32-bit ids. */
export function nativeCredentialIds(h: Handshake): { uid: number; gid: number } | undefined {
  if (h.psec !== 'native' || h.credential.length !== 8) return undefined;
  return { uid: h.credential.readUInt32LE(0), gid: h.credential.readUInt32LE(4) };
}

/** Builds a handshake; the tests use it to speak to the server as a hostile or broken peer would. */
export function encodeHandshake(h: Handshake): Buffer {
  const parts: Buffer[] = [];
  const str = (s: string) => parts.push(Buffer.from(`${s}\0`, 'utf8'));
  const u32 = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n >>> 0);
    parts.push(b);
  };
  str(h.psec);
  u32(h.credential.length);
  parts.push(h.credential);
  parts.push(Buffer.from([h.flag]));
  const hasIds = h.flag !== PeerFlag.SIMPLE_CLIENT;
  const hasProc = h.proc !== undefined;
  if (hasIds) {
    u32(h.uid ?? 0);
    u32(h.gid ?? 0);
  }
  if (hasProc) {
    str(h.proc!.nspace);
    u32(h.proc!.rank);
  }
  str(h.version);
  str(h.bfrops);
  parts.push(Buffer.from([h.bufferType]));
  str(h.gds);
  parts.push(h.blob);
  const body = Buffer.concat(parts);
  const header = Buffer.alloc(HEADER_BYTES);
  header.writeInt32LE(-1, 0);
  header.writeUInt32LE(0xffffffff, 4);
  header.writeUInt32LE(body.length, 8);
  return Buffer.concat([header, body]);
}

/** A "native" TCP credential for these ids, as a client on this host writes it. */
export function nativeCredential(uid: number, gid: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeUInt32LE(uid, 0);
  b.writeUInt32LE(gid, 4);
  return b;
}
