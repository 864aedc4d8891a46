// A REST API over a core with a recording backend, listening on a real port.
import { type Api, buildApi } from '../../src/api/server.js';
import { defaultPolicy } from '../../src/policy/index.js';
import { ResourceManager } from '../../src/rm/index.js';
import { restClient } from '../helpers/http.js';
import { RecordingBackend } from '../rm/fake-backend.js';

export interface ApiFixture {
  rm: ResourceManager;
  backend: RecordingBackend;
  api: Api;
  url: string;
  call: ReturnType<typeof restClient>;
  anon: ReturnType<typeof restClient>;
  close(): Promise<void>;
}

export const TOKEN = 'sekret-token';

/** A registration body as the scheduler plugin sends it: the worker's pid, uid and gid included. */
export function worker(id: string, host = 'h1', extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { id, host, pid: 4242, uid: process.getuid?.() ?? 1000, gid: process.getgid?.() ?? 1000, ...extra };
}

export async function apiFixture(
  opts: { token?: string; maxActiveJobs?: number; openReads?: boolean; maxWaitingJobs?: number } = {},
): Promise<ApiFixture> {
  const backend = new RecordingBackend(['openmpi', 'mpich']);
  const rm = new ResourceManager({
    backends: [backend],
    policy: defaultPolicy({ maxActiveJobs: opts.maxActiveJobs ?? 64, releaseGraceMs: 100 }),
    ...(opts.maxWaitingJobs !== undefined ? { maxWaitingJobs: opts.maxWaitingJobs } : {}),
  });
  const token = opts.token === undefined ? TOKEN : opts.token || undefined;
  const api = await buildApi({
    rm,
    ...(token ? { token } : {}),
    ...(opts.openReads ? { openReads: true } : {}),
    version: 'test',
    pmixVersion: '5.0.11',
  });
  await api.app.listen({ host: '127.0.0.1', port: 0 });
  const addr = api.app.server.address();
  const url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}`;
  return {
    rm,
    backend,
    api,
    url,
    call: restClient(url, token),
    anon: restClient(url),
    async close() {
      api.closeStreams();
      await api.app.close();
    },
  };
}
