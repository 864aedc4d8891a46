// Gives the C allocator's free pages back to the kernel after jobs ran. glibc keeps what libpmix,
// libuv's pool and the addon free in one arena per thread, and returns pages only from an arena's
// top: after a burst (a restarted cluster's new pool epoch, a REST flood) the sidecar's RSS stays
// tens of MB above what is in use (bench/sidecar_memory.py: 18-23 MB free in the arenas against
// 11-20 MB in use). malloc_trim(0) walks every arena under its lock, a few milliseconds; once per
// interval with jobs in it costs nothing a job can see.

/** Calls `trim` every `everyMs` in which `activity` changed; returns the function that stops it. */
export function trimAfterActivity(activity: () => number, trim: () => unknown, everyMs = 30_000): () => void {
  let seen = activity();
  const timer = setInterval(() => {
    const now = activity();
    if (now === seen) return;
    seen = now;
    trim();
  }, everyMs);
  timer.unref();
  return () => clearInterval(timer);
}
