// Loads the native addon. Kept separate so that code that only needs types never loads libpmix.

import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
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
  /** A value through the addon's codec (and, with throughLibpmix, packed and unpacked by libpmix): for the codec's tests. */
  valueRoundTrip(value: Value, throughLibpmix: boolean): Value;
  errorString(status: number): string;
  upcallNames(): string[];
  /** A no-op through libpmix's progress thread; waitingMs > 0 while the previous one is unanswered. */
  progressProbe(): { waitingMs: number; lastRoundTripMs: number };
  /** Replaces libpmix's TCP listener on 127.0.0.1:port by a UNIX socket at `path` (its directory 0700). */
  secureListener(port: number, path: string): void;
  /** Gives libpmix a duplicate of the admitted peer socket `fd`, whose handshake is `first`; `tag` names it for closePeers. */
  handOff(fd: number, first: Buffer, tag: string): void;
  /** Shuts down the handed-off connections of `tag` still open (unless shut is false) and forgets them; how many. */
  closePeers(tag: string, shut?: boolean): number;
  handoffStats(): { handedOff: number; relayed: number; refused: number; dropped: number };
  handoffCloseAll(): void;
  /** Shuts down connections to libpmix's listener that did not come from the gate and whose handshake it is reading. */
  closeStrangers(): number;
  /** SO_KEEPALIVE with these timings, and TCP_USER_TIMEOUT, on a TCP socket. */
  tcpKeepAlive(fd: number, idleMs: number, intervalMs: number, count: number, userTimeoutMs: number): void;
  /**
   * The uid owning the other end of this TCP connection if it is a socket of this host; -1 if no
   * such socket is here, -2 if it is but closed (no process holds it; the kernel says uid 0), -3 if
   * the kernel could not be asked.
   */
  peerUid(localAddress: string, localPort: number, remoteAddress: string, remotePort: number): number;
  /** The uid of the process that connected this UNIX socket (SO_PEERCRED), else -1. */
  unixPeerUid(fd: number): number;
  /** The C allocator's bytes in use (every arena, and chunks mmapped alone), free in its arenas, and taken by them. */
  allocatorStats(): { inUseBytes: number; freeBytes: number; arenaBytes: number; mmappedBytes: number };
  /** malloc_trim(0): the arenas' free pages back to the kernel; whether any were. */
  allocatorTrim(): boolean;
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
