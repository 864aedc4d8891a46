// Loads the native addon. Kept separate so that code that only needs types never loads libpmix.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Info, Proc, Value } from './values.js';

export type UpcallDispatcher = (name: string, args: unknown, done: (status?: number, result?: unknown) => void) => void;

export interface NativeBinding {
  init(options: { info: Info[]; upcalls: string[]; immediate?: string[]; handler: UpcallDispatcher }): void;
  /** Resolves once libpmix is finalized; runs off the JavaScript thread. */
  finalize(): Promise<void>;
  isInitialized(): boolean;
  registerNspace(nspace: string, nlocalprocs: number, info: Info[]): Promise<void>;
  deregisterNspace(nspace: string): Promise<void>;
  registerClient(proc: Proc, uid: number, gid: number): Promise<void>;
  deregisterClient(proc: Proc): Promise<void>;
  setupFork(proc: Proc): Record<string, string>;
  dmodexRequest(proc: Proc): Promise<Buffer>;
  defineProcessSet(name: string, members: Proc[]): Promise<void>;
  deleteProcessSet(name: string): Promise<void>;
  notifyEvent(status: number, source: Proc, range: number, info: Info[]): Promise<void>;
  generateRegex(input: string): Buffer;
  generatePpn(input: string): Buffer;
  version(): string;
  errorString(status: number): string;
  upcallNames(): string[];
  /** A no-op through libpmix's progress thread; waitingMs > 0 while the previous one is unanswered. */
  progressProbe(): { waitingMs: number; lastRoundTripMs: number };
  /** Shuts down still-blocking connections on libpmix's listener from peer ports not in `keep`. */
  closeStrangers(port: number, keep: number[]): number;
  /** A value to libpmix's form and back, packed and unpacked by libpmix in between if asked (tests). */
  valueRoundTrip(value: Value, throughLibpmix?: boolean): Value;
  /** Relays a duplicate of the peer socket `fd` to libpmix at 127.0.0.1:port after writing `first`; the local port. */
  relayStart(fd: number, port: number, first: Buffer): number;
  /** Local ports of the relays' connections to libpmix. */
  relayPorts(): number[];
  relayCloseAll(): void;
  /** _exit(code): for a shutdown that libpmix's finalize would not let end. */
  exitNow(code: number): never;
  constants: { keys: Record<string, string>; ints: Record<string, number>; headerVersion: string };
}

/** The repository root: the nearest directory above this file that holds package.json. */
export function projectRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || existsSync(join(dir, 'CMakeLists.txt'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('cannot find the dask-pmix project root');
    dir = up;
  }
  return dir;
}

/**
 * A data file of the Python package dask_pmix (its VERSION, the dashboard page): python/dask_pmix/
 * in a checkout; in an installed wheel the sidecar is dask_pmix/_sidecar, so one level up.
 */
export function pythonPackageFile(...parts: string[]): string {
  const root = projectRoot();
  const inCheckout = join(root, 'python', 'dask_pmix', ...parts);
  return existsSync(inCheckout) ? inCheckout : join(root, '..', ...parts);
}

let binding: NativeBinding | undefined;

export function loadNative(): NativeBinding {
  if (!binding) {
    const path = join(projectRoot(), 'native', 'build', 'Release', 'dask_pmix_native.node');
    if (!existsSync(path)) {
      throw new Error(`the native addon is not built (${path}); run scripts/setup.sh`);
    }
    binding = createRequire(import.meta.url)(path) as NativeBinding;
  }
  return binding;
}
