// An Open MPI job of fresh workers on a running sidecar, over REST, with each member's env.
import { expect } from 'vitest';
import type { restClient } from './http.js';

export interface JobWithEnvs {
  id: string;
  namespace: string;
  envs: Record<string, string>[];
}

let next = 0;

/** Registers n new workers on `host`, creates an Open MPI job of them, fetches every member's env. */
export async function openmpiJob(api: ReturnType<typeof restClient>, n: number, host: string): Promise<JobWithEnvs> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = `tcp://10.250.0.1:${next++}`;
    const r = await api('POST', '/v1/workers', {
      id,
      host,
      pid: process.pid,
      uid: process.getuid!(),
      gid: process.getgid!(),
    });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    ids.push(id);
  }
  const r = await api('POST', '/v1/jobs', { impl: 'openmpi', members: ids });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  const envs: Record<string, string>[] = [];
  for (const id of ids) envs.push((await api('GET', `/v1/jobs/${r.body.id}/env/${encodeURIComponent(id)}`)).body.env);
  return { id: r.body.id, namespace: r.body.namespace, envs };
}
