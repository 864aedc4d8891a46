// A raw PMI client over TCP for tests: sends exactly the bytes it is given and reads replies
// as PMI-1 lines or PMI-2 frames, so tests can speak the protocols right, wrong and in pieces.
import { connect, type Socket } from 'node:net';

export type Fields = Record<string, string>;

export class WireClient {
  private buf = '';
  private waiters: (() => void)[] = [];
  private ended = false;
  readonly closed: Promise<void>;

  private constructor(readonly socket: Socket) {
    socket.setNoDelay(true);
    socket.on('data', (d: Buffer) => {
      this.buf += d.toString('latin1');
      this.wake();
    });
    socket.on('error', () => {});
    this.closed = new Promise((resolve) =>
      socket.on('close', () => {
        this.ended = true;
        this.wake();
        resolve();
      }),
    );
  }

  /** Over TCP to host:port, or to a UNIX socket path. */
  static connect(port: number | string, host = '127.0.0.1'): Promise<WireClient> {
    return new Promise((resolve, reject) => {
      const s =
        typeof port === 'string'
          ? connect(port, () => resolve(new WireClient(s)))
          : connect(port, host, () => resolve(new WireClient(s)));
      s.once('error', reject);
    });
  }

  get isClosed(): boolean {
    return this.ended;
  }

  send(bytes: string | Buffer): void {
    this.socket.write(typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes);
  }

  close(): void {
    this.socket.destroy();
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  private async until<T>(take: () => T | undefined, ms: number, what: string): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = take();
      if (v !== undefined) return v;
      if (this.ended)
        throw new Error(`connection closed while waiting for ${what}; buffer ${JSON.stringify(this.buf)}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for ${what}; buffer ${JSON.stringify(this.buf)}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  /** The next PMI-1 reply line, without its newline. */
  line(ms = 5000): Promise<string> {
    return this.until(
      () => {
        const nl = this.buf.indexOf('\n');
        if (nl < 0) return undefined;
        const l = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        return l;
      },
      ms,
      'a PMI-1 line',
    );
  }

  /** The next PMI-2 frame's body. */
  frame(ms = 5000): Promise<string> {
    return this.until(
      () => {
        if (this.buf.length < 6) return undefined;
        const n = Number(this.buf.slice(0, 6).trim());
        if (this.buf.length < 6 + n) return undefined;
        const body = this.buf.slice(6, 6 + n);
        this.buf = this.buf.slice(6 + n);
        return body;
      },
      ms,
      'a PMI-2 frame',
    );
  }

  /** True if nothing arrives within `ms`. */
  async silent(ms: number): Promise<boolean> {
    await new Promise((r) => setTimeout(r, ms));
    return this.buf.length === 0;
  }

  /** Sends a PMI-1 command line and parses the one-line reply. */
  async cmd1(line: string, ms?: number): Promise<Fields> {
    this.send(`${line}\n`);
    return parse1(await this.line(ms));
  }

  /** Sends a PMI-2 body (length added) and parses the reply. */
  async cmd2(body: string, ms?: number): Promise<Fields> {
    this.send(frame2(body));
    return parse2(await this.frame(ms));
  }
}

export function frame2(body: string): string {
  return `${String(Buffer.byteLength(body, 'latin1')).padStart(6, ' ')}${body}`;
}

export function parse1(line: string): Fields {
  const out: Fields = {};
  for (const tok of line.split(' ')) {
    const eq = tok.indexOf('=');
    if (eq > 0) out[tok.slice(0, eq)] = tok.slice(eq + 1);
  }
  return out;
}

export function parse2(body: string): Fields {
  const out: Fields = {};
  for (const tok of body.split(';')) {
    const eq = tok.indexOf('=');
    if (eq > 0) out[tok.slice(0, eq)] = tok.slice(eq + 1);
  }
  return out;
}
