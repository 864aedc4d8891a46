// The native engine's codec (native/src/pmi/codec.cc) against the TypeScript codec it must match:
// the same frames from the same bytes however they are chunked, the same commands parsed (or
// refused: the engine then passes the frame to the TypeScript handlers, which word the error),
// and the same replies and squeezed messages. Real transcripts, damaged ones and random bytes.
import { describe, expect, it } from 'vitest';
import { nativeCodec } from '../../src/pmi/engine.js';
import { PmiError } from '../../src/pmi/errors.js';
import { PMI1_MAX_LINE, PMI2_MAX_BODY } from '../../src/pmi/limits.js';
import { formatPmi1Error, formatPmi1Failure, parsePmi1Line, pmi1Token, pmi1Value } from '../../src/pmi/pmi1-codec.js';
import { formatPmi2, formatPmi2Error, parsePmi2Body, pmi2Text } from '../../src/pmi/pmi2-codec.js';
import { type Frame, PMI1_MAX_BLOCK, WireFramer } from '../../src/pmi/wire-framer.js';
import { chunks, mutate, pmi1Transcript, pmi2Transcript, type Rng, rng, SEED } from './helpers/transcripts.js';
import { frame2 } from './helpers/wire-client.js';

const codec = nativeCodec();

function tsFrames(parts: string[]): { frames: Frame[]; pending: number } {
  const f = new WireFramer();
  const frames: Frame[] = [];
  for (const p of parts) frames.push(...f.push(p));
  return { frames, pending: f.pending };
}

function sameFrames(parts: string[]): void {
  const native = codec.pmiCodecFrames(parts);
  const ts = tsFrames(parts);
  expect(native.frames).toEqual(ts.frames);
  expect(native.pending).toBe(ts.pending);
}

/** The TypeScript parse as the native one reports it: null where it throws. */
function tsParse(wire: 1 | 2, text: string): { cmd: string; args: [string, string][] } | null {
  try {
    if (wire === 1) {
      const c = parsePmi1Line(text);
      return { cmd: c.cmd, args: [...c.args] };
    }
    const c = parsePmi2Body(text);
    return { cmd: c.cmd, args: c.tokens.map(([k, v]) => [k, v]) };
  } catch (e) {
    expect(e).toBeInstanceOf(PmiError);
    return null;
  }
}

function randomBytes(r: Rng, n: number, alphabet?: string): string {
  let s = '';
  for (let i = 0; i < n; i++) s += alphabet ? alphabet[r.int(alphabet.length)] : String.fromCharCode(r.int(256));
  return s;
}

describe('native framer = WireFramer', () => {
  const id = '0123456789abcdef0123456789abcdef';
  it.each([
    ['a PMI-1 transcript', pmi1Transcript(id, 'kvs_1', 0)],
    ['a PMI-2 transcript', pmi2Transcript(id, 'kvs_1', 1)],
    ['CRLF lines', 'cmd=get_maxes\r\ncmd=barrier_in\r\n'],
    [
      'a line at the limit, then one over it',
      `cmd=put value=${'v'.repeat(PMI1_MAX_LINE - 15)}\ncmd=put value=${'v'.repeat(PMI1_MAX_LINE)}\ncmd=get_maxes\n`,
    ],
    ['a line over the limit that never ends', `cmd=put value=${'v'.repeat(PMI1_MAX_LINE * 2)}`],
    [
      'an empty and an over-long PMI-2 body',
      `     0${frame2('cmd=job-getid;')}${String(PMI2_MAX_BODY + 1).padStart(6)}${'x'.repeat(PMI2_MAX_BODY + 1)}${frame2('cmd=finalize;')}`,
    ],
    ['a left-aligned PMI-2 length (older clients)', `12    cmd=finalize${frame2('cmd=kvs-fence;')}`],
    ['a spawn block over its limit', `mcmd=spawn\n${'arg=x\n'.repeat(PMI1_MAX_BLOCK / 6 + 10)}endcmd\n`],
    ['bytes that are no PMI', 'GET / HTTP/1.1\r\n\r\ncmd=get_maxes\n'],
    ['a PMI-2 length still arriving', '   '],
  ])('frames %s alike, whole and byte by byte', (_what, bytes) => {
    sameFrames([bytes]);
    // (WireFramer rescans a spawn block still arriving: long ones go in 97-byte pieces.)
    sameFrames(bytes.length < 8192 ? [...bytes] : (bytes.match(/[\s\S]{1,97}/g) ?? []));
  });

  it(`frames damaged transcripts and random bytes alike, however chunked (seed ${SEED})`, () => {
    const r = rng(SEED);
    for (let i = 0; i < 400; i++) {
      const base =
        i % 3 === 0
          ? pmi1Transcript(id, 'kvs_1', i)
          : i % 3 === 1
            ? pmi2Transcript(id, 'kvs_2', i)
            : randomBytes(r, 1 + r.int(600), 'cmd=; \n0123456789mcendxyz');
      const bytes = mutate(r, base);
      sameFrames(chunks(r, bytes));
    }
  });
});

describe('native parsers = parsePmi1Line / parsePmi2Body', () => {
  it.each([
    'cmd=put kvsname=kvs_1 key=-bcast-1-0 value=2F6465',
    'cmd=put  kvsname=k   key=a\\b value=x=y ',
    'put kvsname=k',
    'cmd=put lonely',
    'cmd=put =v',
    'cmd=',
    'cmd=put key=a key=b',
    'cmd=put cmd=get',
    'cmd=barrier_in',
  ])('PMI-1 %j', (line) => {
    expect(codec.pmiCodecParse(1, line)).toEqual(tsParse(1, line));
  });

  it.each([
    'cmd=kvs-put;key=k;value=v;',
    'cmd=kvs-get;jobid=kvs_1;srcid=0;key=card-0;thrid=0x7f;',
    'cmd=spawn;ncmds=2;subcmd=a;subcmd=b;',
    'cmd=kvs-put;key=k;value=a;;b;',
    'cmd=fullinit;srcid=1;threaded=FALSE;',
    '  cmd=x;',
    'cmd=x; key=v;',
    'cmd=x;k y=v;',
    'cmd=x;=v;',
    'cmd=;',
    'cmd=x;cmd=y;',
    'cmd=x;;;',
    'kvs-put;key=k;',
  ])('PMI-2 %j', (body) => {
    expect(codec.pmiCodecParse(2, body)).toEqual(tsParse(2, body));
  });

  it(`parses damaged and random commands alike (seed ${SEED})`, () => {
    const r = rng(SEED + 1);
    const lines = pmi1Transcript('0123456789abcdef0123456789abcdef', 'kvs_1', 3).split('\n');
    for (let i = 0; i < 2000; i++) {
      const line =
        r.next() < 0.5 ? mutate(r, r.pick(lines)).split('\n')[0]! : `cmd=${randomBytes(r, r.int(60), 'ab=; \t;\xe9x')}`;
      expect(codec.pmiCodecParse(1, line), JSON.stringify(line)).toEqual(tsParse(1, line));
      const body = `cmd=${randomBytes(r, r.int(60), 'ab=; \n;\xe9x')}`;
      expect(codec.pmiCodecParse(2, body), JSON.stringify(body)).toEqual(tsParse(2, body));
    }
  });
});

describe('native formatting = the TypeScript codec', () => {
  const texts = [
    '',
    'key k not found',
    'job j-1 failed: rank 2 (worker w3) was lost: its PMI connection closed before PMI finalize',
    'a\nb\tc\u00ffd',
    '  lots   of\r\n\vspace\u00a0here ',
    'semi;colon\nnew\rline',
    'x'.repeat(900),
    '\x00\x1f\x7f\x80\x85\xa0',
  ];

  it.each(texts)('squeezes %j alike', (text) => {
    expect(codec.pmiCodecFormat('pmi1Token', text)).toBe(pmi1Token(text));
    expect(codec.pmiCodecFormat('pmi1Value', text)).toBe(pmi1Value(text));
    expect(codec.pmiCodecFormat('pmi2Text', text)).toBe(pmi2Text(text));
    const err = new PmiError(text);
    expect(codec.pmiCodecFormat('pmi1Error', 'get_result', text, false)).toBe(formatPmi1Error('get_result', err));
    expect(codec.pmiCodecFormat('pmi1Error', 'barrier_out', text, true)).toBe(formatPmi1Failure('barrier_out', err));
    expect(codec.pmiCodecFormat('pmi2Error', 'kvs-get-response', text, null)).toBe(
      formatPmi2Error('kvs-get-response', err),
    );
    expect(codec.pmiCodecFormat('pmi2Error', 'kvs-fence-response', text, '0x55d0')).toBe(
      formatPmi2Error('kvs-fence-response', err, '0x55d0'),
    );
  });

  it(`squeezes random text alike (seed ${SEED})`, () => {
    const r = rng(SEED + 2);
    for (let i = 0; i < 500; i++) {
      const text = randomBytes(r, r.int(500));
      expect(codec.pmiCodecFormat('pmi1Token', text)).toBe(pmi1Token(text));
      expect(codec.pmiCodecFormat('pmi1Value', text)).toBe(pmi1Value(text));
      expect(codec.pmiCodecFormat('pmi2Text', text)).toBe(pmi2Text(text));
    }
  });

  it.each([
    [false, undefined],
    [true, undefined],
    [false, '0x1'],
    [true, '0x7ffd'],
  ] as const)('formats PMI-2 replies alike (escape %s, thrid %s)', (escaping, thrid) => {
    const fields: [string, string][] = [
      ['rc', '0'],
      ['found', 'TRUE'],
      ['value', 'a;b;;c'],
    ];
    expect(codec.pmiCodecFormat('pmi2', 'kvs-get-response', fields, thrid ?? null, escaping)).toBe(
      formatPmi2('kvs-get-response', Object.fromEntries(fields), thrid, escaping),
    );
  });
});
