// The PMI-2 command set (MPICH src/pmi/maint/pmi-2.0.txt) for one connection.
//
// Replies are `<cmd>-response` with rc, echoing thrid. Commands of one connection may be in
// flight together (a threaded client matches replies by thrid), so a waiting kvs-fence or
// info-getnodeattr does not hold up the others.
import {
  type ConnectionState,
  checkKey,
  checkKvsname,
  checkService,
  checkValue,
  parseIntArg,
} from './connection-state.js';
import { PmiError } from './errors.js';
import type { PmiMember, SpawnApp, SpawnRequest } from './job-core.js';
import { clip } from './pmi1-codec.js';
import type { Reply } from './pmi1-session.js';
import { formatPmi2, formatPmi2Error, type Pmi2Command, type Pmi2Value } from './pmi2-codec.js';

type Fields = Record<string, Pmi2Value>;
type Handler = (s: ConnectionState, c: Pmi2Command) => Promise<Fields | null> | Fields | null;

export class Pmi2Session {
  constructor(readonly state: ConnectionState) {}

  async handle(c: Pmi2Command): Promise<Reply | null> {
    this.state.version ??= 2;
    const response = `${c.cmd}-response`;
    const handler = HANDLERS[c.cmd];
    try {
      if (!handler) throw new PmiError(`unknown PMI-2 command ${clip(c.cmd)}`);
      const fields = await handler(this.state, c);
      return fields ? { text: formatPmi2(response, { rc: 0, ...fields }, c.thrid, this.state.pmi2Escapes) } : null;
    } catch (e) {
      // A refused credential costs the connection: no guessing on one socket.
      return {
        text: formatPmi2Error(response, this.state.replyError(`PMI-2 ${c.cmd}`, e), c.thrid),
        close: this.state.phase === 'refused',
      };
    }
  }
}

const bool = (s: string | undefined) => s === 'TRUE' || s === 'true' || s === '1';

/** `found=TRUE;value=..` or `found=FALSE`. */
function lookupFields(v: string | undefined): Fields {
  return v === undefined ? { found: false } : { found: true, value: v };
}

const HANDLERS: Readonly<Record<string, Handler>> = {
  fullinit(s, c) {
    // MPICH >= 4.1 sends PMI_ID as pmirank; Slurm's libpmi2 (and clients derived from it) as
    // srcid, falling back to pmirank=PMI_RANK.
    const id = c.args.get('srcid') ?? c.args.get('pmirank');
    let m: PmiMember;
    if (s.phase === 'bound' && s.boundBy === 'initack') {
      // Handed to the client as PMI_FD after the credential's initack: it names itself by its
      // rank (PMI_RANK), or by nothing (-1) if it had no PMI_ID or PMI_RANK.
      m = s.member!;
      if (id !== undefined && id !== '-1' && id !== String(m.info.rank)) {
        throw new PmiError(`fullinit names rank ${clip(id, 12)} on the connection of rank ${m.info.rank}`);
      }
      s.boundBy = 'fullinit';
    } else {
      m = s.bind(id);
      s.boundBy = 'fullinit';
    }
    s.pmi2Escapes = c.args.has('threaded');
    // Older clients (MPICH 4.0 simple2pmi, Slurm's) insist on pmi-version and pmi-subversion and
    // read pmiverbose as TRUE/FALSE; newer ones atoi() it, which makes FALSE a 0.
    const f: Fields = {
      'pmi-version': 2,
      'pmi-subversion': 0,
      rank: m.info.rank,
      size: m.info.size,
      appnum: m.info.appnum,
    };
    if (m.info.spawnerJobId !== undefined) f['spawner-jobid'] = m.info.spawnerJobId;
    f.pmiverbose = false;
    return f;
  },

  'job-getid'(s) {
    return { jobid: s.requireMember().info.kvsname };
  },

  'kvs-put'(s, c) {
    s.requireMember().put(checkKey(c.args.get('key'), true), checkValue(c.args.get('value')));
    return {};
  },

  async 'kvs-fence'(s) {
    await s.requireMember().fence();
    return {};
  },

  'kvs-get'(s, c) {
    const m = s.requireMember();
    if (c.args.has('jobid')) checkKvsname(m, c.args.get('jobid'));
    const key = checkKey(c.args.get('key'), false);
    const r = m.get(key);
    if (!r.found && r.why === 'unfenced')
      throw new PmiError(`key ${key} was put by another rank and is visible after the next kvs-fence`);
    return lookupFields(r.found ? r.value : undefined);
  },

  'info-getjobattr'(s, c) {
    const m = s.requireMember();
    if (c.args.has('kvsname')) checkKvsname(m, c.args.get('kvsname'));
    return lookupFields(s.jobAttr(m, checkKey(c.args.get('key'), false)));
  },

  'info-putnodeattr'(s, c) {
    s.requireMember().putNodeAttr(checkKey(c.args.get('key'), false), checkValue(c.args.get('value')));
    return {};
  },

  async 'info-getnodeattr'(s, c) {
    const m = s.requireMember();
    return lookupFields(await m.getNodeAttr(checkKey(c.args.get('key'), false), bool(c.args.get('wait'))));
  },

  'name-publish'(s, c) {
    s.requireMember().publish(checkService(c.args, 'name'), checkValue(c.args.get('port'), 'port'));
    return {};
  },

  'name-unpublish'(s, c) {
    s.requireMember().unpublish(checkService(c.args, 'name'));
    return {};
  },

  async 'name-lookup'(s, c) {
    const port = await s.requireMember().lookup(checkService(c.args, 'name'));
    // MPICH >= 4.1 reads port=, the older clients value=.
    return { port, value: port };
  },

  async spawn(s, c) {
    const m = s.requireMember();
    if (!m.spawn) throw new PmiError('MPI_Comm_spawn is not supported: dask-pmix runs MPI on existing Dask workers');
    const r = await m.spawn(spawnRequest(c));
    return { jobid: r.jobId, errcodes: r.errcodes.join(',') };
  },

  'job-connect'() {
    throw new PmiError('job-connect is not supported (MPICH marks it as not functioning)');
  },

  'job-disconnect'() {
    throw new PmiError('job-disconnect is not supported (MPICH marks it as not functioning)');
  },

  finalize(s) {
    if (s.member && s.phase === 'bound') {
      s.phase = 'finalized';
      try {
        s.member.finalize();
      } catch {
        // The job may have failed already; the process is exiting either way, so it gets its ack.
      }
    }
    return {};
  },

  abort(s, c) {
    if (s.member && s.phase === 'bound') {
      s.phase = 'aborted';
      const raw = c.args.get('exitcode');
      const code = raw !== undefined && /^-?\d{1,10}$/.test(raw) ? Number(raw) : 1;
      try {
        s.member.abort(code, c.args.get('message') ?? c.args.get('msg') ?? `exit code ${code}`);
      } catch {
        // Nothing to tell a process that is about to exit.
      }
    }
    return null;
  },
};

/**
 * `cmd=spawn;ncmds=N;preputcount=n;ppkey0=..;ppval0=..;subcmd=exe;maxprocs=..;argc=..;argv0=..;
 * infokeycount=..;infokey0=..;infoval0=..;subcmd=...` — each subcmd opens an app's segment.
 */
function spawnRequest(c: Pmi2Command): SpawnRequest {
  const head = new Map<string, string>();
  const segs: Map<string, string>[] = [];
  for (const [k, v] of c.tokens) {
    if (k === 'subcmd') segs.push(new Map([[k, v]]));
    else (segs[segs.length - 1] ?? head).set(k, v);
  }
  const num = (m: Map<string, string>, k: string) => parseIntArg(m.get(k) ?? '0', k);
  const preput: [string, string][] = [];
  for (let i = 0; i < num(head, 'preputcount'); i++)
    preput.push([head.get(`ppkey${i}`) ?? '', head.get(`ppval${i}`) ?? '']);
  const apps: SpawnApp[] = segs.map((seg) => {
    const argv: string[] = [];
    for (let i = 0; i < num(seg, 'argc'); i++) argv.push(seg.get(`argv${i}`) ?? '');
    const info: [string, string][] = [];
    for (let i = 0; i < num(seg, 'infokeycount'); i++)
      info.push([seg.get(`infokey${i}`) ?? '', seg.get(`infoval${i}`) ?? '']);
    return { command: seg.get('subcmd')!, argv, maxprocs: num(seg, 'maxprocs'), info };
  });
  if (apps.length === 0 || apps.length !== num(head, 'ncmds'))
    throw new PmiError('spawn: ncmds does not match the subcmd segments');
  return { apps, preput };
}
