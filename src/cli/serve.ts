// `dask-pmix serve`: runs the sidecar until SIGTERM or SIGINT, then refuses new jobs, aborts the
// running ones with notice to their members, finalizes PMIx and exits 0.
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { isIP } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { projectVersion } from './version.js';

const HELP = `usage: dask-pmix serve [options]

  --host HOST              REST bind address              [DASK_PMIX_HOST, default 127.0.0.1]
  --port PORT              REST port (0: any free one)    [DASK_PMIX_PORT, default 8790]
  --token-file FILE        the bearer token every route but health, metrics and docs needs
                           (its first line)               [DASK_PMIX_TOKEN_FILE]
                           DASK_PMIX_TOKEN in the environment gives it directly. Without
                           either, a token is generated and written to STATE_DIR/token (or the
                           PMIx tmpdir) with mode 0600.
  --token TOKEN            the same, on the command line (visible in ps: prefer the file)
  --no-auth                no token at all: anyone who reaches the port may register workers,
                           create jobs and read member environments
  --open-reads             reads of workers, psets, jobs and events need no token
  --state-dir DIR          where process sets and job history persist (SQLite), and where a
                           restarted sidecar finds what its predecessor left; its files are 0600,
                           a directory others can read or write is warned about  [DASK_PMIX_STATE_DIR]
  --pmix-tmpdir DIR        libpmix rendezvous directory   [DASK_PMIX_TMPDIR, default a new temp dir]
  --log-level LEVEL        trace|debug|info|warn|error|silent  [DASK_PMIX_LOG_LEVEL, default info]
  --wiring-timeout SECS    default time for all members to connect  [default 60]
  --max-jobs N             active jobs at once            [default 64]
  --max-workers N          registered workers             [default 4096]
  --max-psets N            defined process sets           [default 1024]
  --max-names N            name-service entries (published names)  [default 4096]
  --job-history N          ended jobs kept for GET /v1/jobs and the state directory  [default 1000]
  --release-grace SECS     how long members of a failed job may linger before it is released [10]
  --pool-size N            ranks per epoch of the in-process pool (Open MPI; 0: no pool)
                                                          [DASK_PMIX_POOL_SIZE, default 1024]
  --pool-cohort SECS       workers of one host that join the pool together share memory (a cohort):
                           the first pool epoch is registered once no worker registered or asked
                           to join for SECS (0: no cohorts)  [DASK_PMIX_POOL_COHORT, default 0.5]
  --pool-cohort-max SECS   ... at the latest SECS after the first worker asked  [default 10]
  --max-spawn-procs N      processes one MPI_Comm_spawn of an Open MPI rank may start (on this
                           host, as the rank's user)  [DASK_PMIX_MAX_SPAWN_PROCS, default 64]
  --max-spawn-procs-per-job N  spawned processes of one job alive at once  [default 64]
  --remote                 accept PMIx clients on other hosts over TCP
  --pmix-if IFACE          interface, subnet or address for remote PMIx clients (implies --remote)
  --pmix-port PORT         fixed TCP port for PMIx clients
  --pmix-tools POLICY      same-uid (PMIx tools of this uid may connect) or refuse  [same-uid]
  --pmi-host ADDR          PMI-1/PMI-2 listener address (MPICH, Intel MPI)  [default 127.0.0.1]
  --pmi-port PORT          its port                       [default: any free one]
  --pmi-advertise HOST     host name members use in PMI_PORT  [default: the bound address]
  --no-pmi                 serve Open MPI (PMIx) only
  --parent-pid PID         stop when that process is gone (the embedded sidecar: its scheduler)
  --exit-with-parent       the same for the process that started this one
  --ready-fd FD            write the listening line to FD, then close it (a parent waits on it)
  --ompi-env K=V           an Open MPI setting for every member (repeatable; replaces the defaults
                           OMPI_MCA_btl=^ofi OMPI_MCA_pml=ob1 OMPI_MCA_mpi_yield_when_idle=1
                           OMPI_MCA_osc=^ucx)
  -h, --help
`;

function num(name: string, v: string | undefined, dflt?: number): number | undefined {
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${name} must be a non-negative number, not '${v}'`);
  return n;
}

/**
 * What libpmix's listener understands for an interface choice. An address is turned into the
 * name of the interface that holds it: libpmix matches names and subnets, and silently listens
 * elsewhere for anything it does not match (a /32 included), which remote ranks cannot reach.
 */
export function interfaceFor(choice: string): string {
  if (!isIP(choice)) return choice;
  for (const [name, addrs] of Object.entries(networkInterfaces())) {
    if (addrs?.some((a) => a.address === choice)) return name;
  }
  throw new Error(`--pmix-if ${choice}: no interface of this host has that address`);
}

/**
 * The token: given on the command line, in a file, or in the environment; otherwise generated
 * and written to `dir`/token (mode 0600), where the operator (and nobody else) can read it.
 */
function resolveToken(
  arg: string | undefined,
  file: string | undefined,
  fromEnv: string | undefined,
  dir: string,
  log: pino.Logger,
): string {
  if (arg) return arg;
  if (file) {
    const t = readFileSync(file, 'utf8').split('\n')[0]!.trim();
    if (!t) throw new Error(`--token-file ${file} is empty`);
    return t;
  }
  if (fromEnv) return fromEnv;
  const t = randomBytes(32).toString('base64url');
  const path = join(dir, 'token');
  writeFileSync(path, `${t}\n`, { mode: 0o600 });
  log.info({ tokenFile: path }, 'generated a bearer token');
  return t;
}

// Read when the module loads, before a slow start-up could let the parent exit unnoticed.
const STARTED_BY = process.ppid;

export async function serve(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      host: { type: 'string' },
      port: { type: 'string' },
      token: { type: 'string' },
      'token-file': { type: 'string' },
      'no-auth': { type: 'boolean' },
      'open-reads': { type: 'boolean' },
      'state-dir': { type: 'string' },
      'pmix-tmpdir': { type: 'string' },
      'log-level': { type: 'string' },
      'wiring-timeout': { type: 'string' },
      'max-jobs': { type: 'string' },
      'max-workers': { type: 'string' },
      'max-psets': { type: 'string' },
      'max-names': { type: 'string' },
      'job-history': { type: 'string' },
      'release-grace': { type: 'string' },
      'pool-size': { type: 'string' },
      'pool-cohort': { type: 'string' },
      'pool-cohort-max': { type: 'string' },
      'max-spawn-procs': { type: 'string' },
      'max-spawn-procs-per-job': { type: 'string' },
      remote: { type: 'boolean' },
      'pmix-if': { type: 'string' },
      'pmix-port': { type: 'string' },
      'pmix-tools': { type: 'string' },
      'ompi-env': { type: 'string', multiple: true },
      'pmi-host': { type: 'string' },
      'pmi-port': { type: 'string' },
      'pmi-advertise': { type: 'string' },
      'no-pmi': { type: 'boolean' },
      'exit-with-parent': { type: 'boolean' },
      'parent-pid': { type: 'string' },
      'ready-fd': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(HELP);
    return 0;
  }
  const env = process.env;
  // Synchronous, so that nothing logged is lost when a wedged libpmix forces an immediate exit.
  const log = pino(
    { level: values['log-level'] ?? env.DASK_PMIX_LOG_LEVEL ?? 'info', base: { svc: 'dask-pmix' } },
    pino.destination({ dest: 1, sync: true }),
  );
  let ompiEnv: Record<string, string> | undefined;
  if (values['ompi-env']) {
    ompiEnv = {};
    for (const kv of values['ompi-env']) {
      const i = kv.indexOf('=');
      if (i < 1) throw new Error(`--ompi-env wants KEY=VALUE, not '${kv}'`);
      ompiEnv[kv.slice(0, i)] = kv.slice(i + 1);
    }
  }
  const pmixPort = num('pmix-port', values['pmix-port']);
  const tools = values['pmix-tools'];
  if (tools !== undefined && tools !== 'same-uid' && tools !== 'refuse')
    throw new Error(`--pmix-tools must be same-uid or refuse, not '${tools}'`);
  const wiring = num('wiring-timeout', values['wiring-timeout']);
  const maxJobs = num('max-jobs', values['max-jobs']);
  const history = num('job-history', values['job-history']);
  if (history !== undefined && !(Number.isInteger(history) && history >= 0))
    throw new Error(`--job-history must be a whole number, 0 or more, not '${values['job-history']}'`);
  const grace = num('release-grace', values['release-grace']);
  const poolSize = num('pool-size', values['pool-size'] ?? env.DASK_PMIX_POOL_SIZE, 1024)!;
  if (!Number.isInteger(poolSize)) throw new Error(`--pool-size must be a whole number, not '${poolSize}'`);
  const cohort = num('pool-cohort', values['pool-cohort'] ?? env.DASK_PMIX_POOL_COHORT, 0.5)!;
  const cohortMax = num('pool-cohort-max', values['pool-cohort-max'], 10)!;
  const spawnMax = num('max-spawn-procs', values['max-spawn-procs'] ?? env.DASK_PMIX_MAX_SPAWN_PROCS);
  const spawnPerJob = num('max-spawn-procs-per-job', values['max-spawn-procs-per-job']);
  for (const [flag, n] of [
    ['max-spawn-procs', spawnMax],
    ['max-spawn-procs-per-job', spawnPerJob],
  ] as const) {
    if (n !== undefined && !Number.isInteger(n)) throw new Error(`--${flag} must be a whole number, not '${n}'`);
  }
  const stateDir = values['state-dir'] ?? env.DASK_PMIX_STATE_DIR;
  if (stateDir) mkdirSync(stateDir, { recursive: true, mode: 0o700 });

  const given = values['pmix-tmpdir'] ?? env.DASK_PMIX_TMPDIR;
  const pmixTmpdir = given ?? mkdtempSync(join(tmpdir(), 'dask-pmix-'));
  const token = values['no-auth']
    ? undefined
    : resolveToken(
        values.token,
        values['token-file'] ?? env.DASK_PMIX_TOKEN_FILE,
        env.DASK_PMIX_TOKEN,
        stateDir ?? pmixTmpdir,
        log,
      );
  // A directory we made is ours to remove; one we were given is not.
  const cleanup = () => {
    if (!given) rmSync(pmixTmpdir, { recursive: true, force: true });
  };
  const { Sidecar } = await import('../service/sidecar.js');
  let sidecar: Awaited<ReturnType<typeof Sidecar.start>>;
  try {
    sidecar = await Sidecar.start({
      host: values.host ?? env.DASK_PMIX_HOST ?? '127.0.0.1',
      port: num('port', values.port ?? env.DASK_PMIX_PORT, 8790)!,
      tmpdir: pmixTmpdir,
      logger: log,
      version: projectVersion(),
      ...(token ? { token } : {}),
      limits: Object.fromEntries(
        (
          [
            ['workers', 'max-workers'],
            ['psets', 'max-psets'],
            ['names', 'max-names'],
          ] as const
        )
          .filter(([, flag]) => values[flag] !== undefined)
          .map(([k, flag]) => [k, num(flag, values[flag])!]),
      ),
      ...(values['open-reads'] ? { openReads: true } : {}),
      ...(stateDir ? { stateDir } : {}),
      ...(wiring !== undefined ? { wiringTimeoutSeconds: wiring } : {}),
      ...(maxJobs !== undefined ? { maxActiveJobs: maxJobs } : {}),
      ...(history !== undefined ? { jobHistory: history } : {}),
      ...(grace !== undefined ? { releaseGraceMs: grace * 1000 } : {}),
      ...(values.remote || values['pmix-if'] ? { remoteConnections: true } : {}),
      ...(values['pmix-if'] ? { tcpIfInclude: interfaceFor(values['pmix-if']) } : {}),
      ...(pmixPort !== undefined ? { tcpPort: pmixPort } : {}),
      ...(tools ? { pmixTools: tools } : {}),
      ...(ompiEnv ? { ompiEnv } : {}),
      poolSize,
      spawnLimits: {
        ...(spawnMax !== undefined ? { maxProcsPerSpawn: spawnMax } : {}),
        ...(spawnPerJob !== undefined ? { maxProcsPerJob: spawnPerJob } : {}),
      },
      poolCohort: { settleMs: cohort * 1000, maxWaitMs: Math.max(cohort, cohortMax) * 1000 },
      pmi: values['no-pmi']
        ? false
        : {
            ...(values['pmi-host'] ? { host: values['pmi-host'] } : {}),
            ...(values['pmi-port'] ? { port: num('pmi-port', values['pmi-port'])! } : {}),
            ...(values['pmi-advertise'] ? { advertisedHost: values['pmi-advertise'] } : {}),
          },
    });
  } catch (err) {
    cleanup();
    throw err;
  }
  // One line on stdout that a parent process can wait for, or on the descriptor it gave (its end of
  // file then tells it that start-up is over).
  const ready = `dask-pmix listening on ${sidecar.url}\n`;
  if (values['ready-fd'] !== undefined) {
    const fd = num('ready-fd', values['ready-fd'])!;
    try {
      writeSync(fd, ready);
    } finally {
      closeSync(fd);
    }
  } else {
    process.stdout.write(ready);
  }

  return new Promise<number>((resolve) => {
    let orphanWatch: NodeJS.Timeout | undefined;
    const stop = (signal: NodeJS.Signals | 'its parent exited') => {
      process.off('SIGTERM', stop);
      process.off('SIGINT', stop);
      if (orphanWatch) clearInterval(orphanWatch);
      sidecar
        .stop(
          signal === 'its parent exited'
            ? 'the process that started the sidecar exited'
            : `the sidecar received ${signal}`,
        )
        .then(
          (outcome) => {
            cleanup();
            if (outcome === 'timed-out') {
              // libpmix's progress thread is wedged: its finalize never returns and its threads keep
              // the process alive, so end it here.
              log.error(
                { pmix: sidecar.pmix.progress() },
                'stopping did not finish in time; exiting without finalizing PMIx',
              );
              sidecar.exitNow(1);
            }
            resolve(0);
          },
          (err: unknown) => {
            log.error({ err }, 'stopping failed');
            resolve(1);
          },
        );
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
    // A scheduler killed outright cannot stop its sidecar; the sidecar notices it is gone.
    const parent = values['parent-pid']
      ? num('parent-pid', values['parent-pid'])!
      : values['exit-with-parent']
        ? STARTED_BY
        : 0;
    if (parent > 1) {
      orphanWatch = setInterval(() => {
        try {
          process.kill(parent, 0);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ESRCH') stop('its parent exited');
        }
      }, 500);
    }
  });
}
