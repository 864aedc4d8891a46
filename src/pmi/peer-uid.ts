// Whose a PMI connection is, and whether it may bind a rank registered as a given uid (issue 31).
//
// PMI_ID is a bearer credential: whoever holds a member's environment can present it. On this
// host the kernel also says who is connecting, the uid owning the peer's socket: a UNIX socket's
// SO_PEERCRED, or for TCP the other end's entry in the kernel's socket table (the addon's
// peerUid, the lookup the PMIx gate makes). A bind from this host is held to the uid registered
// for the member's worker, by the rule PMIx admission (src/pmix/admission.ts) holds a client to:
// a socket of another uid is refused, root's excepted (root may start ranks as any user).
//
// A TCP peer's owner is looked up when its connection is accepted (connection.ts): once the peer
// has closed its socket the kernel no longer says (it reports a closed socket as uid 0 and
// forgets a reset one). A peer that was gone by then (it sent the credential and closed, or
// reset, before the sidecar accepted it) cannot be told by its owner: its bind is refused too. It
// would not read the reply, and a bind accepted for it would end at once as a lost member,
// failing the job. A TCP peer elsewhere has no uid here: its bind rests on the credential alone
// (128 random bits, one connection per rank).
import type { Socket } from 'node:net';
import { networkInterfaces } from 'node:os';
import { loadNative } from '../pmix/native.js';
import { PmiError } from './errors.js';

/**
 * The peer of a connection: the uid owning its socket on this host; 'closed' when it is (or
 * was) on this host but its socket is gone; 'remote' when it is elsewhere; 'unknown' when the
 * kernel could not be asked.
 */
export type PeerUid = number | 'closed' | 'remote' | 'unknown';

/** A TCP connection's two ends, as taken when it was accepted (Node forgets them on a reset). */
export interface TcpEnds {
  readonly localAddress: string;
  readonly localPort: number;
  readonly remoteAddress: string;
  readonly remotePort: number;
}

/** The ends of an accepted TCP socket; undefined when it is no longer connected. */
export function tcpEnds(socket: Socket): TcpEnds | undefined {
  const { localAddress, localPort, remoteAddress, remotePort } = socket;
  return localAddress && localPort && remoteAddress && remotePort
    ? { localAddress, localPort, remoteAddress, remotePort }
    : undefined;
}

/** Whether `address` is one of this host's (loopback included). */
export function isThisHost(address: string): boolean {
  const a = address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address;
  if (a === '::1' || /^127\./.test(a)) return true;
  return Object.values(networkInterfaces()).some((list) => list?.some((i) => i.address === a));
}

/**
 * The uid owning the peer's socket of a connection on the UNIX socket (`fd`, undefined once
 * closed) or over TCP (its ends, undefined if it was no longer connected when accepted). One
 * netlink request for TCP (the PMIx gate's lookup), one getsockopt for the UNIX socket.
 */
export function peerUidOf(
  conn: { via: 'unix'; fd: number | undefined } | { via: 'tcp'; ends: TcpEnds | undefined },
): PeerUid {
  const native = loadNative();
  if (conn.via === 'unix') {
    if (conn.fd === undefined || conn.fd < 0) return 'closed';
    const uid = native.unixPeerUid(conn.fd);
    return uid >= 0 ? uid : 'unknown';
  }
  const e = conn.ends;
  if (!e) return 'closed';
  const uid = native.peerUid(e.localAddress, e.localPort, e.remoteAddress, e.remotePort);
  if (uid >= 0) return uid;
  if (uid === -2) return 'closed';
  // No such socket: elsewhere, or on this host and reset since (then the kernel has forgotten it).
  if (uid === -1) return isThisHost(e.remoteAddress) ? 'closed' : 'remote';
  return 'unknown';
}

/**
 * Why a connection of `peer` may not bind a rank whose worker is registered as `registeredUid`,
 * or undefined if it may. A peer elsewhere, or one the kernel could not be asked about, is not
 * held to a uid (as before this check).
 */
export function peerUidRefusal(peer: PeerUid, registeredUid: number): string | undefined {
  if (peer === 'remote' || peer === 'unknown') return undefined;
  if (peer === 'closed')
    return 'the connection closed before the server accepted it, so whose it was cannot be told: a rank binds on a connection that waits for the reply';
  if (peer === 0 || peer === registeredUid) return undefined;
  return `a connection of uid ${peer} may not bind this rank: its worker runs as uid ${registeredUid}`;
}

/** Throws the refusal as a PmiError (the bind's rc=-1 reply), if there is one. */
export function checkPeerUid(peer: PeerUid, registeredUid: number): void {
  const why = peerUidRefusal(peer, registeredUid);
  if (why !== undefined) throw new PmiError(why);
}
