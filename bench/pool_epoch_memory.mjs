// What the embedded libpmix keeps after a pool epoch whose clients connected is torn down: the
// sidecar's PMIx side alone, with no Dask and no REST (issue 31: the soak's Open MPI sidecar grew
// about 1 MB per client.restart(), and each restart is a new epoch). Each cycle opens an epoch of
// --size ranks through the sidecar's own PmixPool (every rank on its own virtual node, every client
// registered up front), starts --clients clients as its ranks 0.. and lets them end as --mode says.
// With --jobs N, the clients first build N communicators over themselves: with --build construct
// (the default) each is an in-process job's PMIx group construct and destruct; with --build derive
// each is derived from one communicator built once per epoch, as the communicator cache does
// (MPI_Comm_dup, or MPI_Comm_create_group in another rank order). Then it waits until libpmix has
// seen every connection go and closes the epoch as the sidecar does (every client deregistered,
// then the namespace). After each cycle: this process's anonymous RSS minus V8's heap ("native").
// Prints one JSON document with the least-squares slope per cycle.
//
// What it showed: with --cohort and 3 or more session clients, libpmix 5.0.11 keeps about 0.45 MB
// per epoch of 1,024 ranks (0.14 MB at 256; 0.02 MB with 2 clients, and nothing without --cohort):
// the namespace's packed job info, pinned by two references that pmix_server_get.c's
// create_local_tracker takes when a second local rank asks for a peer's data before the peer has
// published it (Open MPI's ranks ask for each local peer's pml key as they start), never dropped.
// Nothing the server can do from outside avoids it: a member that has committed waits on the
// lowest local peer that has not, so any two such waiters share a tracker, and Open MPI says
// nothing to the server between its commit and its first get (holding the cohort at its JOB
// CONTROL upcall: 33 duplicate requests in 15 epochs, against 31 without). pml_base_check_pml=0
// moves the wait to btl/tcp's get; fewer PMIX_LOCAL_PEERS costs shared memory; nlocalprocs=1
// stops the growth but breaks group constructs once a member is killed. A server libpmix with the
// two references dropped (as openpmix ccb7c1689 does; 5.0.5 from Debian's openmpi source, the only
// 5.0.x source reachable here) measured 0.016 MB per epoch against 0.498 over cycles 8-24.
//
// Per job (--cohort --clients 4 --size 64 --cycles 6): --jobs 900 --build construct kept 7.1 MB
// per epoch against 0.41 with --jobs 0, about 7.4 KB per job of 4 (heaptrack: the member list
// that pmix_server_grpconstruct and _grpdestruct unpack from each member and never free, besides
// the copy the tracker takes: openpmix frees it only on its main branch); --build derive kept
// 0.44-0.53 MB per epoch, no more than no jobs at all.
//
//   --mode kill              test/.work/bin/pmix_client: PMIx_Init, then SIGKILL
//   --mode finalize          test/.work/bin/pmix_client: PMIx_Init, a query, PMIx_Finalize
//   --mode session           a Dask worker's pool session (dask_pmix.worker.pool), then SIGKILL (default)
//   --mode session-finalize  a Dask worker's pool session, then pool.close()
//   --mode none              no client
//   --mode churn             one epoch; each cycle one more session client joins it alone and is
//                            killed (the slope is per replaced worker, not per epoch)
//
//   npm run -s build:ts && node bench/pool_epoch_memory.mjs --cycles 20 [--mode session] [--out FILE]
//
// Under heaptrack (what libpmix allocates and never frees, by call site):
//   LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so DUMP_HEAPTRACK_OUTPUT=/tmp/raw \
//     node bench/pool_epoch_memory.mjs ...   (the clients get a clean environment)
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const { info, Keys, PmixServer, Status, v } = await import(join(ROOT, 'dist/src/pmix/index.js'));
const { DEFAULT_MEMBER_ENV } = await import(join(ROOT, 'dist/src/service/default-env.js'));
const { PmixClients } = await import(join(ROOT, 'dist/src/service/pmix-clients.js'));
const { PmixPool } = await import(join(ROOT, 'dist/src/service/pmix-pool.js'));

const { values: a } = parseArgs({
  options: {
    cycles: { type: 'string', default: '20' },
    size: { type: 'string', default: '1024' },
    clients: { type: 'string', default: '4' },
    mode: { type: 'string', default: 'session' },
    jobs: { type: 'string', default: '0' },
    cohort: { type: 'boolean', default: false },
    build: { type: 'string', default: 'construct' },
    out: { type: 'string' },
  },
});
const CYCLES = Number(a.cycles);
const SIZE = Number(a.size);
const CLIENTS = Number(a.clients);
const MODE = a.mode;
const JOBS = Number(a.jobs);
const BUILD = a.build;
if (!['construct', 'derive'].includes(BUILD)) throw new Error(`no --build ${BUILD}`);
if (!['kill', 'finalize', 'session', 'session-finalize', 'none', 'churn'].includes(MODE))
  throw new Error(`no mode ${MODE}`);

// A pool rank as a Dask worker process is one, then left to be killed or closed.
const SESSION_PY = `
import json, sys, time
from dask_pmix.worker import pool
seat, env, how, jobs, n, build = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
pool.start(seat, env)
p = pool.current(60)
st = dict(pool.status()); st.pop("pool", None)
sums = []
base = None
for j in range(jobs if p is not None else 0):
    if build == "construct":
        # An in-process job's communicator, as a member builds it (dask_pmix.worker.pool.Pool.comm).
        comm = p.comm(range(n), f"probe-{seat['epoch']}-{j}")
    else:
        # As the communicator cache derives one from a kept communicator over all the clients: a
        # Dup, or every other job a create_group of the ranks in reverse order.
        base = base or p.comm(range(n), f"probe-{seat['epoch']}-kept")
        order = list(range(n))[::-1]
        comm = base.Create_group(base.group.Incl(order)) if j % 2 else base.Dup()
        want = order.index(base.rank) if j % 2 else base.rank
        if comm.rank != want:
            sys.exit(f"rank {comm.rank}, not {want}")
    sums.append(comm.allreduce(1))
    comm.Free()
print(json.dumps({"init": p is not None, "sums": sums, **st}), flush=True)
if how == "finalize":
    pool.close()
    sys.exit(0)
time.sleep(600)
`;

function nativeKb() {
  const anon = Number(/RssAnon:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]);
  return anon - process.memoryUsage().heapTotal / 1024;
}

/** A client process with only the basics and what the pool handed out in its environment. */
function start(cmd, args, extra) {
  const env = { PATH: process.env.PATH, HOME: process.env.HOME ?? '/root', OMPI_MCA_mpi_yield_when_idle: '1', ...extra };
  const child = spawn('/usr/bin/setpriv', ['--pdeathsig', 'KILL', '--', cmd, ...args], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  const line = new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`no line from ${cmd} within 60 s: ${err.slice(-2000)}`)), 60_000);
    child.stdout.setEncoding('utf8').on('data', (c) => {
      out += c;
      for (const l of out.split('\n')) {
        if (l.startsWith('{') && l.includes('"init"')) {
          clearTimeout(t);
          resolve(JSON.parse(l));
        }
      }
    });
  });
  child.stderr.setEncoding('utf8').on('data', (c) => {
    err += c;
  });
  const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve(code ?? sig)));
  return { child, line, exited, stderr: () => err };
}

const dir = mkdtempSync(join(tmpdir(), 'dask-pmix-epoch-memory-'));
const clients = new PmixClients(1000);
let nextContextId = 1;
const server = await PmixServer.start({
  tmpdir: join(dir, 'pmix'),
  handlers: {
    async clientConnected({ proc }) {
      clients.connected(proc.nspace, proc.rank);
    },
    async clientFinalized({ proc }) {
      clients.finalized(proc.nspace, proc.rank);
    },
    async localEvent({ status, source, info }) {
      if (status !== Status.ERR_LOST_CONNECTION && status !== Status.ERR_UNREACH) return;
      const procs = source ? [source] : [];
      for (const i of info) if (i.key === Keys.PROCID && i.value.type === 'proc') procs.push(i.value.value);
      for (const p of procs) clients.lost(p.nspace, p.rank);
    },
    // As the sidecar answers them (src/service/pmix-handlers.ts).
    async jobControl() {
      return [];
    },
    async registerEvents() {},
    async deregisterEvents() {},
    // As the sidecar answers a pool group's construct (src/service/pmix-handlers.ts): a context
    // id and the membership, no endpoint data (every member is this server's client).
    async group({ op, procs }) {
      if (op !== 'construct') return [];
      return [info(Keys.GROUP_CONTEXT_ID, v.size(nextContextId++)), info(Keys.GROUP_MEMBERSHIP, v.procs(procs))];
    },
  },
});
const pool = new PmixPool({ server, clients, tmpdir: join(dir, 'pmix'), ompiEnv: { ...DEFAULT_MEMBER_ENV.openmpi } });
const samples = [];
const load0 = loadavg();
const t0 = performance.now();
try {
  if (MODE === 'churn') {
    // One epoch for good; each cycle one more rank joins it (a worker restarted by its nanny, alone
    // on its node) and is killed, as the soak's faults replace workers. The sidecar never
    // deregisters a dead pool rank before its epoch closes.
    const ns = 'dask-pmix.probe.churn';
    await pool.open({ epoch: 0, namespace: ns, size: SIZE, cohorts: [], users: new Map() });
    for (let c = 0; c <= CYCLES; c++) {
      const seat = JSON.stringify({ namespace: ns, rank: c, epoch: 0, impl: 'openmpi' });
      const env = pool.rankEnv(ns, c);
      const r = start(join(ROOT, '.venv', 'bin', 'python'), ['-c', SESSION_PY, seat, JSON.stringify(env), 'hang', '0', '1', BUILD], {});
      const l = await r.line;
      if (l.init !== true) throw new Error(`rank ${c} did not start: ${JSON.stringify(l)}: ${r.stderr().slice(-2000)}`);
      r.child.kill('SIGKILL');
      await r.exited;
      if (!(await clients.drained(ns, 15_000))) throw new Error(`libpmix still counts clients of ${ns}`);
      const s = { cycle: c, seconds: Math.round((performance.now() - t0) / 100) / 10, nativeMb: Math.round(nativeKb() / 102.4) / 10 };
      samples.push(s);
      console.error(JSON.stringify(s));
    }
    await pool.close(ns);
  }
  for (let c = 0; MODE !== 'churn' && c <= CYCLES; c++) {
    const ns = `dask-pmix.probe.${c}`;
    // --cohort: the clients share one node, as the workers of a host that start together do.
    const cohorts = a.cohort ? [{ host: hostname(), ranks: Array.from({ length: CLIENTS }, (_, r) => r) }] : [];
    await pool.open({ epoch: c, namespace: ns, size: SIZE, cohorts, users: new Map() });
    if (MODE !== 'none') {
      const ranks = Array.from({ length: CLIENTS }, (_, rank) => {
        const env = pool.rankEnv(ns, rank);
        if (MODE.startsWith('session')) {
          const seat = JSON.stringify({ namespace: ns, rank, epoch: c, impl: 'openmpi' });
          const how = MODE === 'session' ? 'hang' : 'finalize';
          const args = ['-c', SESSION_PY, seat, JSON.stringify(env), how, String(JOBS), String(CLIENTS), BUILD];
          return start(join(ROOT, '.venv', 'bin', 'python'), args, {});
        }
        return start(join(ROOT, 'test', '.work', 'bin', 'pmix_client'), [MODE === 'kill' ? 'hang' : 'query-psets'], env);
      });
      const lines = await Promise.all(ranks.map((r) => r.line));
      const ok = (l) => l.init === true && (l.sums ?? []).every((x) => x === CLIENTS);
      if (!lines.every(ok)) throw new Error(`a client did not start: ${JSON.stringify(lines)}`);
      if (MODE === 'kill' || MODE === 'session') for (const r of ranks) r.child.kill('SIGKILL');
      await Promise.all(ranks.map((r) => r.exited));
      if (!(await clients.drained(ns, 15_000))) throw new Error(`libpmix still counts clients of ${ns}`);
    }
    await pool.close(ns);
    const s = { cycle: c, seconds: Math.round((performance.now() - t0) / 100) / 10, nativeMb: Math.round(nativeKb() / 102.4) / 10 };
    samples.push(s);
    console.error(JSON.stringify(s));
  }
} finally {
  await server.stop();
  rmSync(dir, { recursive: true, force: true });
}
// The first epoch is the warm-up (libpmix's and Open MPI's first-time allocations).
const xs = samples.slice(1);
const mx = xs.reduce((s, p) => s + p.cycle, 0) / xs.length;
const my = xs.reduce((s, p) => s + p.nativeMb, 0) / xs.length;
const slope = xs.reduce((s, p) => s + (p.cycle - mx) * (p.nativeMb - my), 0) / xs.reduce((s, p) => s + (p.cycle - mx) ** 2, 0);
const doc = {
  mode: MODE,
  size: SIZE,
  clients: CLIENTS,
  cycles: CYCLES,
  jobs_per_epoch: JOBS,
  build: BUILD,
  cohort: a.cohort,
  load_avg: { start: load0.map((x) => Math.round(x * 10) / 10), end: loadavg().map((x) => Math.round(x * 10) / 10) },
  native_mb_per_epoch: Math.round(slope * 1000) / 1000,
  samples,
};
const text = JSON.stringify(doc, null, 1);
if (a.out) writeFileSync(a.out, `${text}\n`);
console.log(text);
