// TCP keepalive with a user timeout, for the sidecar's long-lived sockets (the PMIx clients'
// connections the gate hands to libpmix, and the PMI server's): a host lost without a FIN (power,
// cable, a network partition) is otherwise never noticed, and its members' job and namespace are
// held for ever. Node sets SO_KEEPALIVE and its idle time only; the interval, the count and
// TCP_USER_TIMEOUT (which also covers data sent and never acknowledged) are the addon's.
import type { Socket } from 'node:net';
import { loadNative } from './native.js';

export interface KeepAlive {
  /** Silence before the first probe. */
  idleMs: number;
  /** Between probes. */
  intervalMs: number;
  /** Unanswered probes after which the connection is dropped. */
  count: number;
  /** TCP_USER_TIMEOUT: how long sent data may stay unacknowledged before the connection is dropped. */
  userTimeoutMs: number;
}

/** A lost host is noticed within about a minute; a living, idle one costs a probe every 30 s. */
export const KEEPALIVE: Readonly<KeepAlive> = { idleMs: 30_000, intervalMs: 10_000, count: 3, userTimeoutMs: 60_000 };

/** Sets keepalive on a TCP socket, given as a Node socket or a file descriptor. UNIX sockets are left alone. */
export function setKeepAlive(socket: Socket | number, ka: Readonly<KeepAlive> = KEEPALIVE): void {
  let fd = socket;
  if (typeof socket !== 'number') {
    if (!socket.remoteAddress) return; // a UNIX socket
    fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd ?? -1;
  }
  if ((fd as number) < 0) return;
  loadNative().tcpKeepAlive(fd as number, ka.idleMs, ka.intervalMs, ka.count, ka.userTimeoutMs);
}
