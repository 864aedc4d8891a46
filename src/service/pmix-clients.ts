// Which PMIx clients still hold a connection to libpmix, so that a namespace is torn down only
// once none does.
//
// libpmix 5.0.x deregistering a client whose socket is still open closes the socket but leaves
// its libevent events registered on the freed peer (remove_client in pmix_server.c): the fd is
// reused by the next connection and the server can wedge. A client that finalized closes its
// socket right after libpmix answers the finalize, which is after our clientFinalized handler
// ran; a client that was lost has had its socket closed by libpmix already. So: a lost client
// is gone at once, a finalized one after a short linger, and a namespace whose members are
// still connected (a deleted or failed job whose ranks linger) waits for them, for a bounded time
// (see PmixBackend.release for what happens then).

export class PmixClients {
  private readonly attached = new Map<string, Set<number>>();
  private readonly waiters = new Map<string, (() => void)[]>();

  constructor(private readonly lingerMs = 1000) {}

  connected(nspace: string, rank: number): void {
    let s = this.attached.get(nspace);
    if (!s) this.attached.set(nspace, (s = new Set()));
    s.add(rank);
  }

  /** The client finalized: its socket closes once libpmix has answered. */
  finalized(nspace: string, rank: number): void {
    const t = setTimeout(() => this.gone(nspace, rank), this.lingerMs);
    t.unref();
  }

  /** libpmix saw the client's connection drop. */
  lost(nspace: string, rank: number): void {
    this.gone(nspace, rank);
  }

  private gone(nspace: string, rank: number): void {
    const s = this.attached.get(nspace);
    if (!s) return;
    s.delete(rank);
    if (s.size > 0) return;
    this.attached.delete(nspace);
    for (const w of this.waiters.get(nspace) ?? []) w();
    this.waiters.delete(nspace);
  }

  /** How many of the namespace's clients still hold a connection. */
  count(nspace: string): number {
    return this.attached.get(nspace)?.size ?? 0;
  }

  /** Resolves true once no client of `nspace` is connected, or false after `timeoutMs`. */
  drained(nspace: string, timeoutMs: number): Promise<boolean> {
    if (this.count(nspace) === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const list = this.waiters.get(nspace) ?? [];
      const done = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        const l = this.waiters.get(nspace);
        const i = l?.indexOf(done) ?? -1;
        if (i >= 0) l!.splice(i, 1);
        if (l?.length === 0) this.waiters.delete(nspace);
        resolve(false);
      }, timeoutMs);
      timer.unref();
      list.push(done);
      this.waiters.set(nspace, list);
    });
  }

  /** Stops counting the namespace's clients (its teardown goes ahead without them). */
  forget(nspace: string): void {
    this.attached.delete(nspace);
  }

  /** For diagnostics: attached clients by namespace. */
  snapshot(): Record<string, number[]> {
    return Object.fromEntries([...this.attached.entries()].map(([ns, s]) => [ns, [...s].sort((a, b) => a - b)]));
  }
}
