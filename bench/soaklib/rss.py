"""The sidecar's resident memory over the soak: samples (job index, RSS) per sidecar process, and
a least-squares line through each process's samples after its warm-up."""

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


def segments(samples: list[dict], warmup_jobs: int, limit_mb_per_1000: float, short_margin_mb: float) -> list[dict]:
    """One entry per sidecar process (pid): its samples' span and, past `warmup_jobs` jobs of its
    life, the fitted growth in MB per 1,000 jobs (with the slope's standard error). `flat`: the
    growth is at most `limit_mb_per_1000` over a stretch of MIN_FIT_JOBS jobs or more; over a
    shorter one, no sample of the second half exceeds the first half's highest by
    `short_margin_mb`."""
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
            slope, _, se = fit([s["job"] for s in steady], [s["rss_kb"] for s in steady])
            seg.update(steady_from_job=steady[0]["job"], slope_kb_per_job=round(slope, 2), slope_se=round(se, 2),
                       growth_mb_per_1000_jobs=round(slope * 1000 / 1024, 1))
            if steady[-1]["job"] - steady[0]["job"] >= MIN_FIT_JOBS:
                seg["check"] = f"fitted growth <= {limit_mb_per_1000} MB per 1,000 jobs"
                seg["flat"] = seg["growth_mb_per_1000_jobs"] <= limit_mb_per_1000
        if "flat" not in seg and len(ss) >= 4:
            half = len(ss) // 2
            first, second = max(s["rss_kb"] for s in ss[:half]), max(s["rss_kb"] for s in ss[half:])
            seg["check"] = f"second half's highest <= first half's highest + {short_margin_mb} MB"
            seg["second_half_over_first_mb"] = round((second - first) / 1024, 1)
            seg["flat"] = second - first <= short_margin_mb * 1024
        out.append(seg)
    return out
