// Which workers a selector picks, and in what rank order.
//
// pack: fill hosts one after the other, hosts with the most matching workers first, so a job
// spans as few hosts as it can and its ranks are contiguous per host. spread: round-robin over
// hosts (by name), so consecutive ranks land on different hosts. Within a host, workers keep
// their registration order, which makes the choice deterministic.
import { RmError } from '../rm/errors.js';
import type { Selector, Worker } from '../rm/types.js';

export function matches(w: Worker, sel: Selector): boolean {
  if (sel.hosts && sel.hosts.length > 0 && !sel.hosts.includes(w.host)) return false;
  for (const t of sel.tags ?? []) if (!w.tags.includes(t)) return false;
  for (const [name, min] of Object.entries(sel.resources ?? {})) {
    if ((w.resources[name] ?? 0) < min) return false;
  }
  return true;
}

function describe(sel: Selector): string {
  const parts: string[] = [];
  if (sel.tags?.length) parts.push(`tags ${sel.tags.join(',')}`);
  if (sel.resources && Object.keys(sel.resources).length) {
    parts.push(
      `resources ${Object.entries(sel.resources)
        .map(([k, v]) => `${k}>=${v}`)
        .join(',')}`,
    );
  }
  if (sel.hosts?.length) parts.push(`hosts ${sel.hosts.join(',')}`);
  return parts.length ? ` with ${parts.join(' and ')}` : '';
}

/** Picks `sel.count` of `candidates` (available workers, in registration order). */
export function selectWorkers(sel: Selector, candidates: readonly Worker[]): Worker[] {
  if (!Number.isInteger(sel.count) || sel.count < 1)
    throw new RmError('bad_request', 'selector.count must be a positive integer');
  const fit = candidates.filter((w) => matches(w, sel));
  if (fit.length < sel.count) {
    throw new RmError(
      'unprocessable',
      `the selector needs ${sel.count} available workers${describe(sel)}, but only ${fit.length} match`,
    );
  }
  const byHost = new Map<string, Worker[]>();
  for (const w of fit) {
    let list = byHost.get(w.host);
    if (!list) byHost.set(w.host, (list = []));
    list.push(w);
  }
  if ((sel.placement ?? 'pack') === 'pack') {
    const hosts = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]));
    return hosts.flatMap(([, ws]) => ws).slice(0, sel.count);
  }
  const queues = [...byHost.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([, ws]) => [...ws]);
  const out: Worker[] = [];
  while (out.length < sel.count) {
    for (const q of queues) {
      const w = q.shift();
      if (w && out.length < sel.count) out.push(w);
    }
  }
  return out;
}
