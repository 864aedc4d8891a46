// PMI_process_mapping: which node each rank runs on, in the `(vector,(node,nnodes,ppn),...)`
// form MPICH reads in MPIR_build_nodemap. With it a rank knows its node-local peers without a
// round of `hostname[<rank>]` puts and a barrier.
//
// Only the triplet form is emitted: MPICH 4.0.2's parser knows nothing else (the `[...]xN`
// repeat and bare node ids came with 4.1's MPL_rankmap). Both parsers wrap around to the first
// block when the blocks run out before the ranks do, so a periodic placement (round-robin) is
// written as one period, e.g. 4 ranks alternating over 2 hosts is `(vector,(0,2,1))`.

export interface NodeLayout {
  /** Node id of each rank: hosts numbered in order of first appearance, rank 0 on node 0. */
  readonly nodeOfRank: readonly number[];
  /** Host name of each node id. */
  readonly nodes: readonly string[];
  /** Rank's index among the ranks on its node. */
  readonly localRank: readonly number[];
  /** Ranks on each node. */
  readonly localSize: readonly number[];
}

export function nodeLayout(hostOfRank: readonly string[]): NodeLayout {
  const ids = new Map<string, number>();
  const nodes: string[] = [];
  const nodeOfRank: number[] = [];
  const localRank: number[] = [];
  const localSize: number[] = [];
  for (const host of hostOfRank) {
    let id = ids.get(host);
    if (id === undefined) {
      id = nodes.length;
      ids.set(host, id);
      nodes.push(host);
      localSize.push(0);
    }
    nodeOfRank.push(id);
    localRank.push(localSize[id]!);
    localSize[id]!++;
  }
  return { nodeOfRank, nodes, localRank, localSize };
}

interface Block {
  start: number;
  count: number;
  size: number;
}

/** The mapping string for ranks placed on `hostOfRank[rank]`; '' when there are no ranks. */
export function processMapping(hostOfRank: readonly string[]): string {
  const nodeOf = nodeLayout(hostOfRank).nodeOfRank;
  if (nodeOf.length === 0) return '';
  // Runs of consecutive ranks on one node, then runs of equal-sized runs on consecutive nodes.
  const blocks: Block[] = [];
  for (const node of nodeOf) {
    const last = blocks[blocks.length - 1];
    if (last && last.count === 1 && last.start === node) last.size++;
    else blocks.push({ start: node, count: 1, size: 1 });
  }
  const merged: Block[] = [];
  for (const b of blocks) {
    const last = merged[merged.length - 1];
    if (last && last.size === b.size && last.start + last.count === b.start) last.count++;
    else merged.push({ ...b });
  }
  const period = shortestPeriod(merged, nodeOf);
  return `(vector,${period.map((b) => `(${b.start},${b.count},${b.size})`).join(',')})`;
}

/** The shortest prefix of `blocks` that, repeated as MPICH wraps it, yields `nodeOf`. */
function shortestPeriod(blocks: Block[], nodeOf: readonly number[]): Block[] {
  for (let p = 1; p < blocks.length; p++) {
    const prefix = blocks.slice(0, p);
    if (expand(prefix, nodeOf.length).every((n, r) => n === nodeOf[r])) return prefix;
  }
  return blocks;
}

/**
 * What MPICH makes of a block list for `size` ranks: blocks in order, and when they run out,
 * again from the first block whose start node is 0 (MPIR_NODEMAP_populate_ids_from_mapping in
 * 4.0.2, the legacy branch of MPL_rankmap_str_to_array in 5.x).
 */
export function expand(blocks: readonly Block[], size: number): number[] {
  const out: number[] = [];
  const restart = blocks.findIndex((b) => b.start === 0);
  if (blocks.length === 0 || restart < 0) return out;
  let i = 0;
  let lastWrap = -1;
  while (out.length < size) {
    const b = blocks[i]!;
    for (let n = 0; n < b.count && out.length < size; n++) {
      for (let k = 0; k < b.size && out.length < size; k++) out.push(b.start + n);
    }
    if (i + 1 < blocks.length) {
      i++;
    } else {
      if (lastWrap === out.length) break; // a cycle of empty blocks: no progress
      lastWrap = out.length;
      i = restart;
    }
  }
  return out;
}

/** Parses a mapping string back to the node of each rank (for tests and diagnostics). */
export function parseProcessMapping(mapping: string, size: number): number[] {
  const m = /^\(vector((?:,\(\d+,\d+,\d+\))+)\)$/.exec(mapping.replace(/\s+/g, ''));
  if (!m) throw new Error(`not a vector mapping: ${mapping}`);
  const blocks = [...m[1]!.matchAll(/\((\d+),(\d+),(\d+)\)/g)].map((t) => ({
    start: Number(t[1]),
    count: Number(t[2]),
    size: Number(t[3]),
  }));
  return expand(blocks, size);
}
