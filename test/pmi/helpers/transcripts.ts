// What the PMI fuzz tests feed servers and codecs: a deterministic PRNG, transcripts of real
// MPICH clients as templates, ways to damage them, and random chunkings.
import { frame2 } from './wire-client.js';

/** Small deterministic PRNG (mulberry32), so a failing seed can be replayed. */
export function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n: number) => Math.floor(next() * n),
    pick: <T>(xs: readonly T[]): T => xs[Math.floor(next() * xs.length)]!,
  };
}
export type Rng = ReturnType<typeof rng>;

export const SEED = Number(process.env.PMI_FUZZ_SEED ?? Date.now() % 1_000_000);

/** What MPICH 4.0.2 sends during MPI_Init + Allreduce + Finalize (captured), as a template. */
export function pmi1Transcript(id: string | number, kvs: string, rank: number): string {
  return [
    `cmd=initack pmiid=${id}`,
    'cmd=init pmi_version=1 pmi_subversion=1',
    'cmd=get_maxes',
    'cmd=get_appnum',
    'cmd=get_my_kvsname',
    `cmd=get kvsname=${kvs} key=PMI_process_mapping`,
    `cmd=put kvsname=${kvs} key=-bcast-1-${rank} value=2F6465762F73686D2F6D706963685F736861725F746D70`,
    'cmd=barrier_in',
    `cmd=get kvsname=${kvs} key=-bcast-1-0`,
    `cmd=put kvsname=${kvs} key=-allgather-shm-1-${rank} value=20FA3ED34F6C445CCB2000637577CC2B3200F8D74F0000`,
    'cmd=barrier_in',
    `cmd=publish_name service=svc-${kvs}-${rank} port=tag#0$connentry#00AB$`,
    `cmd=lookup_name service=svc-${kvs}-${rank}`,
    'cmd=barrier_in',
    'mcmd=spawn\nnprocs=1\nexecname=/bin/true\ntotspawns=1\nspawnssofar=1\nargcnt=0\npreput_num=0\ninfo_num=0\nendcmd',
    'cmd=finalize',
  ]
    .map((l) => `${l}\n`)
    .join('');
}

/** What a PMI-2 client sends, as a template. */
export function pmi2Transcript(id: string | number, kvs: string, rank: number): string {
  return [
    'cmd=init pmi_version=2 pmi_subversion=0\n',
    frame2(`cmd=fullinit;pmirank=${id};`),
    frame2('cmd=job-getid;thrid=0x1;'),
    frame2('cmd=info-getjobattr;key=PMI_process_mapping;'),
    frame2(`cmd=kvs-put;key=card-${rank};value=AB12;`),
    frame2('cmd=info-putnodeattr;key=shm;value=/dev/shm/x;'),
    frame2('cmd=info-getnodeattr;key=shm;wait=TRUE;'),
    frame2('cmd=kvs-fence;'),
    frame2(`cmd=kvs-get;jobid=${kvs};srcid=0;key=card-0;`),
    frame2(`cmd=name-publish;name=n-${kvs}-${rank};port=p;`),
    frame2('cmd=kvs-fence;'),
    frame2('cmd=finalize;'),
  ].join('');
}

const NASTY = [
  '\n',
  ';',
  '=',
  ' ',
  '\0',
  '\r',
  'cmd=',
  'mcmd=spawn\n',
  'endcmd\n',
  '999999',
  '    12',
  'x'.repeat(1500),
  '\xff\xfe',
];

/** Damages a byte string in a few random ways. */
export function mutate(r: Rng, s: string): string {
  let out = s;
  const n = 1 + r.int(4);
  for (let i = 0; i < n; i++) {
    const at = r.int(out.length + 1);
    switch (r.int(8)) {
      case 0: // flip a byte
        out = out.slice(0, at) + String.fromCharCode(r.int(256)) + out.slice(at + 1);
        break;
      case 1: // insert random bytes
        out =
          out.slice(0, at) +
          Array.from({ length: 1 + r.int(20) }, () => String.fromCharCode(r.int(256))).join('') +
          out.slice(at);
        break;
      case 2: // delete a range
        out = out.slice(0, at) + out.slice(at + r.int(40));
        break;
      case 3: // insert something that means something to a parser
        out = out.slice(0, at) + r.pick(NASTY) + out.slice(at);
        break;
      case 4: {
        // duplicate a line
        const lines = out.split('\n');
        const k = r.int(lines.length);
        lines.splice(k, 0, lines[k] ?? '');
        out = lines.join('\n');
        break;
      }
      case 5: {
        // swap two lines
        const lines = out.split('\n');
        const a = r.int(lines.length);
        const b = r.int(lines.length);
        [lines[a], lines[b]] = [lines[b]!, lines[a]!];
        out = lines.join('\n');
        break;
      }
      case 6: // truncate
        out = out.slice(0, at);
        break;
      default: // a wrong kvsname or id
        out = out.replace(/kvsname=[^ \n]+/, 'kvsname=someone-else').replace(/pmiid=[0-9a-f]+/, `pmiid=${r.int(1000)}`);
    }
  }
  return out;
}

export function chunks(r: Rng, s: string): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < s.length) {
    const n = 1 + r.int(r.next() < 0.3 ? 8 : 300);
    out.push(s.slice(i, i + n));
    i += n;
  }
  return out;
}
