// Cuts a connection's byte stream into PMI frames, telling the two wire formats apart the way
// MPICH's own server does (PMIU_check_full_cmd): a frame that starts with `cmd=` or `mcmd=` is
// PMI-1 (a line, or a spawn block up to `endcmd`), anything else must start with a 6-character
// length and is PMI-2. The test is made per frame because a PMI-2 client opens with one
// PMI-1-framed `cmd=init pmi_version=2` line.
//
// Bytes are handled as latin1 strings, one character per byte, so lengths match the wire and
// arbitrary bytes never throw. Memory per connection is bounded: nothing longer than a frame's
// limit is ever buffered; an over-long line or PMI-2 body is skipped and reported, and the
// stream resynchronises after it.
import { PMI1_MAX_LINE, PMI2_MAX_BODY } from './limits.js';
import { isPmi2Header, PMI2_HEADER } from './pmi2-codec.js';

/** Upper bound on a whole spawn block (many argument and info lines). */
export const PMI1_MAX_BLOCK = 64 * 1024;

export type Frame =
  | { readonly kind: 'line'; readonly text: string }
  | { readonly kind: 'block'; readonly lines: readonly string[] }
  | { readonly kind: 'pmi2'; readonly body: string }
  /** Framing error. Recoverable ones have been skipped; after a fatal one the stream is unusable. */
  | { readonly kind: 'error'; readonly wire: 1 | 2 | 0; readonly message: string; readonly fatal: boolean };

type Skip = { until: 'newline' } | { until: 'bytes'; left: number } | null;

export class WireFramer {
  private buf = '';
  private skip: Skip = null;
  private dead = false;

  /** Feeds bytes; returns the frames completed by them. */
  push(chunk: Buffer | string): Frame[] {
    this.append(chunk);
    const out: Frame[] = [];
    for (let frame = this.take(); frame; frame = this.take()) out.push(frame);
    return out;
  }

  /** Feeds bytes without framing them yet (see take). */
  append(chunk: Buffer | string): void {
    if (!this.dead) this.buf += typeof chunk === 'string' ? chunk : chunk.toString('latin1');
  }

  /** The next complete frame, or null until more bytes come. */
  take(): Frame | null {
    if (this.dead) return null;
    if (this.skip && !this.skipAhead()) return null;
    const frame = this.cut();
    if (frame?.kind === 'error' && frame.fatal) {
      this.dead = true;
      this.buf = '';
    }
    return frame;
  }

  /**
   * What is buffered and not framed, and what is being skipped (the rest of an over-long line,
   * or `bytes` more of an over-long PMI-2 body): for whoever reads the stream on from here.
   */
  rest(): { bytes: string; skipLine: boolean; skipBytes: number } {
    const s = this.skip;
    return { bytes: this.buf, skipLine: s?.until === 'newline', skipBytes: s?.until === 'bytes' ? s.left : 0 };
  }

  /** Bytes buffered but not yet framed (bounded by the frame limits). */
  get pending(): number {
    return this.buf.length;
  }

  /** Consumes skipped bytes; false when more input is needed. */
  private skipAhead(): boolean {
    const s = this.skip!;
    if (s.until === 'newline') {
      const nl = this.buf.indexOf('\n');
      if (nl < 0) {
        this.buf = '';
        return false;
      }
      this.buf = this.buf.slice(nl + 1);
    } else {
      const n = Math.min(s.left, this.buf.length);
      this.buf = this.buf.slice(n);
      s.left -= n;
      if (s.left > 0) return false;
    }
    this.skip = null;
    return true;
  }

  private cut(): Frame | null {
    const b = this.buf;
    if (b.length === 0) return null;
    if (b.startsWith('cmd=')) return this.line();
    if (b.startsWith('mcmd=')) return this.block();
    // Not enough bytes yet to tell a PMI-1 prefix from a PMI-2 length.
    if (b.length < PMI2_HEADER && ('cmd='.startsWith(b) || 'mcmd='.startsWith(b) || /^ *\d* *$/.test(b))) return null;
    const head = b.slice(0, PMI2_HEADER);
    if (isPmi2Header(head)) return this.pmi2(Number(head.trim()));
    return {
      kind: 'error',
      wire: 0,
      fatal: true,
      message: 'not a PMI command: expected cmd=, mcmd= or a 6-digit PMI-2 length',
    };
  }

  private line(): Frame | null {
    const nl = this.buf.indexOf('\n');
    if (nl < 0 || nl + 1 > PMI1_MAX_LINE) {
      if (nl < 0 && this.buf.length < PMI1_MAX_LINE) return null;
      // Too long: drop it up to its newline (which may not have arrived yet).
      if (nl < 0) {
        this.buf = '';
        this.skip = { until: 'newline' };
      } else {
        this.buf = this.buf.slice(nl + 1);
      }
      return { kind: 'error', wire: 1, fatal: false, message: `line longer than ${PMI1_MAX_LINE} bytes` };
    }
    const text = this.buf.slice(0, nl);
    this.buf = this.buf.slice(nl + 1);
    return { kind: 'line', text: text.endsWith('\r') ? text.slice(0, -1) : text };
  }

  /** A spawn block: lines up to and including `endcmd`. */
  private block(): Frame | null {
    const lines: string[] = [];
    let pos = 0;
    for (;;) {
      const nl = this.buf.indexOf('\n', pos);
      if (nl < 0 || nl + 1 - pos > PMI1_MAX_LINE || nl + 1 > PMI1_MAX_BLOCK) {
        const tooLong = nl < 0 ? this.buf.length - pos >= PMI1_MAX_LINE || this.buf.length >= PMI1_MAX_BLOCK : true;
        if (!tooLong) return null;
        // The rest of a broken block cannot be told from garbage: give the stream up.
        return {
          kind: 'error',
          wire: 1,
          fatal: true,
          message: `spawn block line longer than ${PMI1_MAX_LINE} bytes or block longer than ${PMI1_MAX_BLOCK} bytes`,
        };
      }
      const line = this.buf.slice(pos, nl);
      pos = nl + 1;
      if (line === 'endcmd') {
        this.buf = this.buf.slice(pos);
        return { kind: 'block', lines };
      }
      lines.push(line);
    }
  }

  private pmi2(len: number): Frame | null {
    if (len === 0 || len > PMI2_MAX_BODY) {
      this.buf = this.buf.slice(PMI2_HEADER);
      this.skip = { until: 'bytes', left: len };
      return {
        kind: 'error',
        wire: 2,
        fatal: false,
        message: len === 0 ? 'empty PMI-2 command' : `PMI-2 command longer than ${PMI2_MAX_BODY} bytes`,
      };
    }
    if (this.buf.length < PMI2_HEADER + len) return null;
    const body = this.buf.slice(PMI2_HEADER, PMI2_HEADER + len);
    this.buf = this.buf.slice(PMI2_HEADER + len);
    return { kind: 'pmi2', body };
  }
}
