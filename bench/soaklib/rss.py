"""The sidecar's memory over the soak: samples (job index, RSS, and from its /metrics the V8 heap's
size and use and the C allocator's bytes in use) per sidecar process, and a least-squares line
through each process's samples after its warm-up.

RSS is what V8 holds for its heap plus everything else (libpmix, the addon, allocator arenas).
Neither part of it tells a leak from memory that was freed and kept:
- V8 sizes its heap by its own heuristics, well above what is live, and changes that size in steps
  of tens of MB (measured, idle machine: over 1,000 MPICH fork jobs the heap's size swung between
  31 and 65 MB, and RSS with it between 109 and 144 MB).
- glibc keeps freed chunks in per-thread arenas: after a burst (a restarted cluster's new epoch, a
  REST flood) RSS minus the heap's size stays higher although every byte was freed. Over a 1,000-job
  soak that grew 22.5 MB per 1,000 jobs while the bytes in use (mallinfo2) grew by what libpmix
  keeps per epoch, 0.5 MB per client.restart() (bench/sidecar_memory.py --restart-every).
So what is checked is what a leak grows: the C allocator's bytes in use (a native leak, such as
libpmix keeping a copy of every in-process job's endpoint data, +48 KB per job) and V8's heap in
use (a JavaScript leak, such as a reaction per event on a stream's promise, +8 KB per job). RSS
and RSS minus the heap's size are reported beside them."""

from __future__ import annotations

import statistics


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """slope, intercept, and the slope's standard error."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    resid = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    se = (resid / (n - 2) / sxx) ** 0.5 if n > 2 else float("inf")
    return slope, intercept, se


# A line through a stretch shorter than this says more about when V8 collected than about a leak:
# shorter stretches are checked against their own first half instead.
MIN_FIT_JOBS = 300

# What is checked, from a sample: the C allocator's bytes in use, and V8's heap in use (kB).
CHECKED = {
    "native": lambda s: s["malloc_in_use_kb"],
    "heap_used": lambda s: s["heap_used_kb"],
}
# Reported beside them: the memory outside V8's heap, freed chunks the allocator keeps included.
REPORTED = {"native_rss": lambda s: s["rss_kb"] - s["heap_total_kb"]}


def _growth(steady: list[dict], value) -> dict:
    slope, _, se = fit([s["job"] for s in steady], [value(s) for s in steady])
    return {"growth_mb_per_1000_jobs": round(slope * 1000 / 1024, 1), "slope_se_mb": round(se * 1000 / 1024, 1)}


def segments(samples: list[dict], warmup_jobs: int, limit_mb_per_1000: float, short_margin_mb: float) -> list[dict]:
    """One entry per sidecar process (pid): its samples' span, RSS at its first and last sample
    and its highest, and, past `warmup_jobs` jobs of its life, the fitted growth in MB per 1,000
    jobs of RSS and of each CHECKED measure (with the slope's standard error). `flat`: each
    CHECKED measure grows at most `limit_mb_per_1000` over a stretch of MIN_FIT_JOBS jobs or more;
    over a shorter one, no sample of its second half exceeds the first half's highest by
    `short_margin_mb`. Samples without the heap's figures (the sidecar did not answer) count for
    RSS only."""
    by_pid: dict[int, list[dict]] = {}
    for s in samples:
        if s.get("rss_kb"):
            by_pid.setdefault(s["pid"], []).append(s)
    out = []
    for pid, ss in by_pid.items():
        first = ss[0]["job"]
        steady = [s for s in ss if s["job"] - first >= warmup_jobs]
        seg = {"pid": pid, "jobs": [first, ss[-1]["job"]], "samples": len(ss),
               "rss_mb": {"first": round(ss[0]["rss_kb"] / 1024, 1), "last": round(ss[-1]["rss_kb"] / 1024, 1),
                          "max": round(max(s["rss_kb"] for s in ss) / 1024, 1)}}
        if len(steady) >= 5:
            seg["steady_from_job"] = steady[0]["job"]
            seg.update(_growth(steady, lambda s: s["rss_kb"]))
        with_heap = [s for s in ss if s.get("heap_total_kb") and s.get("heap_used_kb") and s.get("malloc_in_use_kb")]
        steady_heap = [s for s in with_heap if s["job"] - first >= warmup_jobs]
        checks = {}
        for name, value in CHECKED.items():
            if len(steady_heap) >= 5 and steady_heap[-1]["job"] - steady_heap[0]["job"] >= MIN_FIT_JOBS:
                g = _growth(steady_heap, value)
                g["flat"] = g["growth_mb_per_1000_jobs"] <= limit_mb_per_1000
                g["check"] = f"fitted growth <= {limit_mb_per_1000} MB per 1,000 jobs"
            elif len(with_heap) >= 4:
                half = len(with_heap) // 2
                a = max(value(s) for s in with_heap[:half])
                b = max(value(s) for s in with_heap[half:])
                g = {"second_half_over_first_mb": round((b - a) / 1024, 1), "flat": b - a <= short_margin_mb * 1024,
                     "check": f"second half's highest <= first half's highest + {short_margin_mb} MB"}
            else:
                continue
            checks[name] = g
        seg["checked"] = checks
        if len(steady_heap) >= 5:
            seg["reported"] = {name: _growth(steady_heap, value) for name, value in REPORTED.items()}
        if checks:
            seg["flat"] = all(g["flat"] for g in checks.values())
        out.append(seg)
    return out
