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
