// An in-process sidecar for the tests of a file: real REST, PMIx and PMI listeners, on a temporary
// directory of its own that stop() removes.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NetnsNetwork } from '../../bench/lib/netns.js';
import { Sidecar, type SidecarOptions } from '../../src/service/sidecar.js';
import { restClient } from './http.js';

export class SidecarFixture {
  private constructor(
    readonly sidecar: Sidecar,
    readonly api: ReturnType<typeof restClient>,
    private readonly workdir: string,
  ) {}

  /** Starts a sidecar on port 0, version 'test', in a fresh temporary directory named `dask-pmix-<name>-*`. */
  static async start(
    name: string,
    options: Omit<SidecarOptions, 'port' | 'tmpdir' | 'version'> = {},
  ): Promise<SidecarFixture> {
    const workdir = mkdtempSync(join(tmpdir(), `dask-pmix-${name}-`));
    try {
      const sidecar = await Sidecar.start({ port: 0, tmpdir: workdir, version: 'test', ...options });
      return new SidecarFixture(sidecar, restClient(sidecar.url), workdir);
    } catch (e) {
      rmSync(workdir, { recursive: true, force: true });
      throw e;
    }
  }

  /**
   * A sidecar for ranks inside the network namespaces of `net` (a /24): PMIx remote connections
   * and the PMI listener on its bridge.
   */
  static onBridge(
    name: string,
    net: NetnsNetwork,
    options: Omit<SidecarOptions, 'port' | 'tmpdir' | 'version'> = {},
  ): Promise<SidecarFixture> {
    return SidecarFixture.start(name, {
      remoteConnections: true,
      tcpIfInclude: `${net.serverIp.replace(/\.\d+$/, '.0')}/24`,
      pmi: { host: net.serverIp },
      ...options,
    });
  }

  async stop(): Promise<void> {
    await this.sidecar.stop('tests done');
    rmSync(this.workdir, { recursive: true, force: true });
  }
}
