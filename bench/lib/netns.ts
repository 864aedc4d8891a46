// Hosts simulated by network namespaces: a bridge in the root namespace holds the server's
// address, and each "host" is a namespace with a veth pair whose inner end is eth0 on the same
// subnet. Names come from the caller (derived from its pid), and remove() takes down only those.
import { execFileSync } from 'node:child_process';

export interface NetnsHost {
  ns: string;
  host: string;
  ip: string;
}

export interface NetnsNetwork {
  bridge: string;
  /** The bridge's address: where servers in the root namespace listen for the hosts. */
  serverIp: string;
  hosts: NetnsHost[];
}

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: 'pipe' });

/**
 * Makes the bridge and the hosts. Returns false, having made nothing, where no bridge can be
 * made (not root, no iproute2); throws if a later step fails.
 */
export function makeNetwork(net: NetnsNetwork, prefixLength = 24): boolean {
  try {
    ip('link', 'add', net.bridge, 'type', 'bridge');
  } catch {
    return false;
  }
  ip('addr', 'add', `${net.serverIp}/${prefixLength}`, 'dev', net.bridge);
  ip('link', 'set', net.bridge, 'up');
  for (const [i, h] of net.hosts.entries()) {
    const veth = `v${net.bridge.replace(/^br-/, '')}${i}`;
    ip('netns', 'add', h.ns);
    ip('link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', h.ns);
    ip('link', 'set', veth, 'master', net.bridge);
    ip('link', 'set', veth, 'up');
    ip('netns', 'exec', h.ns, 'ip', 'addr', 'add', `${h.ip}/${prefixLength}`, 'dev', 'eth0');
    ip('netns', 'exec', h.ns, 'ip', 'link', 'set', 'eth0', 'up');
    ip('netns', 'exec', h.ns, 'ip', 'link', 'set', 'lo', 'up');
  }
  return true;
}

/** Removes the hosts and the bridge (their veths go with them); what is not there is skipped. */
export function removeNetwork(net: NetnsNetwork): void {
  for (const h of net.hosts) {
    try {
      ip('netns', 'del', h.ns);
    } catch {
      /* not there */
    }
  }
  try {
    ip('link', 'del', net.bridge);
  } catch {
    /* not there */
  }
}
