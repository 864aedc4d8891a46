"""Elastic jobs (dask_pmix.run_elastic): what a change of members costs, beside restarting the job.

For each size M: a LocalCluster of M + 1 workers (one thread each, the default configuration: Open
MPI's in-process pool) and one elastic job of M members (min M - 1, max M) whose ranks commit every
--step-ms. Figures:

- reconfiguration: the bench asks the scheduler to drain the job's last member, as Dask's
  retirement does but without retiring the worker (scheduler/elastic.py, Elastic.request). At the
  next commit that member leaves and the spare worker joins in its place. Timed from the moment
  rank 0 entered that commit (time.time(), kept in the committed state) to the moment the next
  generation's communicator has carried one allreduce on every member, measured by rank 0 after
  that allreduce. It includes the old generation's end, the new job's admission on the sidecar, its
  ranks' tasks, the communicator (built or derived from a kept one) and the state's restore (a few
  numbers). --changes per size: median, p99 and max.
- killed member: kill -9 of a member's worker process mid-job (its nanny restarts it); from the kill
  to the next generation's first allreduce on every member. --kills per size.
- restart baseline: what a launcher without elasticity does on the same event (torchrun restarts
  every process of the job and starts it again from its checkpoint): the M members' workers
  restarted (client.restart_workers; their nannies start new processes, which join the pool),
  then a run_mpi job over M workers started again, timed from the restart call to that job's
  first allreduce on every member. --restarts per size.

- plain job start: a run_mpi job over M of the same workers, none restarted, from the call to
  its first allreduce on every member: the least a generation's start costs.

- planned release by Adaptive: cluster.adapt(minimum=M - 1, maximum=M - 1, interval 0.5 s,
  wait_count 3) while the job runs on M members beside the spare: Adaptive retires the spare at
  once and, since Dask never offers it a member (a long-running task), the job gives its last
  member back at its next commit. From that drain's request (Adaptive's first proposal naming the
  member, as the sidecar recorded it) to the worker gone from the scheduler; the bound is
  Adaptive's cycle (interval x wait_count) + one commit interval + one reconfiguration (the
  median's). Then the cluster scales back to M + 1 and the job grows back to M. --adaptive per size.

The ratio of the baseline's median to the reconfiguration's median is the time lost per event,
restart against elastic. Prints one JSON document (and writes --out).

    .venv/bin/python bench/elastic.py --sizes 4 8 16 --changes 50 [--out bench/results/elastic.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def looper(ctx, step: float):
    """Commits every ``step`` s until the bench says stop; rank 0 keeps, in the committed state,
    when each generation's communicator was first usable and when the commit behind it began."""
    import time as t

    s = ctx.state
    ctx.comm.allreduce(0)  # usable on every member once this returns everywhere
    ctx.comm.Barrier()
    if ctx.rank == 0:
        s["starts"].append({"generation": ctx.generation, "size": ctx.size, "at": t.time(), "entered": s["entered"]})
    while not os.path.exists(s["stop"]):
        t.sleep(step)
        s["entered"] = t.time() if ctx.rank == 0 else None
        ctx.commit(s)
    return s if ctx.rank == 0 else None


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def stats_ms(xs: list[float]) -> dict:
    if not xs:
        return {}
    return {
        "n": len(xs),
        "median_ms": round(statistics.median(xs) * 1000, 1),
        "p99_ms": round(percentile(xs, 0.99) * 1000, 1),
        "max_ms": round(max(xs) * 1000, 1),
    }


PHASES = (
    ("old_generation_ended", "entered", "old_ended"),
    ("new_job_created", "old_ended", "created"),
    ("new_generation_usable", "created", "at"),
)


def phases(starts: list[dict], gen_jobs: dict[int, dict]) -> dict:
    """Where a planned reconfiguration's time goes, from the commit's start and the first allreduce
    (rank 0's clock) and the sidecar's times of the two generations' jobs (the same host's clock,
    whole milliseconds): the commit's agreement, the old generation's ranks leaving and its job
    ending; the client's driver creating the next job; that job's ranks placed by Dask, joining,
    building their communicator, restoring the state and carrying the first allreduce."""
    spans: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
    for s in starts:
        old, new = gen_jobs.get(s["generation"] - 1), gen_jobs.get(s["generation"])
        if not (old and new and old.get("endedAt") and new.get("createdAt")):
            continue
        t = {
            "entered": s["entered"],
            "old_ended": iso_seconds(old["endedAt"]),
            "created": iso_seconds(new["createdAt"]),
            "at": s["at"],
        }
        for name, a, b in PHASES:
            spans[name].append(t[b] - t[a])
    return {name: {"median_ms": round(statistics.median(v) * 1000, 1), "n": len(v)} for name, v in spans.items() if v}


def current(sidecar, family: str | None = None) -> dict | None:
    """The running generation of an elastic job (of ``family``)."""
    for j in sidecar.jobs():
        labels = j.get("labels") or {}
        if labels.get("dask-pmix.elastic") and (family is None or labels["dask-pmix.elastic"] == family):
            if j["state"] == "running":
                return j
    return None


# Adaptive as the planned releases run it: an interval and how many proposals in a row retire a worker.
ADAPT_INTERVAL = 0.5
ADAPT_WAIT = 3


def iso_seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.01)
    raise TimeoutError(f"{what} within {timeout} s")


def wait_pool_ready(sidecar, n: int, timeout: float) -> None:
    try:
        wait_for(
            lambda: sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()) >= n,
            timeout,
            f"{n} workers ready in the pool",
        )
    except TimeoutError as e:
        seats = [(w["id"], w.get("state"), w.get("pool")) for w in sidecar.workers()]
        raise TimeoutError(f"{e}: {seats}") from None


def one_size(m: int, args) -> dict:
    import dask
    from distributed import Client, LocalCluster

    from dask_pmix import MPIJobError, SidecarClient, SidecarPlugin, run_elastic, run_mpi, wait_for_plugin
    from dask_pmix.protocol import SCHEDULER_PLUGIN

    # A LocalCluster checks each lost worker again lost-worker-timeout later and closes its nanny
    # for good if no worker of that name is there at that moment: one restarting slowly (the
    # baseline restarts M at once on 2 cores) or killed again. Put past the bench.
    dask.config.set({"distributed.deploy.lost-worker-timeout": "7 days"})  # read while the cluster runs
    cluster = LocalCluster(n_workers=m + 1, threads_per_worker=1, dashboard_address=":0")
    client = Client(cluster)
    client.register_plugin(SidecarPlugin())
    info = wait_for_plugin(client)
    sidecar = SidecarClient(info["url"], info.get("token"))
    out: dict = {"members": m, "workers": m + 1}
    try:
        wait_pool_ready(sidecar, m + 1, timeout=300)
        stop = Path(f"/tmp/dask-pmix-elastic-bench-{os.getpid()}-{m}")
        stop.unlink(missing_ok=True)
        state = {"starts": [], "entered": None, "stop": str(stop)}
        box: dict = {}

        def run() -> None:
            try:
                box["state"] = run_elastic(client, looper, args.step_ms / 1000, state=state, n=m, min=m - 1, max=m)
            except BaseException as e:  # noqa: BLE001
                box["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()

        def current_or_error(family=None):
            if "error" in box:
                raise box["error"]
            return current(sidecar, family)

        job = wait_for(lambda: current_or_error(), 120, "the first generation running")
        family = job["labels"]["dask-pmix.elastic"]

        def scheduler_workers() -> list[str]:
            return client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.workers))

        def drain(worker: str) -> None:
            def ask(dask_scheduler, worker=worker):
                dask_scheduler.plugins[SCHEDULER_PLUGIN].elastic.request(worker, "bench", 0.2)

            client.run_on_scheduler(ask)

        # Planned changes: the last member leaves, the spare joins in its place.
        for i in range(args.changes):
            gen = int(job["labels"]["dask-pmix.generation"])
            last = sorted(job["members"], key=lambda x: x["rank"])[-1]["workerId"]
            time.sleep(0.25)  # the last drain has passed: the worker it named may join again
            drain(last)
            job = wait_for(
                lambda gen=gen: (
                    (j := current_or_error(family)) and int(j["labels"]["dask-pmix.generation"]) > gen and j
                ),
                60,
                f"change {i}",
            )
        # Killed members.
        kills = []
        for _ in range(args.kills):
            job = wait_for(lambda: current_or_error(family), 60, "a generation running")
            gen = int(job["labels"]["dask-pmix.generation"])
            victim = sorted(job["members"], key=lambda x: x["rank"])[-1]["workerId"]
            pid = client.run(os.getpid, workers=[victim])[victim]
            at = time.time()
            os.kill(pid, signal.SIGKILL)
            kills.append((at, gen))
            job = wait_for(
                lambda gen=gen: (
                    (j := current_or_error(family)) and int(j["labels"]["dask-pmix.generation"]) > gen and j
                ),
                60,
                "the generation after a kill",
            )
            # The killed one back (a new process, in Dask and ready in the pool) before the next kill:
            # a worker killed while it starts is not restarted by its nanny.
            wait_for(
                lambda pid=pid: (now := client.run(os.getpid)) and len(now) == m + 1 and pid not in now.values(),
                120,
                "the killed worker restarted",
            )

            def all_ready() -> bool:
                seats = {w["id"]: (w.get("pool") or {}).get("state") for w in sidecar.workers()}
                return all(seats.get(a) == "ready" for a in client.run(os.getpid))

            wait_for(all_ready, 120, "the restarted worker ready in the pool")
            time.sleep(1.0)
        # Planned releases by Adaptive: it wants m - 1 workers, two fewer than there are. Dask's
        # workers_to_close offers it the spare only (members run long-running tasks), so the job is
        # asked to give back its last member, at its next commit; Adaptive retires it once it has
        # proposed it wait_count times in a row. From the drain's request (Adaptive's first proposal
        # that names the member: the sidecar's record) to the worker gone from the scheduler.
        releases, bound = [], ADAPT_INTERVAL * ADAPT_WAIT + args.step_ms / 1000
        for _ in range(args.adaptive):
            job = wait_for(lambda: current_or_error(family), 60, "a generation running")
            before = {x["workerId"] for x in job["members"]}
            adaptive = cluster.adapt(minimum=m - 1, maximum=m - 1, interval=f"{ADAPT_INTERVAL}s", wait_count=ADAPT_WAIT)
            try:
                left, at = wait_for(
                    lambda before=before: (gone := before - set(scheduler_workers())) and (gone, time.time()),
                    120,
                    "a member retired by Adaptive",
                )
            finally:
                adaptive.stop()
            drains = [d for d in sidecar.elastic_job(family)["drains"] if d["workerId"] in left]
            if drains:
                releases.append(at - iso_seconds(drains[-1]["requestedAt"]))
            cluster.scale(m + 1)
            wait_pool_ready(sidecar, m + 1, timeout=300)
            wait_for(
                lambda: (j := current_or_error(family)) and len(j["members"]) == m and j,
                120,
                "the job back to M members",
            )
        stop.touch()
        t.join(120)
        stop.unlink(missing_ok=True)
        if "error" in box:
            raise box["error"]
        final = next(s for s in box["state"] if s is not None)
        starts = final["starts"]
        by_gen = {s["generation"]: s for s in starts}
        # What each generation followed: a planned change ("-w +w"), or a loss ("lost w").
        gen_jobs = {
            int(j["labels"]["dask-pmix.generation"]): j
            for j in sidecar.jobs()
            if (j.get("labels") or {}).get("dask-pmix.elastic") == family
        }
        changes = {g: j["labels"].get("dask-pmix.change", "") for g, j in gen_jobs.items()}
        planned_starts = [
            s for s in starts if s["entered"] is not None and not changes.get(s["generation"], "lost").startswith("lost")
        ]
        planned = [s["at"] - s["entered"] for s in planned_starts]
        killed = []
        for at, gen in kills:
            after = min((s for s in starts if s["generation"] > gen), key=lambda s: s["generation"], default=None)
            if after is not None:
                killed.append(after["at"] - at)
        out["reconfiguration"] = stats_ms(planned)
        out["reconfiguration_phases"] = phases(planned_starts, gen_jobs)
        out["adaptive_release"] = stats_ms(releases)
        if releases and planned:
            # Adaptive's cycle, one commit interval and one reconfiguration (the median's).
            out["adaptive_release_bound_ms"] = round((bound + statistics.median(planned)) * 1000, 1)
        out["killed_member"] = stats_ms(killed)
        out["generations"] = len(by_gen)

        # The restart baseline: the job's processes restarted, the job started again.
        def first_allreduce(comm):
            comm.allreduce(0)
            comm.Barrier()
            return time.time()

        def workers_now() -> dict:
            return client.run(os.getpid)  # asked now, not the client's cached scheduler_info

        restarts: list[float] = []
        failed: list[str] = []
        for _ in range(args.restarts):
            old = workers_now()
            members = sorted(old)[:m]
            t0 = time.time()
            client.restart_workers(members, timeout=300)
            gone = {old[w] for w in members}

            def back(gone=gone) -> dict | None:
                now = workers_now()
                return now if len(now) == m + 1 and not set(now.values()) & gone else None

            fresh = wait_for(back, 120, "the restarted workers back")

            def in_pool(fresh=fresh) -> bool:
                seats = {w["id"]: (w.get("pool") or {}).get("state") for w in sidecar.workers()}
                return all(seats.get(a) == "ready" for a in fresh)

            wait_for(in_pool, 120, "the restarted workers in the pool")
            members = sorted(set(fresh) - (set(old) - set(members)))[:m]
            try:
                usable = run_mpi(client, first_allreduce, workers=members, mode="inprocess")
            except MPIJobError as e:
                # Not timed: the restart's own trouble (a worker restarted again), recorded.
                failed.append(str(e))
                continue
            restarts.append(max(usable) - t0)
        out["restart_baseline"] = stats_ms(restarts)
        # A plain job's start over M members (no restart): from run_mpi's call to its first
        # allreduce on every member; what a generation's start costs at least.
        starts_plain = []
        for _ in range(args.changes // 2):
            members = sorted(workers_now())[:m]
            t0 = time.time()
            usable = run_mpi(client, first_allreduce, workers=members, mode="inprocess")
            starts_plain.append(max(usable) - t0)
        out["plain_job_start"] = stats_ms(starts_plain)
        out["restart_baseline_failed"] = failed
        if planned and restarts:
            out["restart_over_reconfiguration"] = round(statistics.median(restarts) / statistics.median(planned), 1)
    finally:
        client.close()
        cluster.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--adaptive", type=int, default=5, help="planned releases by Adaptive, per size")
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    load0 = os.getloadavg()
    doc = {
        "benchmark": "elastic",
        "cpus": os.cpu_count(),
        "step_ms": args.step_ms,
        "sizes": [one_size(m, args) for m in args.sizes],
        "load_avg": {"start": [round(x, 1) for x in load0], "end": [round(x, 1) for x in os.getloadavg()]},
    }
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
