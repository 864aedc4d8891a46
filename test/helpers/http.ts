import { connect } from 'node:net';

// A small REST client for the tests: real HTTP to a listening sidecar.
export interface Reply<T = any> {
  status: number;
  body: T;
  headers: Headers;
}

export function restClient(base: string, token?: string) {
  return async function call<T = any>(
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<Reply<T>> {
    const h: Record<string, string> = { ...headers };
    if (token) h.authorization ??= `Bearer ${token}`;
    if (body !== undefined) h['content-type'] ??= 'application/json';
    const res = await fetch(base + path, {
      method,
      headers: h,
      ...(body !== undefined ? { body: typeof body === 'string' ? body : JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      /* not JSON */
    }
    return { status: res.status, body: parsed as T, headers: res.headers };
  };
}

/** How long `dask-pmix serve` may take to print its listening line: about 3 s on an idle machine,
 * past 20 s on a 2-core CI machine at load 30-40 (the suite's own MPI ranks and clusters). */
export const SERVE_START_MS = 45_000;

/** Polls `f` until it returns a truthy value. */
export async function until<T>(
  f: () => Promise<T | undefined | false> | T | undefined | false,
  ms = 15_000,
  what = 'a condition',
): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * The status the server answers to a request head alone: for a body it refuses by its declared
 * length. Sending the body too races the refusal: the server answers and closes while the client
 * still writes, and fetch then fails with EPIPE instead of returning the answer.
 */
export function statusOfHead(base: string, method: string, path: string, headers: Record<string, string>) {
  const url = new URL(base);
  const head = [
    `${method} ${path} HTTP/1.1`,
    `host: ${url.host}`,
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
  ];
  return new Promise<number>((resolve, reject) => {
    const socket = connect(Number(url.port), url.hostname, () => socket.write(`${head.join('\r\n')}\r\n\r\n`));
    let got = '';
    socket.setEncoding('latin1');
    socket.setTimeout(15_000, () => socket.destroy(new Error('no answer within 15 s')));
    socket.on('data', (chunk: string) => {
      got += chunk;
      const line = /^HTTP\/1\.[01] (\d{3})/.exec(got);
      if (line) {
        socket.destroy();
        resolve(Number(line[1]));
      }
    });
    socket.on('error', reject);
    socket.on('close', () => reject(new Error(`closed without an answer: ${JSON.stringify(got.slice(0, 200))}`)));
  });
}
