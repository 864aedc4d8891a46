// PMI-1 ("simple PMI") wire format, as MPICH's clients write and read it
// (src/pmi/src/pmi_wire.c in 5.x, src/pmi/simple/simple_pmiutil.c in 4.0.2):
//
//   cmd=<name> key=value key=value\n      one command per line (limits.ts bounds it)
//   mcmd=spawn\nkey=value\n...endcmd\n     spawn only: one block per app, values run to end of line
//
// Values are opaque tokens: we neither unescape nor escape them, so a value a client put comes
// back byte for byte. MPICH 4.0.2 cannot parse a token without `=` or a value with a space, so
// everything we generate ourselves (error messages above all) is squeezed into one token.
import { PmiError } from './errors.js';

export interface Pmi1Command {
  readonly cmd: string;
  readonly args: ReadonlyMap<string, string>;
}

/** Parses one line (without its newline) that starts with `cmd=`. Throws PmiError if malformed. */
export function parsePmi1Line(line: string): Pmi1Command {
  if (!line.startsWith('cmd=')) throw new PmiError('a PMI-1 command starts with cmd=');
  let cmd: string | undefined;
  const args = new Map<string, string>();
  // One pass over the line, no token array: this runs for every command.
  const n = line.length;
  for (let i = 0; i < n; ) {
    if (line.charCodeAt(i) === 32) {
      i++;
      continue;
    }
    let end = line.indexOf(' ', i);
    if (end < 0) end = n;
    const eq = line.indexOf('=', i);
    if (eq <= i || eq >= end) throw new PmiError(`malformed token "${clip(line.slice(i, end))}": expected key=value`);
    const key = line.slice(i, eq);
    const value = line.slice(eq + 1, end);
    i = end + 1;
    if (key === 'cmd') {
      if (cmd !== undefined) throw new PmiError('cmd= given twice');
      cmd = value;
    } else {
      if (args.has(key)) throw new PmiError(`key ${clip(key)} given twice`);
      args.set(key, value);
    }
  }
  if (!cmd) throw new PmiError('empty command name');
  return { cmd, args };
}

/** One app of a spawn request, from its `mcmd=spawn ... endcmd` block. */
export interface Pmi1SpawnBlock {
  readonly fields: ReadonlyMap<string, string>;
  readonly totspawns: number;
  readonly spawnssofar: number;
}

/**
 * Parses the lines of one spawn block, from `mcmd=spawn` up to but excluding `endcmd`. In a
 * block a value is the rest of its line (arguments may hold spaces), as MPICH's parse_v1_mcmd reads it.
 */
export function parsePmi1SpawnBlock(lines: readonly string[]): Pmi1SpawnBlock {
  if (lines[0] !== 'mcmd=spawn') throw new PmiError('a multi-line command must start with mcmd=spawn');
  const fields = new Map<string, string>();
  for (const line of lines.slice(1)) {
    if (line === '') continue;
    const eq = line.indexOf('=');
    if (eq <= 0) throw new PmiError(`malformed spawn line "${clip(line)}": expected key=value`);
    const key = line.slice(0, eq);
    if (fields.has(key)) throw new PmiError(`spawn key ${clip(key)} given twice`);
    fields.set(key, line.slice(eq + 1));
  }
  const totspawns = intField(fields, 'totspawns');
  const spawnssofar = intField(fields, 'spawnssofar');
  if (totspawns < 1 || spawnssofar < 1 || spawnssofar > totspawns) {
    throw new PmiError(`bad spawn block numbering spawnssofar=${spawnssofar} totspawns=${totspawns}`);
  }
  return { fields, totspawns, spawnssofar };
}

function intField(fields: ReadonlyMap<string, string>, key: string): number {
  const s = fields.get(key);
  if (s === undefined || !/^-?\d{1,9}$/.test(s)) throw new PmiError(`spawn block needs an integer ${key}=`);
  return Number(s);
}

export type Pmi1Value = string | number | boolean;

/**
 * Formats a reply line. Values must not hold spaces or newlines; those we generate are passed
 * through pmi1Token first, and those clients put cannot hold them (the parser splits on spaces).
 */
export function formatPmi1(cmd: string, fields: Readonly<Record<string, Pmi1Value>> = {}): string {
  let out = `cmd=${cmd}`;
  for (const [k, v] of Object.entries(fields)) {
    out += ` ${k}=${typeof v === 'boolean' ? (v ? 'TRUE' : 'FALSE') : v}`;
  }
  return `${out}\n`;
}

/** A reply carrying an error: `cmd=<response> rc=<rc> msg=<message as one token>`. */
export function formatPmi1Error(response: string, err: PmiError): string {
  return formatPmi1(response, { rc: err.rc, msg: pmi1Token(err.message) });
}

/**
 * An error reply that also fails clients which ignore rc. MPICH <= 4.0's simple PMI client
 * (also inside Intel MPI) reads barrier_out without looking at rc, so a failed barrier would
 * look like a passed one and the rank would go on into a job whose peers are gone (and hang
 * in UCX's finalize). Its parser rejects a token without `=`, so a trailing bare `failed`
 * token makes it fail the call; MPICH >= 4.1 parses bare tokens and goes by rc.
 */
export function formatPmi1Failure(response: string, err: PmiError): string {
  return `${formatPmi1Error(response, err).slice(0, -1)} failed\n`;
}

/** Squeezes free text into one PMI-1 token that both MPICH 4.0.2 and 5.x parse. */
export function pmi1Token(text: string): string {
  const t = text.replace(/\s+/g, '_').replace(/[^\x21-\x7e]/g, '?');
  return t === '' ? '_' : t.slice(0, 400);
}

/**
 * A stored value on its way to a PMI-1 client. Values put over PMI-1 never hold whitespace;
 * one put or published over PMI-2 might, and would break the reply line, so it is squeezed.
 */
export function pmi1Value(v: string): string {
  return /[\s]/.test(v) ? v.replace(/\s/g, '_') : v;
}

/** Shortens untrusted text quoted in an error message. */
export function clip(s: string, n = 40): string {
  return s.length > n ? `${s.slice(0, n)}...` : s;
}
