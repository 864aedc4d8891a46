// The PMI-1 and PMI-2 codecs, the framer that tells them apart, and PMI_process_mapping.
import { describe, expect, it } from 'vitest';
import { PmiError } from '../../src/pmi/errors.js';
import { PMI1_MAX_LINE } from '../../src/pmi/limits.js';
import {
  formatPmi1,
  formatPmi1Error,
  parsePmi1Line,
  parsePmi1SpawnBlock,
  pmi1Token,
} from '../../src/pmi/pmi1-codec.js';
import { formatPmi2, isPmi2Header, parsePmi2Body, pmi2Frame } from '../../src/pmi/pmi2-codec.js';
import { expand, nodeLayout, parseProcessMapping, processMapping } from '../../src/pmi/process-mapping.js';
import { type Frame, WireFramer } from '../../src/pmi/wire-framer.js';

describe('PMI-1 codec', () => {
  it('parses a command with its tokens', () => {
    const c = parsePmi1Line('cmd=put kvsname=kvs_1 key=-bcast-1-0 value=2F6465');
    expect(c.cmd).toBe('put');
    expect(Object.fromEntries(c.args)).toEqual({ kvsname: 'kvs_1', key: '-bcast-1-0', value: '2F6465' });
  });

  it('keeps values opaque (no unescaping) and tolerates extra spaces', () => {
    const c = parsePmi1Line('cmd=put  kvsname=k   key=a\\b value=x=y ');
    expect(c.args.get('key')).toBe('a\\b');
    expect(c.args.get('value')).toBe('x=y');
  });

  it.each([
    ['put kvsname=k', 'starts with cmd='],
    ['cmd=put lonely', 'expected key=value'],
    ['cmd=put =v', 'expected key=value'],
    ['cmd=', 'empty command name'],
    ['cmd=put key=a key=b', 'given twice'],
    ['cmd=put cmd=get', 'cmd= given twice'],
  ])('rejects %j', (line, msg) => {
    expect(() => parsePmi1Line(line)).toThrow(msg);
  });

  it('formats replies and squeezes messages into one token', () => {
    expect(formatPmi1('get_result', { rc: 0, value: 'abc', found: true })).toBe(
      'cmd=get_result rc=0 value=abc found=TRUE\n',
    );
    expect(formatPmi1Error('put_result', new PmiError('wrong kvsname foo: this member belongs to bar'))).toBe(
      'cmd=put_result rc=-1 msg=wrong_kvsname_foo:_this_member_belongs_to_bar\n',
    );
    expect(pmi1Token('a\nb\tc\u00ffd')).toBe('a_b_c?d');
  });

  it('parses a spawn block: values run to the end of the line', () => {
    const b = parsePmi1SpawnBlock([
      'mcmd=spawn',
      'nprocs=2',
      'execname=/bin/prog',
      'totspawns=1',
      'spawnssofar=1',
      'argcnt=1',
      'arg1=hello world',
    ]);
    expect(b.totspawns).toBe(1);
    expect(b.fields.get('arg1')).toBe('hello world');
    expect(() => parsePmi1SpawnBlock(['mcmd=spawn', 'nprocs=2'])).toThrow('totspawns');
    expect(() => parsePmi1SpawnBlock(['mcmd=spawn', 'totspawns=1', 'spawnssofar=2'])).toThrow('numbering');
  });
});

describe('PMI-2 codec', () => {
  it('parses a body, keeping repeated keys in order', () => {
    const c = parsePmi2Body('cmd=spawn;thrid=0x1;ncmds=2;subcmd=a;maxprocs=1;subcmd=b;maxprocs=2;');
    expect(c.cmd).toBe('spawn');
    expect(c.thrid).toBe('0x1');
    expect(c.tokens.filter(([k]) => k === 'subcmd').map(([, v]) => v)).toEqual(['a', 'b']);
    expect(c.args.get('maxprocs')).toBe('1');
  });

  it('reads ;; as an escaped ; (older clients) and allows spaces in values', () => {
    const c = parsePmi2Body('cmd=kvs-put;key=k;value=a;;b c;');
    expect(c.args.get('value')).toBe('a;b c');
  });

  it('formats frames with a right-aligned 6-character length and echoes thrid', () => {
    const f = formatPmi2('kvs-get-response', { rc: 0, found: true, value: 'v' }, '0xabc');
    expect(f).toBe('    57cmd=kvs-get-response;thrid=0xabc;rc=0;found=TRUE;value=v;');
    expect(Number(f.slice(0, 6))).toBe(f.length - 6);
    expect(pmi2Frame('cmd=x;')).toBe('     6cmd=x;');
  });

  it('accepts left- and right-aligned length headers only', () => {
    expect(isPmi2Header('    23')).toBe(true);
    expect(isPmi2Header('23    ')).toBe(true);
    expect(isPmi2Header('000023')).toBe(true);
    expect(isPmi2Header('  2 3 ')).toBe(false);
    expect(isPmi2Header('cmd=in')).toBe(false);
  });

  it.each(['kvs-put;key=a;', 'cmd=x;novalue;', 'cmd=;'])('rejects %j', (body) => {
    expect(() => parsePmi2Body(body)).toThrow(PmiError);
  });
});

function frames(chunks: string[]): Frame[] {
  const f = new WireFramer();
  return chunks.flatMap((c) => f.push(Buffer.from(c, 'latin1')));
}

describe('framer', () => {
  it('tells PMI-1 lines, spawn blocks and PMI-2 frames apart, in any chunking', () => {
    const stream = `cmd=init pmi_version=2 pmi_subversion=0\n${pmi2Frame('cmd=fullinit;pmirank=3;')}mcmd=spawn\nnprocs=1\nendcmd\ncmd=finalize\n`;
    const whole = frames([stream]);
    expect(whole.map((f) => f.kind)).toEqual(['line', 'pmi2', 'block', 'line']);
    // Byte by byte gives the same frames.
    expect(frames([...stream])).toEqual(whole);
    expect(whole[1]).toEqual({ kind: 'pmi2', body: 'cmd=fullinit;pmirank=3;' });
    expect(whole[2]).toEqual({ kind: 'block', lines: ['mcmd=spawn', 'nprocs=1'] });
  });

  it('skips an over-long line, reports it, and resynchronises', () => {
    const long = `cmd=put value=${'x'.repeat(PMI1_MAX_LINE)}`;
    const out = frames([long.slice(0, 700), long.slice(700), '\ncmd=get_maxes\n']);
    expect(out).toEqual([
      { kind: 'error', wire: 1, fatal: false, message: `line longer than ${PMI1_MAX_LINE} bytes` },
      { kind: 'line', text: 'cmd=get_maxes' },
    ]);
  });

  it('accepts a line of exactly the limit', () => {
    const line = `cmd=put value=${'x'.repeat(PMI1_MAX_LINE - 15)}`;
    expect(line.length + 1).toBe(PMI1_MAX_LINE);
    expect(frames([`${line}\n`])).toEqual([{ kind: 'line', text: line }]);
  });

  it('skips an over-long PMI-2 body by its length', () => {
    const out = frames([`999999${'y'.repeat(1000)}`, 'y'.repeat(999_999 - 1000), pmi2Frame('cmd=job-getid;')]);
    expect(out.map((f) => f.kind)).toEqual(['error', 'pmi2']);
  });

  it('gives up on bytes that are no PMI frame', () => {
    const out = frames(['GET / HTTP/1.1\r\n', 'cmd=get_maxes\n']);
    expect(out).toHaveLength(1);
    expect(out[0]).toMatchObject({ kind: 'error', fatal: true });
  });

  it('gives up on an over-long spawn block', () => {
    const out = frames([`mcmd=spawn\n${'arg=x\n'.repeat(20_000)}`]);
    expect(out).toEqual([expect.objectContaining({ kind: 'error', fatal: true })]);
  });
});

describe('PMI_process_mapping', () => {
  const check = (hosts: string[], expected: string) => {
    const m = processMapping(hosts);
    expect(m).toBe(expected);
    expect(parseProcessMapping(m, hosts.length)).toEqual(nodeLayout(hosts).nodeOfRank);
  };

  it('all ranks on one host', () => check(['a', 'a', 'a', 'a'], '(vector,(0,1,4))'));
  it('block placement', () => check(['a', 'a', 'b', 'b', 'c', 'c'], '(vector,(0,3,2))'));
  it('round robin is one wrapped period', () => check(['a', 'b', 'a', 'b', 'a', 'b'], '(vector,(0,2,1))'));
  it('uneven blocks', () => check(['a', 'a', 'a', 'b', 'c', 'c'], '(vector,(0,1,3),(1,1,1),(2,1,2))'));
  it('a partial last period', () => check(['a', 'a', 'b', 'b', 'a'], '(vector,(0,2,2))'));
  it('hosts in any order are numbered by first appearance', () =>
    check(['z', 'y', 'z', 'z'], '(vector,(0,2,1),(0,1,2))'));
  it('no ranks', () => expect(processMapping([])).toBe(''));

  it('matches what MPICH would expand, for random placements', () => {
    for (let trial = 0; trial < 300; trial++) {
      const n = 1 + Math.floor(Math.random() * 40);
      const hosts = Array.from({ length: n }, () => `h${Math.floor(Math.random() * 4)}`);
      const m = processMapping(hosts);
      expect(parseProcessMapping(m, n), `${hosts.join(',')} -> ${m}`).toEqual(nodeLayout(hosts).nodeOfRank);
    }
  });

  it('expand wraps to the first block, like MPICH', () => {
    expect(expand([{ start: 0, count: 2, size: 1 }], 5)).toEqual([0, 1, 0, 1, 0]);
  });
});
