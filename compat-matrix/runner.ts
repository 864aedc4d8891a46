// The compatibility matrix runner: starts the sidecar, starts long-lived rank processes the way
// Dask workers are, runs every feature for each MPI library and join mode, and writes
// compat-matrix/results/<row>.json and compat-matrix/MATRIX.md.
//
//   npm run compat                         every row
//   npm run compat -- --impl openmpi-5.0.11 --features world,abort --jobs 5
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { type Agent, startAgents, stopAgents } from './agents.js';
import { buildRow } from './build.js';
import type { Ctx, Feature, Outcome } from './features/common.js';
import { connectAccept } from './features/connect-accept.js';
import { abortFeature, memberDeath } from './features/failure.js';
import { inprocessFailure, inprocessRepeat, inprocessWorld, joinPool } from './features/inprocess.js';
import { psetGroup } from './features/pset-group.js';
import { psetNames } from './features/pset-names.js';
import { publishLookup } from './features/publish-lookup.js';
import { repeat } from './features/repeat.js';
import { sessionWorld } from './features/session-world.js';
import { spawnFeature } from './features/spawn.js';
import { world } from './features/world.js';
import { COLUMNS, type RowResult, writeMatrix, writeResult } from './report.js';
import { type RepeatMode, type Row, rows } from './rows.js';
import { Sidecar } from './sidecar.js';

const FEATURES: Feature[] = [
  world,
  sessionWorld,
  psetNames,
  psetGroup,
  publishLookup,
  connectAccept,
  spawnFeature,
  abortFeature,
  memberDeath,
];

/** Columns that do not apply to the in-process join mode, and why. */
const NOT_INPROCESS: Record<string, string> = {
  'session-world':
    "does not apply in-process: a pool member's mpi://WORLD is the whole pool (every epoch rank), not its job",
  'pset-names':
    'does not apply in-process: custom psets are per namespace in Open MPI 5.0.x, and a job is a group of the pool namespace',
  'pset-group':
    'does not apply in-process: custom psets are per namespace in Open MPI 5.0.x, and a job is a group of the pool namespace',
  spawn: 'refused on purpose in every mode',
  'publish-lookup': 'not measured in-process (the agent has no command for it in this mode)',
  'connect-accept': 'not measured in-process (the agent has no command for it in this mode)',
};

/** The same for rows whose in-process members are worlds of their own (MPICH / Intel MPI). */
const NOT_INPROCESS_WORLDS: Record<string, string> = {
  'session-world':
    "does not apply in-process: a member's mpi://WORLD is its own world of size 1; the job is a merge tree of them",
  'pset-names': 'does not apply in-process: a job is a merge tree of worlds of one, which no process set spans',
  'pset-group': 'does not apply in-process: a job is a merge tree of worlds of one, which no process set spans',
  spawn: 'refused on purpose in every mode',
  'publish-lookup': 'not measured in-process (the agent has no command for it in this mode)',
  'connect-accept': 'used by every in-process job: its communicator is built by connect/accept (world, repeat)',
};

export interface RunOptions {
  root: string;
  rows?: string[];
  features?: string[];
  /** Jobs per `repeat` run. */
  jobs?: number;
  /** Join modes for `repeat`; defaults to each row's list. 'inprocess' selects the in-process row. */
  modes?: (RepeatMode | 'inprocess')[];
  /** Jobs of the in-process row's `repeat` (default 200). */
  inprocessJobs?: number;
  /** Where results go; MATRIX.md is regenerated next to it unless writeMatrix is false. */
  resultsDir?: string;
  writeMatrix?: boolean;
  log?: (msg: string) => void;
}

async function withAgents<T>(
  sidecar: Sidecar,
  row: Row,
  agentBin: string,
  tag: string,
  f: (agents: Agent[]) => Promise<T>,
): Promise<T> {
  const agents = await startAgents(sidecar, agentBin, 4, row.baseEnv, `${row.id}-${tag}`);
  try {
    return await f(agents);
  } finally {
    await stopAgents(sidecar, agents);
  }
}

async function guard(row: Row, key: string, f: () => Promise<Outcome>): Promise<Outcome> {
  let outcome: Outcome;
  try {
    outcome = await f();
  } catch (err) {
    outcome = { status: 'fail', reason: `the harness failed: ${err instanceof Error ? err.message : String(err)}` };
  }
  const known = row.known?.[key];
  if (known && outcome.status !== 'pass') outcome.reason = `${outcome.reason ? `${outcome.reason} — ` : ''}${known}`;
  // A row that lacks the feature records it unsupported only when the library itself refused
  // (an MPI call answered an error); a crash, a hang or a harness failure stays a failure.
  if (outcome.status === 'fail' && row.lacks?.includes(key) && outcome.mpiError) outcome.status = 'unsupported';
  return outcome;
}

export async function runMatrix(opts: RunOptions): Promise<RowResult[]> {
  const log = opts.log ?? ((m: string) => process.stderr.write(`${m}\n`));
  const resultsDir = opts.resultsDir ?? join(opts.root, 'compat-matrix', 'results');
  const wanted = new Set(opts.features ?? [...COLUMNS]);
  const selected = rows(opts.root).filter(
    (r) => !opts.rows || opts.rows.some((x) => r.id === x || r.id.startsWith(`${x}-`) || r.impl === x),
  );
  const sidecar = await Sidecar.start(opts.root);
  const all: RowResult[] = [];
  try {
    for (const row of selected) {
      const stamp = new Date().toISOString();
      const base: RowResult = {
        impl: row.id,
        label: row.label,
        version: row.version(),
        mode: row.repeatModes[0]!,
        generatedAt: stamp,
        features: {},
      };
      if (row.unavailable) {
        for (const c of COLUMNS.filter((c) => wanted.has(c)))
          base.features[c] = { status: 'unsupported', reason: row.unavailable };
        all.push(base);
        continue;
      }
      const built = await buildRow(opts.root, row);
      const agentBin = built.programs.get('agent');
      if (!agentBin) throw new Error(`${row.id}: the agent does not build: ${built.errors.get('agent')}`);
      const ctxFor = (agents: Agent[]): Ctx => ({
        row,
        sidecar,
        agents,
        program: (name) => built.programs.get(name),
        buildError: (name) => built.errors.get(name) ?? `${name} was not built`,
        log,
      });
      await withAgents(sidecar, row, agentBin, 'features', async (agents) => {
        for (const f of FEATURES.filter((f) => wanted.has(f.name))) {
          log(`${row.id}: ${f.name} ...`);
          const outcome = await guard(row, f.name, () => f.run(ctxFor(agents)));
          base.features[f.name] = outcome;
          log(`${row.id}: ${f.name}: ${outcome.status}${outcome.reason ? ` — ${outcome.reason}` : ''}`);
        }
      });
      const modeResults: RowResult[] = [];
      if (wanted.has('repeat')) {
        const modes = opts.modes ? row.repeatModes.filter((m) => opts.modes!.includes(m)) : row.repeatModes;
        for (const mode of modes) {
          log(`${row.id}: repeat (${mode}) ...`);
          // Fresh processes per mode: a mode may crash them (reinit).
          const outcome = await guard(row, `repeat/${mode}`, () =>
            withAgents(sidecar, row, agentBin, mode, (agents) => repeat(ctxFor(agents), mode, opts.jobs ?? 20)),
          );
          log(`${row.id}: repeat (${mode}): ${outcome.status}${outcome.reason ? ` — ${outcome.reason}` : ''}`);
          if (mode === base.mode) base.features.repeat = outcome;
          else modeResults.push({ ...base, mode, features: { repeat: outcome } });
        }
      }
      const inprocessColumns = ['world', 'abort', 'member-death', 'repeat'].filter((c) => wanted.has(c));
      const notInprocess = Object.entries(row.impl === 'openmpi' ? NOT_INPROCESS : NOT_INPROCESS_WORLDS).filter(([c]) =>
        wanted.has(c),
      );
      if (
        row.inprocess &&
        (inprocessColumns.length || notInprocess.length) &&
        (!opts.modes || opts.modes.includes('inprocess'))
      ) {
        const result: RowResult = { ...base, mode: 'inprocess', features: {} };
        for (const [c, reason] of notInprocess) result.features[c] = { status: 'unsupported', reason };
        // Fresh agents per column: abort and member-death end one of them.
        for (const c of inprocessColumns) {
          log(`${row.id}: ${c} (inprocess) ...`);
          const outcome = await guard(row, `${c}/inprocess`, () =>
            withAgents(sidecar, row, agentBin, `inprocess-${c}`, async (agents) => {
              const ctx = ctxFor(agents);
              const ranks = await joinPool(ctx, agents);
              if (!(ranks instanceof Map)) return ranks;
              return c === 'world'
                ? inprocessWorld(ctx, ranks)
                : c === 'repeat'
                  ? inprocessRepeat(ctx, ranks, opts.inprocessJobs ?? 200)
                  : inprocessFailure(ctx, ranks, c as 'abort' | 'member-death');
            }),
          );
          result.features[c] = outcome;
          log(`${row.id}: ${c} (inprocess): ${outcome.status}${outcome.reason ? ` — ${outcome.reason}` : ''}`);
        }
        modeResults.push(result);
      }
      // A base row with no cells run (e.g. only another join mode was asked for) is not rewritten.
      for (const r of [...(Object.keys(base.features).length ? [base] : []), ...modeResults]) {
        writeResult(resultsDir, r.mode === base.mode ? row.id : `${row.id}-${r.mode}`, r);
        all.push(r);
      }
    }
  } finally {
    await sidecar.stop();
  }
  if (opts.writeMatrix !== false) writeMatrix(resultsDir, join(resultsDir, '..', 'MATRIX.md'));
  return all;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      impl: { type: 'string', multiple: true },
      features: { type: 'string' },
      jobs: { type: 'string' },
      modes: { type: 'string' },
    },
  });
  const root = join(fileURLToPath(new URL('.', import.meta.url)), '..', '..');
  const results = await runMatrix({
    root,
    rows: values.impl,
    features: values.features?.split(','),
    jobs: values.jobs ? Number(values.jobs) : undefined,
    modes: values.modes?.split(',') as (RepeatMode | 'inprocess')[] | undefined,
  });
  const known = new Map(rows(root).map((r) => [r.id, r.known ?? {}]));
  const failed = results.flatMap((r) =>
    Object.entries(r.features)
      .filter(([, o]) => o.status === 'fail')
      .map(([c]) => ({
        cell: `${r.impl}/${r.mode}/${c}`,
        explained: !!known.get(r.impl)?.[c === 'repeat' || r.mode === 'inprocess' ? `${c}/${r.mode}` : c],
      })),
  );
  // A failure the row's notes explain (an upstream bug) is expected; any other one fails the run.
  const unexpected = failed.filter((f) => !f.explained).map((f) => f.cell);
  process.stdout.write(
    `${JSON.stringify({ rows: results.length, failed: failed.map((f) => f.cell), unexpected }, null, 2)}\n`,
  );
  // Idle keep-alive sockets and spent timers must not keep the command alive.
  process.exit(unexpected.length ? 1 : 0);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().catch((err: unknown) => {
    process.stderr.write(`compat: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exitCode = 1;
  });
}
