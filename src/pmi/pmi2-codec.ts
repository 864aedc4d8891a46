// PMI-2 wire format (MPICH src/pmi/src/pmi_wire.c, PMIU_cmd_output_v2 / parse_v2):
//
//   "%6u" length of the body, then the body `cmd=<name>;key=value;...;`
//
// No newline, no escaping; a value runs to the next `;`. A threaded client adds `thrid=<ptr>`
// and matches the reply by it, so every reply echoes the request's thrid. Keys may repeat
// (spawn lists one `subcmd=` segment per app), so tokens keep their order.
import { PmiError } from './errors.js';
import { clip } from './pmi1-codec.js';

/** Length header width. */
export const PMI2_HEADER = 6;

export interface Pmi2Command {
  readonly cmd: string;
  /** Every key=value after cmd, in order (thrid included). */
  readonly tokens: readonly (readonly [string, string])[];
  /** First value of each key. */
  readonly args: ReadonlyMap<string, string>;
  readonly thrid: string | undefined;
}

/** Parses a body (the bytes after the 6-character length). Throws PmiError if malformed. */
export function parsePmi2Body(body: string): Pmi2Command {
  if (!body.startsWith('cmd=')) throw new PmiError('a PMI-2 command starts with cmd=');
  let cmd: string | undefined;
  const tokens: [string, string][] = [];
  const args = new Map<string, string>();
  for (const token of splitTokens(body)) {
    const t = token.replace(/^ +/, '');
    if (t === '') continue;
    const eq = t.indexOf('=');
    if (eq <= 0) throw new PmiError(`malformed token "${clip(t)}": expected key=value`);
    const key = t.slice(0, eq);
    if (/[ \n]/.test(key)) throw new PmiError(`malformed key "${clip(key)}"`);
    const value = t.slice(eq + 1);
    if (key === 'cmd') {
      if (cmd !== undefined) throw new PmiError('cmd= given twice');
      cmd = value;
      continue;
    }
    tokens.push([key, value]);
    if (!args.has(key)) args.set(key, value);
  }
  if (!cmd) throw new PmiError('empty command name');
  return { cmd, tokens, args, thrid: args.get('thrid') };
}

/**
 * Splits a body at `;`. The older PMI-2 clients escape a `;` inside a value as `;;`; MPICH
 * >= 4.1 never writes `;;` (it has no empty tokens), so reading `;;` as an escaped `;` suits both.
 */
function splitTokens(body: string): string[] {
  if (!body.includes(';;')) return body.split(';');
  const out: string[] = [];
  let cur = '';
  for (let i = 0; i < body.length; i++) {
    const ch = body[i];
    if (ch !== ';') cur += ch;
    else if (body[i + 1] === ';') {
      cur += ';';
      i++;
    } else {
      out.push(cur);
      cur = '';
    }
  }
  out.push(cur);
  return out;
}

export type Pmi2Value = string | number | boolean;

/**
 * Formats a reply frame, echoing thrid when the request carried one. With `escape` (clients of
 * the older dialect, which unescape) a `;` in a value is written `;;`; MPICH >= 4.1 reads
 * values up to the first `;` and has no escape, so for it values go out as they are (MPICH's
 * own values are hex and never hold one).
 */
export function formatPmi2(
  cmd: string,
  fields: Readonly<Record<string, Pmi2Value>>,
  thrid?: string,
  escapeValues = false,
): string {
  let body = `cmd=${cmd};`;
  if (thrid !== undefined) body += `thrid=${thrid};`;
  for (const [k, v] of Object.entries(fields)) {
    const s = typeof v === 'boolean' ? (v ? 'TRUE' : 'FALSE') : String(v);
    body += `${k}=${escapeValues ? s.replace(/;/g, ';;') : s};`;
  }
  return pmi2Frame(body);
}

/** Prefixes a body with its length, space-padded to 6 characters like snprintf("%6u"). */
export function pmi2Frame(body: string): string {
  const len = Buffer.byteLength(body, 'latin1');
  if (len > 999_999) throw new PmiError('PMI-2 frame too long');
  return `${String(len).padStart(PMI2_HEADER, ' ')}${body}`;
}

export function formatPmi2Error(response: string, err: PmiError, thrid?: string): string {
  return formatPmi2(response, { rc: err.rc, errmsg: pmi2Text(err.message) }, thrid);
}

/** Makes free text safe as a PMI-2 value (no `;`, no newline). */
export function pmi2Text(text: string): string {
  return text
    .replace(/[;\n\r]/g, ',')
    .replace(/[^\x20-\x7e]/g, '?')
    .slice(0, 400);
}

/**
 * True if `s` is a plausible 6-character length header: decimal digits padded with spaces,
 * on the left as MPICH >= 4.1 writes it ("%6u") or on the right as the older PMI-2 clients
 * (MPICH 4.0 simple2pmi, Slurm's libpmi2) do.
 */
export function isPmi2Header(s: string): boolean {
  return s.length === PMI2_HEADER && /^ *\d{1,6} *$/.test(s);
}
