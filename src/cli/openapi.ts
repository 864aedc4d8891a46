// `dask-pmix openapi`: prints the REST API's OpenAPI document, the one a sidecar serves at
// /openapi.json, without starting a PMIx server (the routes and schemas do not depend on one).
// The docs embed it; clients can be generated from it.
import { buildApi } from '../api/server.js';
import { defaultPolicy } from '../policy/index.js';
import { ResourceManager } from '../rm/index.js';
import { projectVersion } from './version.js';

export async function openapi(): Promise<number> {
  const rm = new ResourceManager({ backends: [], policy: defaultPolicy() });
  const api = await buildApi({ rm, token: 'unused', version: projectVersion(), pmixVersion: 'any' });
  try {
    await api.app.ready();
    process.stdout.write(`${JSON.stringify(api.app.swagger(), null, 2)}\n`);
  } finally {
    api.closeStreams();
    await api.app.close();
  }
  return 0;
}
