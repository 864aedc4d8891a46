// The TCP ports a process listens on, from the kernel's tables: its socket inodes
// (/proc/PID/fd) matched against the LISTEN rows of /proc/PID/net/tcp and tcp6.
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

export interface ListeningSocket {
  family: 4 | 6;
  /** The bound address as the kernel shows it (hex, host byte order for IPv4). */
  address: string;
  port: number;
}

export function listeningSockets(pid: number = process.pid): ListeningSocket[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      /* closed meanwhile */
    }
  }
  const out: ListeningSocket[] = [];
  for (const family of [4, 6] as const) {
    const rows = readFileSync(`/proc/${pid}/net/tcp${family === 6 ? '6' : ''}`, 'utf8')
      .trim()
      .split('\n')
      .slice(1);
    for (const row of rows) {
      const f = row.trim().split(/\s+/);
      const [address, port] = f[1]!.split(':') as [string, string];
      if (f[3] === '0A' && inodes.has(f[9]!)) out.push({ family, address, port: parseInt(port, 16) });
    }
  }
  return out;
}

export const tcpListeningPorts = (pid?: number): number[] => listeningSockets(pid).map((s) => s.port);
