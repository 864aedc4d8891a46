// PMIx tools (PMIx_tool_init at the URI every member is handed) against the sidecar: one of the
// sidecar's own uid is served, any other is refused before libpmix sees it, and none of them
// takes the server down (a tool connection crashed libpmix 5.0.11 without a tool upcall).
import { spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bin } from '../helpers/build-clients.js';
import { cleanEnv, describeRanks, startRank } from '../helpers/ranks.js';
import { SidecarFixture } from '../helpers/sidecar-fixture.js';
import { openmpiJob } from '../helpers/sidecar-jobs.js';

const HOST = hostname();
let fx: SidecarFixture;
/** PMIX_SERVER_URI41 as every member gets it. */
let uri: string;

beforeAll(async () => {
  fx = await SidecarFixture.start('tools', { releaseGraceMs: 1000 });
  uri = (await memberEnv()).PMIX_SERVER_URI41!;
});
afterAll(() => fx?.stop());

const tool = (...args: string[]) => startRank(bin('pmix_tool'), [uri, ...args], {}, 30_000);

const memberEnv = async () => (await openmpiJob(fx.api, 1, HOST)).envs[0]!;

/** A one-rank job runs to its end: the server still serves. */
async function serves(): Promise<void> {
  const env = await memberEnv();
  const r = startRank(bin('pmix_client'), ['put-get'], env, 30_000);
  expect(await r.exited, describeRanks([r])).toBe(0);
}

describe('PMIx tools', () => {
  it('serves a tool of its own uid: it connects, gets an identity and finalizes', async () => {
    const t = tool('connect');
    expect(await t.exited, describeRanks([t])).toBe(0);
    expect(t.lines[0]).toMatchObject({ init: true, nspace: expect.stringMatching(/-tool-\d+$/), rank: 0 });
    expect(t.lines).toContainEqual({ finalized: true });
    await serves();
  });

  it('serves a tool that brings its own identity', async () => {
    const t = tool('given', 'my-debugger');
    expect(await t.exited, describeRanks([t])).toBe(0);
    expect(t.lines[0]).toMatchObject({ init: true, nspace: 'my-debugger', rank: 0 });
    await serves();
  });

  it('refuses a tool of another uid before libpmix sees it, and goes on serving', async () => {
    const refused = fx.sidecar.pmix.gateStats.refused;
    const child = spawn(bin('pmix_tool'), [uri, 'connect'], {
      env: cleanEnv({}),
      uid: 65534,
      gid: 65534,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    expect(await new Promise((r) => child.on('close', r)), out).toBe(2);
    expect(out).toMatch(/"error":"init"/);
    expect(fx.sidecar.pmix.gateStats.refused).toBe(refused + 1);
    await serves();
  });

  it('answers a tool query (namespaces, pset names), and goes on serving', async () => {
    const t = tool('query');
    expect(await t.exited, describeRanks([t])).toBe(0);
    const active = (await fx.api('GET', '/v1/jobs')).body.jobs.filter((j: { state: string }) =>
      ['pending', 'wiring', 'running'].includes(j.state),
    );
    expect(t.lines).toContainEqual(
      expect.objectContaining({
        query: 0,
        namespaces: active.map((j: { namespace: string }) => j.namespace).join(','),
      }),
    );
    await serves();
  });
});
