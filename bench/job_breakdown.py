"""Where the time of an in-process run_mpi job goes: time stamps across the client, the scheduler
(its plugin, its handlers, its HTTP calls to the sidecar), the worker tasks and the sidecar's own
event times, for later jobs over the same M workers. Also Dask's own floor, side by side in the
same run: M trivial tasks pinned one per worker, submitted and gathered (plain, and seceding as a
rank does).

    .venv/bin/python bench/job_breakdown.py --size 8 --repeat 20
    .venv/bin/python bench/job_breakdown.py --quick     # the perf guard's run: M = 4, 16 jobs

The guard's ratio (guard.ratios, m<M>.floor_over_job) is Dask's floor over the job's time, so
that, as for every guarded benchmark, above 1 would mean the job is as fast as plain Dask tasks.

Prints one JSON document. The headline (job_ms, the ratio, the guard's) times jobs with nothing
traced, alternating with runs of the floor, each after 0.3 s of quiet. Later jobs duplicate the
communicator the members kept (the communicator cache); job_built_ms times the same job with the
cache off (each builds its own with Comm_create_from_group), alternating with the others (not
with --quick). Then, for as many jobs
again with stamps installed, per phase the median time since the run_mpi call (ms), and their
own median (traced_job_ms): the stamps come from wrappers around the code paths (nothing in
dask_pmix changes); every clock is the host's wall clock, the sidecar's in whole milliseconds.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from headline import _body, start_cluster  # noqa: E402

SETTLE = 0.3  # quiet before each timed job or floor run, and after each traced job
MARKS: list[tuple[float, str, str]] = []  # (time, job id or "", what): this process's stamps
if __name__ == "__main__":  # the scheduler's wrappers (same process) import it by name
    sys.modules["job_breakdown"] = sys.modules["__main__"]


def rank_of(comm):
    """The trivial job's function (of __main__, as a user's script's is)."""
    return comm.rank


def mark(job: str, what: str) -> None:
    MARKS.append((time.time(), job, what))


def install_worker_trace() -> bool:
    """In a worker process: stamps around the member's steps, kept in dask_pmix.member.task._bench_marks."""
    import dataclasses
    import time as _t

    import dask_pmix.member.inprocess as ip
    import dask_pmix.member.task as run

    if getattr(run, "_bench_marks", None) is not None:
        return False
    marks: list = []
    run._bench_marks = marks
    orig_calls, orig_member, orig_build = run._calls, ip.run_member, ip.build

    def calls(job_id, worker_id):
        c = orig_calls(job_id, worker_id)

        def wrap(name, f):
            def g(*a, **k):
                marks.append((_t.time(), job_id, name + ">"))
                try:
                    return f(*a, **k)
                finally:
                    marks.append((_t.time(), job_id, name + "<"))
            return g
        return dataclasses.replace(c, join=wrap("join", c.join), leave=wrap("leave", c.leave))

    def run_member(**kw):
        marks.append((_t.time(), kw["job"]["id"], "member>"))
        try:
            return orig_member(**kw)
        finally:
            marks.append((_t.time(), kw["job"]["id"], "member<"))

    def build(p, ranks, tag, plan):
        # The job's communicator, built anew or duplicated from a kept one (the communicator cache).
        job = tag.split(":", 1)[-1]
        marks.append((_t.time(), job, "comm>"))
        try:
            return orig_build(p, ranks, tag, plan)
        finally:
            marks.append((_t.time(), job, "comm<"))

    run._calls = calls
    orig_call = run._scheduler_call

    def scheduler_call(dask_worker, handler, **kwargs):
        # Stamps when the call starts on the worker's event loop (the task thread hands it over).
        job = kwargs.get("job_id", "")
        rpc = getattr(dask_worker.scheduler, handler)

        async def traced(**kw):
            marks.append((_t.time(), job, handler.replace("dask_pmix_", "") + " on loop>"))
            return await rpc(**kw)

        class Proxy:
            def __getattr__(self, name):
                return traced if name == handler else getattr(dask_worker.scheduler, name)

        class W:
            loop = dask_worker.loop
            scheduler = Proxy()
        return orig_call(W(), handler, **kwargs)
    run._scheduler_call = scheduler_call
    ip.run_member = run_member
    ip.build = build
    return True


def cache_bound(client, bound: int | None) -> int:
    """Sets the scheduler's communicator cache bound (None: back to what it was); the old one."""

    def set_bound(dask_scheduler, bound=bound):
        from dask_pmix.protocol import SCHEDULER_PLUGIN

        c = dask_scheduler.plugins[SCHEDULER_PLUGIN].comm_cache
        old = c.bound
        c.bound = getattr(c, "_bench_bound", old) if bound is None else bound
        if bound is not None and not hasattr(c, "_bench_bound"):
            c._bench_bound = old
        return old

    return client.run_on_scheduler(set_bound)


def take_worker_marks() -> list:
    import dask_pmix.member.task as run

    marks = list(run._bench_marks)
    run._bench_marks.clear()
    return marks


def install_scheduler_trace(dask_scheduler) -> None:
    """In the scheduler: stamps around the plugin's handlers, and the task stream messages."""
    import dask_pmix.rest as rest
    from dask_pmix.protocol import Scheduler

    import job_breakdown as jb

    for name in (Scheduler.CREATE_JOB, Scheduler.JOIN_JOB, Scheduler.LEAVE_JOB):
        orig = dask_scheduler.handlers[name]

        def wrap(orig=orig, name=name):
            async def h(*a, **k):
                job = k.get("job_id", "")
                jb.mark(job, name + ">")
                try:
                    return await orig(*a, **k)
                finally:
                    jb.mark(job, name + "<")
            return h
        dask_scheduler.handlers[name] = wrap()
    for name in ("update-graph", "task-finished"):
        orig = dask_scheduler.stream_handlers[name]

        def swrap(orig=orig, name=name):
            def stamp(k):
                jb.mark(str(k.get("key") or next(iter(k.get("keys") or []), "")), name)

            if inspect.iscoroutinefunction(orig):  # the stream awaits only coroutine functions
                async def ah(*a, **k):
                    stamp(k)
                    return await orig(*a, **k)
                return ah

            def h(*a, **k):
                stamp(k)
                return orig(*a, **k)
            return h
        dask_scheduler.stream_handlers[name] = swrap()
    orig_call = rest.AsyncSidecarClient._call

    async def call(self, method, path, body=None, timeout=None, post=None):
        jb.mark(path, f"http {method}>")
        try:
            return await orig_call(self, method, path, body, timeout, post)
        finally:
            jb.mark(path, f"http {method}<")
    rest.AsyncSidecarClient._call = call


def follow_events(sidecar, out: list, stop: threading.Event) -> None:
    for e in sidecar.events(last_event_id=None):
        if stop.is_set():
            return
        out.append(e)


def dask_floor(client, workers: list[str], repeat: int, secede: bool, one_graph: bool = False,
               warm: bool = True) -> list[float]:
    """M trivial tasks, one pinned to each worker, submitted and gathered: one Client.submit per
    task, or (one_graph) all in one graph as run_mpi submits its ranks. With `warm`, one run
    first that is not timed."""
    import uuid

    from dask_pmix.client.graph import submit_ranks

    def trivial(i):
        if secede:
            from distributed import secede as s

            s()
        return i

    times = []
    for _ in range(repeat + (1 if warm else 0)):
        t0 = time.perf_counter()
        if one_graph:
            tag = uuid.uuid4().hex
            futs = submit_ranks(client, [(f"floor-{tag}-{i}", w, trivial, (i,)) for i, w in enumerate(workers)])
        else:
            futs = [client.submit(trivial, i, workers=[w], allow_other_workers=False, pure=False)
                    for i, w in enumerate(workers)]
        assert client.gather(futs) == list(range(len(workers)))
        times.append(time.perf_counter() - t0)
        del futs
    return times[1:] if warm else times


def user_floors(client, workers: list[str], repeat: int) -> dict[str, list[float]]:
    """The two ways a user reaches M workers without dask-pmix, as extra rows: client.run of a
    trivial function on the M workers (no task at all), and a plain client.map of M trivial tasks
    that Dask places where it likes (nothing pinned)."""
    import uuid

    def trivial(i=0):
        return i

    out: dict[str, list[float]] = {"client_run": [], "client_map": []}
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        assert len(client.run(trivial, workers=workers)) == len(workers)
        out["client_run"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        futs = client.map(trivial, range(len(workers)), key=[f"map-{uuid.uuid4().hex}-{i}" for i in range(len(workers))])
        assert client.gather(futs) == list(range(len(workers)))
        out["client_map"].append(time.perf_counter() - t0)
        del futs
    return {k: v[1:] for k, v in out.items()}


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and every live descendant, from /proc: the client,
    the scheduler and its plugin (this process), the nannies and workers, and the embedded sidecar.
    On 2 cores that total, not any one process's share, decides wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        stats[pid] = (int(fields[11]), int(fields[12]))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += sum(stats.get(pid, (0, 0)))
        todo += children.get(pid, [])
    return total / tick


def comm_costs(client, sidecar, workers: list[str], repeat: int) -> dict:
    """Over the M members (which have met): Comm_create_from_group, then Dup of that communicator,
    then one Allreduce on the duplicate. The member that arrives last waits least: its time is
    the operation's cost."""
    ranks_by = {w["id"]: w["pool"]["rank"] for w in sidecar.workers()}
    ranks = [ranks_by[w] for w in workers]

    def member(tag):
        import time as _t

        from dask_pmix import pool

        p = pool.current(wait=60)
        t0 = _t.perf_counter()
        comm = p.comm(ranks, tag)
        t1 = _t.perf_counter()
        dup = comm.Dup()
        t2 = _t.perf_counter()
        dup.allreduce(1)
        t3 = _t.perf_counter()
        dup.Free()
        comm.Free()
        return t1 - t0, t2 - t1, t3 - t2

    rows = []
    for i in range(repeat):
        futs = [client.submit(member, f"bench-costs-{i}", workers=[w], pure=False) for w in workers]
        res = client.gather(futs)
        rows.append((min(r[0] for r in res), min(r[1] for r in res), max(r[2] for r in res)))
    med = lambda k: round(statistics.median(r[k] for r in rows) * 1e3, 2)  # noqa: E731
    return {"create_from_group_ms": med(0), "dup_ms": med(1), "allreduce_on_dup_ms": med(2)}


def job_timeline(job_id: str, t0: float, t_end: float, marks: list, wmarks: list, events: list) -> dict:
    rel = lambda t: round((t - t0) * 1e3, 2)  # noqa: E731
    tl: dict[str, list[float]] = {}

    def add(name, t):
        tl.setdefault(name, []).append(rel(t))
    for t, job, what in marks:
        if job and job_id not in job and not job.startswith("/v1/jobs?"):
            continue
        add(f"{what} {job.replace(job_id, '{id}').split('?')[0]}" if job.startswith("/") else what, t)
    for t, job, what in wmarks:
        if job == job_id:
            add("worker " + what, t)
    for e in events:
        for kind, body in e.items():
            if not isinstance(body, dict) or body.get("jobId") != job_id:
                continue
            add(f"sidecar {kind} {body.get('to')}", e["_t"])
    add("run_mpi returned", t_end)
    return {k: (v[0] if len(v) == 1 else [min(v), max(v)]) for k, v in sorted(tl.items(), key=lambda kv: min(kv[1]))}


def traced_jobs(client, workers: list[str], body, repeat: int) -> list[dict]:
    """`repeat` jobs with every stamp installed: each one's timeline (ms since its run_mpi call)."""
    import dask_pmix.client.run as run
    from dask_pmix import run_mpi
    from dask_pmix.rest import SidecarClient

    client.run(install_worker_trace)
    client.run_on_scheduler(install_scheduler_trace)
    info = client.sync(client.scheduler.dask_pmix_info)
    events: list = []
    reader = SidecarClient(info["url"], info.get("token"))

    def follow():
        try:
            for e in reader.events():
                e["_t"] = datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
                events.append(e)
        except Exception:  # noqa: BLE001
            pass
    threading.Thread(target=follow, daemon=True).start()
    orig = {n: getattr(run, n) for n in ("_start_job", "_gather")}

    def wrap(n):
        async def f(*a, **k):
            mark("", n + ">")
            try:
                return await orig[n](*a, **k)
            finally:
                mark("", n + "<")
        return f
    for n in orig:
        setattr(run, n, wrap(n))
    orig_expect = run.job_ends

    def job_ends(client_):
        ends = orig_expect(client_)
        if not getattr(ends, "_traced", False):
            orig = ends.expect

            def expect(job_id):
                mark(job_id, "gather>")
                return orig(job_id)
            ends.expect, ends._traced = expect, True
        return ends
    run.job_ends = job_ends

    timelines = []
    for _ in range(repeat):
        MARKS.clear()
        t0 = time.time()
        results = run_mpi(client, body, workers=workers)
        t_end = time.time()
        job_id = next(m[1] for m in MARKS if m[2] == "gather>")
        time.sleep(SETTLE)  # the sidecar's last events, the members' leaves
        wmarks = [m for ms in client.run(take_worker_marks).values() for m in ms]
        tl = job_timeline(job_id, t0, t_end, MARKS, wmarks, events)
        tl["body comm ready"] = [round((min(r["t_comm"] for r in results) - t0) * 1e3, 2),
                                 round((max(r["t_comm"] for r in results) - t0) * 1e3, 2)]
        tl["body allreduce done"] = round((max(r["t_allreduce"] for r in results) - t0) * 1e3, 2)
        timelines.append(tl)
    for n, f in orig.items():
        setattr(run, n, f)
    run.job_ends = orig_expect
    return timelines


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--show", type=int, default=2, help="full timelines of this many jobs")
    p.add_argument("--quick", action="store_true",
                   help="M = 4, 16 jobs and floors, nothing traced, no other floor or communicator costs (the perf guard)")
    args = p.parse_args()
    if args.quick:
        args.size, args.repeat, args.show = 4, 16, 0

    from dask_pmix import run_mpi

    cluster, client, sidecar = start_cluster(args.size, pool=True)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        body = _body()
        run_mpi(client, body, workers=workers)  # the first job: first contacts, not measured
        dask_floor(client, workers, 0, secede=True, one_graph=True)
        # The headline: jobs as users run them, nothing traced, alternating with Dask's floor so
        # that both meet the same machine; each starts after SETTLE s of quiet, so that neither
        # pays for the other's tail (a job's members and sidecar still finish up after it returns).
        jobs, floor_graph_secede, job_cpu, floor_cpu, built, built_cpu = [], [], [], [], [], []
        trivial, trivial_cpu = [], []
        for _ in range(args.repeat):
            time.sleep(SETTLE)
            c0, t0 = tree_cpu_seconds(), time.perf_counter()
            run_mpi(client, body, workers=workers)
            jobs.append(time.perf_counter() - t0)
            job_cpu.append(tree_cpu_seconds() - c0)
            time.sleep(SETTLE)
            c0 = tree_cpu_seconds()
            floor_graph_secede += dask_floor(client, workers, 1, secede=True, one_graph=True, warm=False)
            floor_cpu.append(tree_cpu_seconds() - c0)
            if not args.quick:
                # A job whose ranks do nothing, as the floor's tasks do nothing: dispatch alone.
                time.sleep(SETTLE)
                c0, t0 = tree_cpu_seconds(), time.perf_counter()
                assert run_mpi(client, rank_of, workers=workers) == list(range(len(workers)))
                trivial.append(time.perf_counter() - t0)
                trivial_cpu.append(tree_cpu_seconds() - c0)
                # The same job with the communicator cache off (each job builds its own), alternating.
                cache_bound(client, 0)
                time.sleep(SETTLE)
                c0, t0 = tree_cpu_seconds(), time.perf_counter()
                run_mpi(client, body, workers=workers)
                built.append(time.perf_counter() - t0)
                built_cpu.append(tree_cpu_seconds() - c0)
                cache_bound(client, None)
        users = user_floors(client, workers, args.repeat)
        timelines = [] if args.quick else traced_jobs(client, workers, body, args.repeat)
        floor, floor_secede, floor_graph = ([], [], []) if args.quick else (
            dask_floor(client, workers, args.repeat, secede=False),
            dask_floor(client, workers, args.repeat, secede=True),
            dask_floor(client, workers, args.repeat, secede=False, one_graph=True))
        costs = None if args.quick else comm_costs(client, sidecar, workers, args.repeat)
    finally:
        client.close()
        cluster.close()

    def med(name, i):
        vals = [tl[name] if not isinstance(tl[name], list) else tl[name][i] for tl in timelines if name in tl]
        return round(statistics.median(vals), 2) if vals else None
    names = list(timelines[-1]) if timelines else []
    summary = {n: ([med(n, 0), med(n, 1)] if isinstance(timelines[-1][n], list) else med(n, 0)) for n in names}
    def ms(times: list[float]) -> float | None:
        return round(statistics.median(times) * 1e3, 2) if times else None
    floor_ms = statistics.median(floor_graph_secede) * 1e3
    job_ms = ms(jobs)
    out = {"benchmark": "job_breakdown", "size": args.size, "repeat": args.repeat, "cpus": os.cpu_count(),
           "load_average": os.getloadavg(),
           # The headline: a later in-process job (run_mpi call to return, median, untraced) against
           # Dask's own floor in the same run (M trivial pinned tasks in one graph, seceding as ranks
           # do), each floor right after a job.
           "job_ms": job_ms, "ratio_to_dask_floor": round(job_ms / floor_ms, 2) if job_ms else None,
           # The same later job with the communicator cache off (dask-pmix.pool.comm-cache: 0: it
           # builds its communicator with Comm_create_from_group), alternating with the others.
           "job_built_ms": ms(built),
           # A later job whose function only returns comm.rank (the headline's runs an Allreduce
           # and returns a dict), alternating with the others: the job's dispatch, as the floor's
           # tasks are Dask's.
           "job_trivial_ms": ms(trivial),
           "ratio_trivial_to_dask_floor": round(ms(trivial) / floor_ms, 2) if trivial else None,
           "traced_job_ms": summary.get("run_mpi returned"),
           "median_ms_since_call": summary,
           "dask_floor_ms": {"submit_gather": ms(floor), "submit_secede_gather": ms(floor_secede),
                             "one_graph_gather": ms(floor_graph), "one_graph_secede_gather": ms(floor_graph_secede)},
           # Extra rows: how far the two ways users reach M workers without dask-pmix are.
           "user_ms": {"client_run": ms(users["client_run"]), "client_map": ms(users["client_map"])},
           # CPU (user + system, ms) summed over the client's process and all its descendants
           # (scheduler, nannies, workers, sidecar) while each job or floor ran; ticks of 10 ms, so
           # medians of a few ticks are coarse. The ratio is what the 1.5x target reads.
           "cpu_ms": {"job": ms(job_cpu), "floor": ms(floor_cpu), "job_built": ms(built_cpu),
                      "job_trivial": ms(trivial_cpu),
                      "ratio_trivial": round(sum(trivial_cpu) / sum(floor_cpu), 2) if trivial_cpu else None,
                      "ratio": round(sum(job_cpu) / sum(floor_cpu), 2) if sum(floor_cpu) else None},
           "communicator_ms": costs,
           "examples": timelines[: args.show],
           "guard": {"ratios": {f"m{args.size}.floor_over_job": round(floor_ms / job_ms, 3)} if job_ms else {},
                     "meaning": "Dask's floor (M trivial pinned tasks in one graph, seceding) over a later "
                                "in-process job's time (untraced), both medians of the same run; the perf "
                                "guard fails when it falls below half its record"}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
