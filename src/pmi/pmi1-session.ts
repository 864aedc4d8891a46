// The PMI-1 command set (MPICH src/pmi/maint/pmi-1.1.txt) for one connection.
//
// Each command gets its own response name (put → put_result ...); a failure is that response
// with rc=-1 and a msg, so MPICH 5.x reports "server responded with rc=-1 - <msg>" and 4.0.2
// sees rc != 0 where it looks. Only `abort` has no reply.
import {
  type ConnectionState,
  checkKey,
  checkKvsname,
  checkService,
  checkValue,
  parseIntArg,
  requireArg,
} from './connection-state.js';
import { PmiError } from './errors.js';
import type { SpawnApp, SpawnRequest } from './job-core.js';
import { LIMITS } from './limits.js';
import {
  clip,
  formatPmi1,
  formatPmi1Error,
  formatPmi1Failure,
  type Pmi1Command,
  type Pmi1SpawnBlock,
  parsePmi1SpawnBlock,
  pmi1Value,
} from './pmi1-codec.js';

export interface Reply {
  readonly text: string;
  /** Close the connection once the reply is written. */
  readonly close?: boolean;
}

/** Response name of each PMI-1 query. */
export const PMI1_RESPONSE: Readonly<Record<string, string>> = {
  initack: 'initack',
  init: 'response_to_init',
  get_maxes: 'maxes',
  get_appnum: 'appnum',
  get_my_kvsname: 'my_kvsname',
  get_universe_size: 'universe_size',
  put: 'put_result',
  get: 'get_result',
  barrier_in: 'barrier_out',
  finalize: 'finalize_ack',
  publish_name: 'publish_result',
  unpublish_name: 'unpublish_result',
  lookup_name: 'lookup_result',
  spawn: 'spawn_result',
};

/** Reply name for a command we do not know (there is no PMI-1 convention for it). */
export const PMI1_UNKNOWN_RESPONSE = 'error';

type Handler = (s: Pmi1Session, c: Pmi1Command) => Promise<string | Reply | null> | string | Reply | null;

export class Pmi1Session {
  /** Blocks of a spawn request received so far (one per app, the last has spawnssofar == totspawns). */
  private spawnBlocks: Pmi1SpawnBlock[] = [];

  constructor(readonly state: ConnectionState) {}

  /** The reply to one line: at once when its handler is synchronous (most are), else a promise. */
  handleLine(c: Pmi1Command): string | Reply | null | Promise<string | Reply | null> {
    const handler = HANDLERS[c.cmd];
    if (!handler)
      return formatPmi1Error(
        PMI1_RESPONSE[c.cmd] ?? PMI1_UNKNOWN_RESPONSE,
        new PmiError(`unknown PMI-1 command ${clip(c.cmd)}`),
      );
    let r: ReturnType<typeof handler>;
    try {
      r = handler(this, c);
    } catch (e) {
      return this.failed(c, e);
    }
    return r instanceof Promise ? r.catch((e: unknown) => this.failed(c, e)) : r;
  }

  private failed(c: Pmi1Command, e: unknown): Reply {
    const err = this.state.replyError(`PMI-1 ${c.cmd}`, e);
    // A refused credential costs the connection (no guessing on one socket); a refused initack
    // also leaves an MPICH 4.0.2 client waiting for `cmd=set` lines. A connection that already
    // belongs to a member keeps it.
    return {
      text: formatPmi1Error(PMI1_RESPONSE[c.cmd] ?? PMI1_UNKNOWN_RESPONSE, err),
      close: this.state.phase === 'refused',
    };
  }

  /** One `mcmd=spawn` block; the reply comes after the last block of the request. */
  async handleSpawnBlock(lines: readonly string[]): Promise<Reply | null> {
    let block: Pmi1SpawnBlock;
    try {
      block = parsePmi1SpawnBlock(lines);
      const first = this.spawnBlocks[0];
      if (first && (block.totspawns !== first.totspawns || block.spawnssofar !== this.spawnBlocks.length + 1)) {
        throw new PmiError('spawn blocks out of order');
      }
      if (!first && block.spawnssofar !== 1) throw new PmiError('spawn request must start with spawnssofar=1');
      this.spawnBlocks.push(block);
      if (block.spawnssofar < block.totspawns) return null;
    } catch (e) {
      this.spawnBlocks = [];
      return { text: formatPmi1Error('spawn_result', this.state.replyError('PMI-1 spawn', e)) };
    }
    const blocks = this.spawnBlocks;
    this.spawnBlocks = [];
    try {
      const member = this.state.requireMember();
      if (!member.spawn) {
        throw new PmiError('MPI_Comm_spawn is not supported: dask-pmix runs MPI on existing Dask workers');
      }
      const result = await member.spawn(spawnRequest(blocks));
      return { text: formatPmi1('spawn_result', { rc: 0, errcodes: result.errcodes.join(',') || '0' }) };
    } catch (e) {
      return { text: formatPmi1Error('spawn_result', this.state.replyError('PMI-1 spawn', e)) };
    }
  }
}

function spawnRequest(blocks: readonly Pmi1SpawnBlock[]): SpawnRequest {
  const apps: SpawnApp[] = [];
  let preput: [string, string][] = [];
  for (const { fields } of blocks) {
    const num = (k: string) => parseIntArg(fields.get(k) ?? '0', k);
    const argv: string[] = [];
    for (let i = 1; i <= num('argcnt'); i++) argv.push(fields.get(`arg${i}`) ?? '');
    const info: [string, string][] = [];
    for (let i = 0; i < num('info_num'); i++)
      info.push([fields.get(`info_key_${i}`) ?? '', fields.get(`info_val_${i}`) ?? '']);
    // Every block repeats the same preput list.
    preput = [];
    for (let i = 0; i < num('preput_num'); i++)
      preput.push([fields.get(`preput_key_${i}`) ?? '', fields.get(`preput_val_${i}`) ?? '']);
    apps.push({ command: requireArg(fields, 'execname'), argv, maxprocs: num('nprocs'), info });
  }
  return { apps, preput };
}

// The replies of the commands that run most often, made once.
const PUT_OK = formatPmi1('put_result', { rc: 0 });
const BARRIER_OK = formatPmi1('barrier_out', { rc: 0 });

const HANDLERS: Readonly<Record<string, Handler>> = {
  initack(s, c) {
    const m = s.state.bind(c.args.get('pmiid'));
    s.state.boundBy = 'initack';
    // Four lines in one reply: MPICH reads size, rank and debug as `cmd=set` lines.
    return (
      formatPmi1('initack', { rc: 0 }) +
      formatPmi1('set', { size: m.info.size }) +
      formatPmi1('set', { rank: m.info.rank }) +
      formatPmi1('set', { debug: 0 })
    );
  },

  init(s, c) {
    const v = c.args.get('pmi_version');
    if (v === '1') {
      s.state.version = 1;
      // 1.1, not 1.2: keeps the client single-threaded and off tagged group barriers.
      return formatPmi1('response_to_init', { rc: 0, pmi_version: 1, pmi_subversion: 1 });
    }
    if (v === '2') {
      s.state.version = 2;
      return formatPmi1('response_to_init', { rc: 0, pmi_version: 2, pmi_subversion: 0 });
    }
    throw new PmiError(`PMI version mismatch: this server speaks PMI 1.1 and 2.0, not ${clip(v ?? '(none)')}`);
  },

  get_maxes() {
    return formatPmi1('maxes', {
      rc: 0,
      kvsname_max: LIMITS.kvsnameMax,
      keylen_max: LIMITS.keyMax,
      vallen_max: LIMITS.valueMax,
    });
  },

  get_appnum(s) {
    return formatPmi1('appnum', { rc: 0, appnum: s.state.requireMember().info.appnum });
  },

  get_my_kvsname(s) {
    return formatPmi1('my_kvsname', { rc: 0, kvsname: s.state.requireMember().info.kvsname });
  },

  get_universe_size(s) {
    return formatPmi1('universe_size', { rc: 0, size: s.state.requireMember().info.universeSize });
  },

  put(s, c) {
    const m = s.state.requireMember();
    checkKvsname(m, c.args.get('kvsname'));
    m.put(checkKey(c.args.get('key'), true), checkValue(c.args.get('value')));
    return PUT_OK;
  },

  get(s, c) {
    const m = s.state.requireMember();
    checkKvsname(m, c.args.get('kvsname'));
    const key = checkKey(c.args.get('key'), false);
    const attr = s.state.jobAttr(m, key);
    if (attr !== undefined) return formatPmi1('get_result', { rc: 0, value: attr });
    if (key.startsWith('PMI_') || key === 'universeSize') throw new PmiError(`job attribute ${key} not available`);
    const r = m.get(key);
    if (r.found) return `cmd=get_result rc=0 value=${pmi1Value(r.value)}\n`;
    throw new PmiError(
      r.why === 'unfenced'
        ? `key ${key} was put by another rank and is visible after the next barrier`
        : `key ${key} not found`,
    );
  },

  barrier_in(s, c) {
    if (c.args.has('group')) throw new PmiError('group barriers need PMI 1.2; this server negotiated 1.1');
    const failure = (e: unknown) => formatPmi1Failure('barrier_out', s.state.replyError('PMI-1 barrier_in', e));
    try {
      return s.state
        .requireMember()
        .fence()
        .then(() => BARRIER_OK, failure);
    } catch (e) {
      return failure(e);
    }
  },

  finalize(s) {
    const m = s.state.member;
    if (m && s.state.phase === 'bound') {
      s.state.phase = 'finalized';
      try {
        m.finalize();
      } catch {
        // The job may have failed already; the process is exiting either way, so it gets its ack.
      }
    }
    return formatPmi1('finalize_ack', { rc: 0 });
  },

  abort(s, c) {
    const m = s.state.member;
    if (m && s.state.phase === 'bound') {
      s.state.phase = 'aborted';
      const code = /^-?\d{1,10}$/.test(c.args.get('exitcode') ?? '') ? Number(c.args.get('exitcode')) : 1;
      try {
        m.abort(code, c.args.get('message') ?? `exit code ${code}`);
      } catch {
        // Nothing to tell a process that is about to exit.
      }
    }
    return null;
  },

  publish_name(s, c) {
    const m = s.state.requireMember();
    m.publish(checkService(c.args, 'service'), checkValue(c.args.get('port'), 'port'));
    return formatPmi1('publish_result', { rc: 0 });
  },

  unpublish_name(s, c) {
    s.state.requireMember().unpublish(checkService(c.args, 'service'));
    return formatPmi1('unpublish_result', { rc: 0 });
  },

  async lookup_name(s, c) {
    const port = await s.state.requireMember().lookup(checkService(c.args, 'service'));
    return formatPmi1('lookup_result', { rc: 0, port: pmi1Value(port) });
  },
};
