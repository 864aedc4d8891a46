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
import { type FixtureJob, PmiRmFixture } from './helpers/rm-fixture.js';
import { chunks, mutate, pmi1Transcript, pmi2Transcript, type Rng, rng, SEED } from './helpers/transcripts.js';
import { parse1, WireClient } from './helpers/wire-client.js';

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
            if (!(e instanceof PmiError))
              throw new Error(`seed ${SEED} iter ${iter}: ${String(e)} on ${JSON.stringify(fr)}`);
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
        if (
          line.startsWith('mcmd') ||
          /^(nprocs|execname|totspawns|spawnssofar|argcnt|preput_num|info_num|endcmd)/.test(line)
        )
          continue;
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
    const text = mutate(
      r,
      r.next() < 0.5
        ? pmi1Transcript(j.pmiIds[rank]!, j.job.namespace, rank)
        : pmi2Transcript(j.pmiIds[rank]!, j.job.namespace, rank),
    );
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
