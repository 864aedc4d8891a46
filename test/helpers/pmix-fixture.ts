// A PmixServer with simple in-test handlers, for exercising the binding with real clients.
import { mkdtempSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  encodeNamespace,
  findValue,
  type Info,
  info,
  isTrue,
  Keys,
  type NamespaceLayout,
  PmixError,
  PmixServer,
  type PmixServerOptions,
  type Proc,
  type PublishedDatum,
  Status,
  singleHostLayout,
  type UpcallHandlers,
  v,
} from '../../src/pmix/index.js';

export interface Recorded {
  connected: Proc[];
  finalized: Proc[];
  aborts: { proc: Proc; status: number; message: string }[];
  groups: { op: string; group: string; procs: Proc[]; contextId?: number }[];
  queries: string[][];
}

export class PmixFixture {
  server!: PmixServer;
  readonly recorded: Recorded = { connected: [], finalized: [], aborts: [], groups: [], queries: [] };
  readonly tmpdir: string;
  psets: Map<string, Proc[]> = new Map();
  private published = new Map<string, PublishedDatum>();
  private lookupWaiters: (() => void)[] = [];
  private nextContextId = 0xffffffff;
  extraHandlers: Partial<UpcallHandlers> = {};

  private constructor() {
    this.tmpdir = mkdtempSync(join(tmpdir(), 'dask-pmix-test-'));
    const self = this;
    const handlers: UpcallHandlers = {
      async clientConnected({ proc }) {
        self.recorded.connected.push(proc);
      },
      async clientFinalized({ proc }) {
        self.recorded.finalized.push(proc);
      },
      async abort({ proc, status, message }) {
        self.recorded.aborts.push({ proc, status, message });
      },
      async fence({ data }) {
        return data;
      },
      async publish({ proc, info: items }) {
        for (const i of items) {
          if (i.key.startsWith('pmix.')) continue;
          self.published.set(i.key, { proc, key: i.key, value: i.value });
        }
        for (const w of self.lookupWaiters.splice(0)) w();
      },
      async lookup({ keys, info: dirs }) {
        const wait = isTrue(dirs, Keys.WAIT);
        const deadline = Date.now() + 10_000;
        for (;;) {
          const found = keys.map((k) => self.published.get(k)).filter((d): d is PublishedDatum => !!d);
          if (found.length === keys.length) return found;
          if (!wait || Date.now() > deadline) throw new PmixError(Status.ERR_NOT_FOUND);
          await new Promise<void>((r) => {
            self.lookupWaiters.push(r);
            setTimeout(r, 500);
          });
        }
      },
      async unpublish({ keys }) {
        for (const k of keys) self.published.delete(k);
      },
      async query({ queries }) {
        if (self.extraHandlers.query) return self.extraHandlers.query({ proc: null, queries });
        const out: Info[] = [];
        for (const q of queries) {
          self.recorded.queries.push(q.keys);
          for (const k of q.keys) {
            if (k === Keys.QUERY_NUM_PSETS) out.push(info(k, v.size(self.psets.size)));
            else if (k === Keys.QUERY_PSET_NAMES) out.push(info(k, v.string([...self.psets.keys()].join(','))));
          }
        }
        return out;
      },
      // Without a job_control upcall libpmix leaves each rank's shared-memory segment behind.
      async jobControl() {
        throw new PmixError(Status.ERR_NOT_SUPPORTED);
      },
      async group({ op, group, procs, directives }) {
        const rec: Recorded['groups'][number] = { op, group, procs };
        self.recorded.groups.push(rec);
        if (op !== 'construct') return [];
        const out: Info[] = [];
        if (isTrue(directives, Keys.GROUP_ASSIGN_CONTEXT_ID)) {
          rec.contextId = self.nextContextId--;
          out.push(info(Keys.GROUP_CONTEXT_ID, v.size(rec.contextId)));
        }
        const endpt = findValue(directives, Keys.GROUP_ENDPT_DATA);
        if (endpt) out.push(info(Keys.GROUP_ENDPT_DATA, endpt));
        out.push(info(Keys.GROUP_MEMBERSHIP, v.procs(procs)));
        return out;
      },
    };
    this.handlers = handlers;
  }

  private readonly handlers: UpcallHandlers;

  /** A fixture with its server started; `options` adds to or replaces the server's options. */
  static async start(options: Partial<Omit<PmixServerOptions, 'handlers'>> = {}): Promise<PmixFixture> {
    const fx = new PmixFixture();
    fx.server = await PmixServer.start({ tmpdir: fx.tmpdir, handlers: fx.handlers, ...options });
    return fx;
  }

  /** Registers a single-host namespace and its clients; returns each rank's environment. */
  async job(
    nspace: string,
    size: number,
    customize?: (layout: NamespaceLayout) => void,
  ): Promise<Record<string, string>[]> {
    const layout = singleHostLayout(nspace, size, hostname(), join(this.tmpdir, nspace));
    customize?.(layout);
    await this.server.registerNspace(nspace, size, encodeNamespace(layout, this.server));
    const envs: Record<string, string>[] = [];
    for (let rank = 0; rank < size; rank++) {
      await this.server.registerClient({ nspace, rank }, process.getuid!(), process.getgid!());
      envs.push(this.server.setupFork({ nspace, rank }));
    }
    return envs;
  }

  async stop(): Promise<void> {
    await this.server.stop();
  }
}
