// The value codec of the addon (native/src/values.cc): every PMIx value type the host exchanges,
// from JavaScript to a pmix_value_t and back, and also packed and unpacked by libpmix in
// between, as on the wire. Bounds and malformed values are refused with an error.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Value, v } from '../../src/pmix/index.js';
import { loadNative } from '../../src/pmix/native.js';
import { PmixFixture } from '../helpers/pmix-fixture.js';

let fx: PmixFixture;
beforeAll(async () => {
  fx = await PmixFixture.start();
});
afterAll(() => fx?.stop());

const trip = (value: Value, throughLibpmix: boolean) => loadNative().valueRoundTrip(value, throughLibpmix);

const proc = { nspace: 'ns-1', rank: 3 };
const pinfo = { proc, hostname: 'node-a', executable: '/bin/rank', pid: 4242, exitCode: -3, state: 7 };

/**
 * [what, value sent, what comes back when libpmix packs and unpacks it, if not the same]. The
 * exceptions are libpmix 5.0.11's own wire format: a double travels as printf's "%f" (six
 * decimals), a proc_info without its exit code, and a PMIX_DATA_TYPE is packed as an unsigned
 * varint but unpacked as a zigzag-encoded one.
 */
const CASES: [string, Value, Value?][] = [
  ['bool true', v.bool(true)],
  ['bool false', v.bool(false)],
  ['string', v.string('héllo, wörld')],
  ['empty string', v.string('')],
  ['byte', { type: 'byte', value: 255 }],
  ['pid', { type: 'pid', value: 2147483647 }],
  ['int min', { type: 'int', value: -2147483648 }],
  ['int8 min', { type: 'int8', value: -128 }],
  ['int8 max', { type: 'int8', value: 127 }],
  ['int16 min', { type: 'int16', value: -32768 }],
  ['int32 max', { type: 'int32', value: 2147483647 }],
  ['int64 min', { type: 'int64', value: -(2n ** 63n) }],
  ['int64 max', { type: 'int64', value: 2n ** 63n - 1n }],
  ['int64 small', { type: 'int64', value: -5 }],
  ['uint max', { type: 'uint', value: 4294967295 }],
  ['uint8 max', { type: 'uint8', value: 255 }],
  ['uint16 max', v.uint16(65535)],
  ['uint32 max', v.uint32(4294967295)],
  ['uint64 max', { type: 'uint64', value: 2n ** 64n - 1n }],
  ['uint64 as a number', { type: 'uint64', value: 2 ** 53 }],
  ['size beyond 2^53', { type: 'size', value: 2n ** 53n + 1n }],
  ['size', v.size(7)],
  ['float', { type: 'float', value: 1.5 }],
  // biome-ignore lint/suspicious/noApproximativeNumericConstant: libpmix packs a double with six decimals
  ['double', { type: 'double', value: Math.PI }, { type: 'double', value: 3.141593 }],
  ['double, exact in six decimals', { type: 'double', value: -1234.5 }],
  ['time', { type: 'time', value: 1796000000 }],
  ['timeval', { type: 'timeval', value: { sec: 1796000000, usec: 999999 } }],
  ['status', v.status(-46)],
  ['proc_rank wildcard', v.rank(0xfffffffe)],
  ['persist', { type: 'persist', value: 4 }],
  ['scope', { type: 'scope', value: 3 }],
  ['data_range', { type: 'data_range', value: 6 }],
  ['proc_state', { type: 'proc_state', value: 20 }],
  ['alloc_directive', { type: 'alloc_directive', value: 2 }],
  ['job_state', { type: 'job_state', value: 9 }],
  ['link_state', { type: 'link_state', value: 1 }],
  ['data_type', { type: 'data_type', value: 3 }, { type: 'data_type', value: 65534 }],
  ['info_directives', { type: 'info_directives', value: 0x1 }],
  ['byte_object', { type: 'byte_object', value: Buffer.from([0, 1, 2, 255]) }],
  ['empty byte_object', { type: 'byte_object', value: Buffer.alloc(0) }],
  ['compressed_string', { type: 'compressed_string', value: Buffer.from('not really compressed') }],
  ['compressed_byte_object', { type: 'compressed_byte_object', value: Buffer.from([9, 8, 7]) }],
  ['proc', v.proc(proc)],
  ['proc_nspace', { type: 'proc_nspace', value: 'ns-2' }],
  ['proc_info', { type: 'proc_info', value: pinfo }, { type: 'proc_info', value: { ...pinfo, exitCode: 0 } }],
  ['envar', { type: 'envar', value: { envar: 'PATH', value: '/bin', separator: ':' } }],
  ['undef (a bare key)', { type: 'undef', value: null }],
  [
    'array of info',
    v.infos([
      { key: 'k1', value: v.uint32(1) },
      { key: 'k2', value: v.string('two') },
      { key: 'k3', value: v.procs([proc]) },
    ]),
  ],
  ['array of proc', v.procs([proc, { nspace: 'ns-2', rank: 0xffffffff }])],
  ['array of string', { type: 'data_array', value: { type: 'string', items: ['a', '', 'c'] } }],
  ['array of bool', { type: 'data_array', value: { type: 'bool', items: [true, false] } }],
  ['array of int8', { type: 'data_array', value: { type: 'int8', items: [-128, 0, 127] } }],
  ['array of uint16', { type: 'data_array', value: { type: 'uint16', items: [0, 65535] } }],
  ['array of int32', { type: 'data_array', value: { type: 'int32', items: [-1, 2147483647] } }],
  ['array of uint64', { type: 'data_array', value: { type: 'uint64', items: [0, 2n ** 64n - 1n] } }],
  ['array of size', { type: 'data_array', value: { type: 'size', items: [1, 2, 3] } }],
  ['array of double', { type: 'data_array', value: { type: 'double', items: [0.5, -1e30] } }],
  ['array of status', { type: 'data_array', value: { type: 'status', items: [0, -46] } }],
  ['array of proc_rank', { type: 'data_array', value: { type: 'proc_rank', items: [0, 1, 0xfffffffe] } }],
  [
    'array of byte_object',
    { type: 'data_array', value: { type: 'byte_object', items: [Buffer.from('x'), Buffer.alloc(0)] } },
  ],
  [
    'array of proc_info',
    {
      type: 'data_array',
      value: { type: 'proc_info', items: [pinfo, { ...pinfo, hostname: null, executable: null }] },
    },
    {
      type: 'data_array',
      value: {
        type: 'proc_info',
        items: [
          { ...pinfo, exitCode: 0 },
          { ...pinfo, hostname: null, executable: null, exitCode: 0 },
        ],
      },
    },
  ],
  [
    'array of envar',
    { type: 'data_array', value: { type: 'envar', items: [{ envar: 'A', value: '1', separator: ';' }] } },
  ],
  ['empty array', { type: 'data_array', value: { type: 'uint32', items: [] } }],
];

describe('the value codec', () => {
  for (const through of [false, true]) {
    const how = through ? 'packed and unpacked by libpmix' : "to libpmix's form and back";
    it.each(CASES)(`keeps %s ${how}`, (_what, value, wire) => {
      expect(trip(value, through)).toEqual((through && wire) || value);
    });
  }

  it('keeps a regex made by libpmix, packed and unpacked', () => {
    const regex = v.regex(fx.server.generateRegex('node-a,node-b,node-c'));
    expect(trip(regex, false)).toEqual(regex);
    expect(trip(regex, true)).toEqual(regex);
  });

  it("refuses values out of their type's range, of the wrong kind, or that libpmix cannot take", () => {
    const bad: [Value, RegExp][] = [
      [{ type: 'uint8', value: 256 }, /out of range for uint8/],
      [{ type: 'int8', value: -129 }, /out of range for int8/],
      [{ type: 'uint32', value: -1 }, /out of range for uint32/],
      [{ type: 'int16', value: 1.5 }, /integer/],
      [{ type: 'uint64', value: 2n ** 64n }, /out of range|uint64/],
      [{ type: 'int64', value: -(2n ** 63n) - 1n }, /out of range|int64/],
      [{ type: 'int32', value: Number.NaN }, /integer|out of range/],
      [{ type: 'string', value: 7 } as unknown as Value, /string/],
      [{ type: 'bool', value: 'yes' } as unknown as Value, /bool/],
      [{ type: 'byte_object', value: 'text' } as unknown as Value, /Buffer|bytes|byte/],
      [{ type: 'proc', value: { nspace: 'x'.repeat(300), rank: 0 } }, /nspace/],
      [{ type: 'nope' } as unknown as Value, /unknown PMIx data type/],
      [
        { type: 'data_array', value: { type: 'data_array', items: [] } } as unknown as Value,
        /unsupported data_array element type/,
      ],
      [v.infos([{ key: 'k'.repeat(600), value: v.bool(true) }]), /key/],
      [{ type: 'unsupported', typeId: 99, value: 'x' }, /unknown PMIx data type/],
    ];
    for (const [value, message] of bad) {
      expect(
        () => trip(value, false),
        JSON.stringify(value, (_k, x) => (typeof x === 'bigint' ? `${x}n` : x)),
      ).toThrow(message);
    }
  });
});
