// Fuzzing the PMI server: random bytes and mutated real transcripts, first through the framer
// and parsers alone, then over real sockets against the real core with well-behaved members in
// the same job and in a concurrent job. What must hold: nothing but PmiError is ever thrown,
// buffering stays bounded, the server survives, and no job is left stuck: once every
// connection is gone the job has ended and been released, and the good members' pending
// requests all got an answer (or their connection closed).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PmiError } from '../../src/pmi/errors.js';
import { parsePmi1Line, parsePmi1SpawnBlock } from '../../src/pmi/pmi1-codec.js';
import { parsePmi2Body } from '../../src/pmi/pmi2-codec.js';
import { PMI1_MAX_BLOCK, WireFramer } from '../../src/pmi/wire-framer.js';
import { frame2, parse1, WireClient } from './helpers/wire-client.js';
import { PmiRmFixture, type FixtureJob } from './helpers/rm-fixture.js';

/** Small deterministic PRNG (mulberry32), so a failing seed can be replayed. */
function rng(seed: number) {
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
type Rng = ReturnType<typeof rng>;

const SEED = Number(process.env.PMI_FUZZ_SEED ?? Date.now() % 1_000_000);

/** What MPICH 4.0.2 sends during MPI_Init + Allreduce + Finalize (captured), as a template. */
function pmi1Transcript(id: string, kvs: string, rank: number): string {
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
  ].map((l) => `${l}\n`).join('');
}

/** What a PMI-2 client sends, as a template. */
function pmi2Transcript(id: string, kvs: string, rank: number): string {
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

const NASTY = ['\n', ';', '=', ' ', '\0', '\r', 'cmd=', 'mcmd=spawn\n', 'endcmd\n', '999999', '    12', 'x'.repeat(1500), '\xff\xfe'];

/** Damages a byte string in a few random ways. */
function mutate(r: Rng, s: string): string {
  let out = s;
  const n = 1 + r.int(4);
  for (let i = 0; i < n; i++) {
    const at = r.int(out.length + 1);
    switch (r.int(8)) {
      case 0: // flip a byte
        out = out.slice(0, at) + String.fromCharCode(r.int(256)) + out.slice(at + 1);
        break;
      case 1: // insert random bytes
        out = out.slice(0, at) + Array.from({ length: 1 + r.int(20) }, () => String.fromCharCode(r.int(256))).join('') + out.slice(at);
        break;
      case 2: // delete a range
        out = out.slice(0, at) + out.slice(at + r.int(40));
        break;
      case 3: // insert something that means something to a parser
        out = out.slice(0, at) + r.pick(NASTY) + out.slice(at);
        break;
      case 4: { // duplicate a line
        const lines = out.split('\n');
        const k = r.int(lines.length);
        lines.splice(k, 0, lines[k] ?? '');
        out = lines.join('\n');
        break;
      }
      case 5: { // swap two lines
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

function chunks(r: Rng, s: string): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < s.length) {
    const n = 1 + r.int(r.next() < 0.3 ? 8 : 300);
    out.push(s.slice(i, i + n));
    i += n;
  }
  return out;
}

describe('parser fuzz', () => {
  it(`survives random and mutated input (seed ${SEED})`, () => {
    const r = rng(SEED);
    const templates = [pmi1Transcript(101, 'kvs_1', 0), pmi2Transcript(102, 'kvs_1', 1)];
    let frames = 0;
    for (let iter = 0; iter < 3000; iter++) {
      const input =
        iter % 4 === 0
          ? Array.from({ length: r.int(3000) }, () => String.fromCharCode(r.int(256))).join('')
          : mutate(r, r.pick(templates));
      const f = new WireFramer();
      let dead = false;
      for (const c of chunks(r, input)) {
        for (const fr of f.push(Buffer.from(c, 'latin1'))) {
          expect(dead, `frame after a fatal error (seed ${SEED}, iter ${iter})`).toBe(false);
          frames++;
          try {
            if (fr.kind === 'line') parsePmi1Line(fr.text);
            else if (fr.kind === 'pmi2') parsePmi2Body(fr.body);
            else if (fr.kind === 'block') parsePmi1SpawnBlock(fr.lines);
            else if (fr.fatal) dead = true;
          } catch (e) {
            if (!(e instanceof PmiError)) throw new Error(`seed ${SEED} iter ${iter}: ${String(e)} on ${JSON.stringify(fr)}`);
          }
        }
        expect(f.pending).toBeLessThanOrEqual(PMI1_MAX_BLOCK + 16);
      }
    }
    expect(frames).toBeGreaterThan(3000);
  });
});

describe('state machine fuzz over sockets', () => {
  let fx: PmiRmFixture;
  beforeAll(async () => {
    fx = await PmiRmFixture.start({ releaseGraceMs: 300 });
  });
  afterAll(() => fx.stop());

  /** A member that follows the transcript and stops at the first error, as MPICH would. */
  async function goodPmi1(j: FixtureJob, rank: number): Promise<'finalized' | 'error' | 'closed'> {
    const c = await WireClient.connect(fx.port);
    try {
      for (const line of pmi1Transcript(j.pmiIds[rank]!, j.job.namespace, rank).split('\n').filter(Boolean)) {
        if (line.startsWith('mcmd') || /^(nprocs|execname|totspawns|spawnssofar|argcnt|preput_num|info_num|endcmd)/.test(line)) continue;
        c.send(`${line}\n`);
        const reply = parse1(await c.line(10_000));
        if (line.startsWith('cmd=initack')) for (let k = 0; k < 3; k++) await c.line();
        if (reply.rc !== '0') return 'error';
      }
      return 'finalized';
    } catch {
      return 'closed';
    } finally {
      c.close();
    }
  }

  async function fuzzer(r: Rng, j: FixtureJob, rank: number): Promise<void> {
    const c = await WireClient.connect(fx.port);
    const text = mutate(r, r.next() < 0.5 ? pmi1Transcript(j.pmiIds[rank]!, j.job.namespace, rank) : pmi2Transcript(j.pmiIds[rank]!, j.job.namespace, rank));
    for (const piece of chunks(r, text)) {
      if (c.isClosed) break;
      c.send(piece);
      if (r.next() < 0.2) await new Promise((res) => setTimeout(res, r.int(5)));
    }
    // Sometimes hang around a little (in a barrier, say) before going away.
    await new Promise((res) => setTimeout(res, r.int(30)));
    c.close();
  }

  it(`leaves no job stuck and no other job disturbed (seed ${SEED})`, async () => {
    const r = rng(SEED + 1);
    for (let round = 0; round < 25; round++) {
      // A fuzzed job (two good members and a fuzzer) next to a control job of two good members.
      // A fuzzer that never says who it is leaves its member missing: the wiring timeout ends that.
      const fuzzed = await fx.job(3, { wiringTimeoutSeconds: 0.5 });
      const control = await fx.job(2);
      const results = await Promise.all([
        goodPmi1(fuzzed, 0),
        goodPmi1(fuzzed, 1),
        fuzzer(r, fuzzed, 2),
        goodPmi1(control, 0),
        goodPmi1(control, 1),
      ]);
      const why = `seed ${SEED} round ${round}: ${JSON.stringify(results)} ${fx.rm.getJob(fuzzed.job.id).error ?? ''}`;
      expect(results.slice(3), why).toEqual(['finalized', 'finalized']);
      expect(fx.state(control.job.id), why).toBe('completed');
      // Every connection of the fuzzed job is gone, so it has ended, whatever the fuzzer did.
      const j = await fx.waitFor(fuzzed.job.id, ['completed', 'failed', 'aborted'], 5000);
      expect(['completed', 'failed', 'aborted']).toContain(j.state);
      await fx.released(fuzzed.job.id);
    }
    await expect.poll(() => fx.backend.listener.connectionCount, { timeout: 2000 }).toBe(0);
    expect(fx.rm.activeJobs()).toEqual([]);
    expect(fx.errors).toEqual([]);
  });
});
