"""The performance page's figures and text, and the README's headline table, from
bench/results/*.json only, so that the docs and the recorded results cannot drift apart.

    python docs/gen/perf.py OUT_DIR     writes OUT_DIR/performance.md and OUT_DIR/perf/*.svg
    python docs/gen/perf.py --readme    prints the README's headline table

Every figure states what it times, the machine (cores), the load average during the run, the
configuration, and the results file it comes from.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
SIZES = ("2", "4", "8")


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _loads(start: Any, end: Any) -> str:
    def one(x: Any) -> str:
        return f"{x[0]:.1f}" if isinstance(x, list) else f"{x:.1f}"

    return f"load average {one(start)} at the start, {one(end)} at the end"


# --- the README's headline table ---------------------------------------------------------------


def headline_rows() -> list[tuple[str, str, str, str]]:
    """(what, dask-pmix, the launcher, ratio) rows from the headline, PMI and comm results."""
    ompi, mpich, comm = load("headline-openmpi.json"), load("headline-mpich.json"), load("comm.json")
    rows = []

    def job_row(doc: dict, ref: str, mode: str, which: str, label: str) -> tuple[str, str, str, str]:
        ours = [doc["sizes"][m][mode][which]["total_median_s"] for m in SIZES]
        theirs = [doc["sizes"][m][ref]["total_median_s"] for m in SIZES]
        return (
            label,
            " / ".join(f"{s:.3f}" for s in ours) + " s",
            " / ".join(f"{s:.3f}" for s in theirs) + " s",
            " / ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs)),
        )

    rows.append(
        job_row(ompi, "mpirun", "inprocess", "later", "`run_mpi` job, Open MPI in-process, M = 2 / 4 / 8 (vs `mpirun`)")
    )
    rows.append(job_row(ompi, "mpirun", "inprocess", "first", "the same, first job on fresh workers"))
    rows.append(job_row(ompi, "mpirun", "fork", "later", "the same in fork mode"))
    rows.append(job_row(mpich, "mpiexec_hydra", "fork", "later", "`run_mpi` job, MPICH fork mode (vs hydra `mpiexec`)"))
    if (RESULTS / "comm-tasks.json").exists():
        # What users feel: a whole task on one worker reading a result made on another.
        for r in load("comm-tasks.json")["tasks"]["rows"]:
            late = r["kind"] == "late" and r["row"] == "64 MiB"
            if late or (r["kind"] == "cohort" and r["row"] in ("1 KiB", "64 MiB", "512 MiB")):
                who = "on a worker added later (single copy) " if late else ""
                rows.append(
                    (
                        f"Dask task {who}reading a {r['row']} result from another worker of its host "
                        "(`tcp+mpi://` vs `tcp://`)",
                        f"{r['tcp+mpi://']['better_s'] * 1e3:.1f} ms",
                        f"{r['tcp://']['better_s'] * 1e3:.1f} ms",
                        f"{r['tcp+mpi://']['better_s'] / r['tcp://']['better_s']:.2f}",
                    )
                )
    else:
        big = next(g for g in comm["get_data"] if g["bytes"] == 64 << 20 and g["concurrency"] == 1)
        rows.append(
            (
                "Dask `get_data` 64 MiB, worker to worker (`tcp+mpi://` vs `tcp://`)",
                f"{big['tcp+mpi']['throughput_GiB_s']:.2f} GiB/s",
                f"{big['tcp']['throughput_GiB_s']:.2f} GiB/s",
                f"{big['throughput_ratio']:.2f}x",
            )
        )
    if (RESULTS / "stencil.json").exists():
        ends = [load("stencil.json")["sizes"][i] for i in (0, -1)]
        rows.append(
            (
                f"100-sweep stencil on a dask array of {ends[0]['mib']:g} MiB / {ends[1]['mib']:g} MiB, M = 4 "
                "(one `map_blocks_mpi` job vs Dask's `map_overlap`)",
                " / ".join(f"{e['mpi']['median_s']:.2f}" for e in ends) + " s",
                " / ".join(f"{e['dask']['median_s']:.2f}" for e in ends) + " s",
                " / ".join(f"{e['mpi']['median_s'] / e['dask']['median_s']:.2f}" for e in ends),
            )
        )
    return rows


def readme_table() -> str:
    lines = ["| what (medians; 2 cores) | dask-pmix | reference | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in headline_rows()]
    return "\n".join(lines) + "\n"


# --- the figures -------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {"svg.hashsalt": "dask-pmix", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}
    )
    return plt


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str, log: bool = False) -> None:
    n = len(series)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(frameon=False, fontsize=8)


def _save(fig, out: Path, name: str) -> str:
    """Writes the figure; its path as the page that includes the generated one (docs/) sees it."""
    (out / "perf").mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    path = out / "perf" / f"{name}.svg"
    fig.savefig(path, metadata={"Date": None})
    return Path(os.path.relpath(path.resolve(), ROOT / "docs")).as_posix()


def fig_headline(plt, out: Path, file: str, ref: str, ref_label: str, title: str) -> tuple[str, str]:
    doc = load(file)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    series = {ref_label: [doc["sizes"][m][ref]["total_median_s"] for m in SIZES]}
    for mode in ("inprocess", "fork"):
        for which in ("first", "later"):
            if mode in doc["sizes"][SIZES[0]]:
                series[f"{mode}, {which} job"] = [doc["sizes"][m][mode][which]["total_median_s"] for m in SIZES]
    _bars(ax, [f"M = {m}" for m in SIZES], series, "seconds (median)")
    ax.set_title(title)
    path = _save(fig, out, file.removesuffix(".json"))
    plt.close(fig)
    later = doc["sizes"][SIZES[0]]["inprocess"]["later"]["runs"]
    caption = (
        f"A whole `run_mpi` job, from the call to every result back, against {ref_label} starting the same Python "
        f"body from scratch with the settings the sidecar gives its members. Each mode on a fresh `LocalCluster` of "
        f"M workers with one thread each: its first job (one sample) and {later} later ones (medians). "
        f"Machine: {doc['cpus']} cores; {_loads(doc['load_average_at_start'], doc['load_average_at_end'])}. "
        f"Configuration: {doc['note']}. Source: `bench/results/{file}`."
    )
    return path, caption


def _versus(plt, out: Path, name: str, results: list, reference: str, panels: list) -> str:
    """One panel per operation, dask-pmix against the reference by rank count; each panel is
    (title, y label, value of ours in a result, value of the reference's)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 2.6))
    ranks = [str(r["ranks"]) for r in results]
    for ax, (title, ylabel, ours, theirs) in zip(axes, panels):
        _bars(ax, ranks, {"dask-pmix": [ours(r) for r in results], reference: [theirs(r) for r in results]}, ylabel)
        ax.set_title(title)
        ax.set_xlabel("ranks")
    path = _save(fig, out, name)
    plt.close(fig)
    return path


def fig_pmix(plt, out: Path) -> tuple[str, str]:
    doc = load("pmix.json")
    ops = [
        ("fence_us", "fence"),
        ("fence_data_us", "fence, 64 B collected"),
        ("dmodex_get_us", "direct-modex get"),
        ("group_us", "group construct"),
    ]
    panels = [
        (label, "µs (median)" if i == 0 else "", lambda r, k=key: r["ours"][k], lambda r, k=key: r["prrte"][k])
        for i, (key, label) in enumerate(ops)
    ]
    path = _versus(plt, out, "pmix", doc["results"], "prterun", panels)
    m = doc["machine"]
    caption = (
        f"PMIx operations timed inside the same bare client under the sidecar and under `prterun` "
        f"({doc['reference']}); medians over {doc['iterations']} iterations, then ranks, then {doc['repeats']} "
        f"alternating repeats. Machine: {m['cpus']} cores ({m['model']}); "
        f"{_loads(m['load_avg_at_start'], m['load_avg_at_end'])}. Source: `bench/results/pmix.json`."
    )
    return path, caption


def fig_pmi(plt, out: Path) -> tuple[str, str]:
    doc = load("pmi.json")
    panels = [
        (
            "PMI barrier",
            "µs (median)",
            lambda r: r["pmi_latency"]["ours"]["barrier_us"],
            lambda r: r["pmi_latency"]["hydra"]["barrier_us"],
        ),
        (
            "put + barrier + get",
            "",
            lambda r: r["pmi_latency"]["ours"]["put_barrier_get_us"],
            lambda r: r["pmi_latency"]["hydra"]["put_barrier_get_us"],
        ),
        (
            "MPI_Init, MPICH 5.0.2",
            "s (median)",
            lambda r: r["mpi_init"]["mpich5"]["ours"]["launch_to_last_init_s"],
            lambda r: r["mpi_init"]["mpich5"]["hydra"]["launch_to_last_init_s"],
        ),
    ]
    path = _versus(plt, out, "pmi", doc["results"], "hydra", panels)
    load_ = doc["load_avg_1m"]
    caption = (
        f"PMI-1 wire operations and MPI_Init (launch to the last rank's return) with the same bare client and MPI "
        f"program under the sidecar and under hydra's `mpiexec`; {doc['notes'][0]}. Machine: {doc['cpus']} cores; "
        f"load average (1 min) {load_['min']:.1f}-{load_['max']:.1f} during the run. "
        f"Configuration: {', '.join(f'{k}={v}' for k, v in doc['env'].items())}. Source: `bench/results/pmi.json`."
    )
    return path, caption


def fig_comm(plt, out: Path) -> tuple[str, str]:
    doc = load("comm.json")
    rows = doc["get_data"]

    def size(b: int) -> str:
        return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

    groups = [f"{size(g['bytes'])} x{g['concurrency']}" for g in rows]
    fig, ax = plt.subplots(figsize=(8, 3))
    _bars(
        ax,
        groups,
        {
            "tcp://": [g["tcp"]["throughput_GiB_s"] for g in rows],
            "tcp+mpi://": [g["tcp+mpi"]["throughput_GiB_s"] for g in rows],
        },
        "GiB/s (log)",
        log=True,
    )
    ax.set_title("Dask get_data between two workers")
    path = _save(fig, out, "comm")
    plt.close(fig)
    wl = doc["workloads"]
    caption = (
        f"Throughput of Dask's own `get_data` between workers, size x concurrent requests, over `tcp://` and "
        f"`tcp+mpi://`, answered by the same worker processes. Workloads on one 4-worker cluster per scheme: "
        f"`(x + x.T).sum()` over 1 GiB {wl['tcp']['array']['seconds']:.1f} s vs "
        f"{wl['tcp+mpi']['array']['seconds']:.1f} s, "
        f"a P2P shuffle {wl['tcp']['shuffle']['seconds']:.1f} s vs {wl['tcp+mpi']['shuffle']['seconds']:.1f} s. "
        f"Machine: {doc['cpus']} cores; {_loads(doc['load_avg_at_start'], doc['load_avg_at_end'])}. Configuration: "
        + (
            "the default one: workers of a LocalCluster in the in-process pool, which started together and so "
            "share memory (a cohort); each ratio is the median of paired rounds. "
            if doc["cluster"] == "pool"
            else f"workers started by Open MPI's launcher ({doc['cluster']}), so that pairs on one host share memory. "
        )
        + "Source: `bench/results/comm.json`."
    )
    return path, caption


def fig_rest(plt, out: Path) -> tuple[str, str]:
    doc = load("rest.json")
    res = doc["results"]
    levels = [("sequential", "sequential"), ("concurrency_8", "8 in flight"), ("concurrency_64", "64 in flight")]
    series = {
        "pset define": [res[f"pset_define_{k}"]["ops_per_s"] for k, _ in levels],
        "pset delete": [res[f"pset_delete_{k}"]["ops_per_s"] for k, _ in levels],
        "job create + delete": [res[f"job_create_delete_{k}"]["ops_per_s"] for k, _ in levels],
    }
    fig, ax = plt.subplots(figsize=(7, 3))
    _bars(ax, [label for _, label in levels], series, "operations per second")
    ax.set_title("REST API")
    path = _save(fig, out, "rest")
    plt.close(fig)
    m = doc["machine"]
    caption = (
        f"REST operations per second, sequential and with 8 and 64 requests in flight. "
        f"{doc['notes']['job_create_delete']}. {doc['notes']['client']}. Machine: {m['cpus']} cores ({m['model']}); "
        f"load average {m['load'][0]:.1f}. Configuration: state directory "
        f"{'on' if doc['params']['state_dir'] else 'off'}, {doc['params']['transport']}. "
        "Source: `bench/results/rest.json`."
    )
    return path, caption


def soak_section() -> str:
    """The soak's outcome as a table: jobs and faults by kind, what held, memory per 1,000 jobs."""
    doc = load("soak.json")
    inv = doc["invariants"]
    faults = doc["summary"]["faults"]
    kinds: dict[str, list[int]] = {}
    for key, f in faults.items():
        k = kinds.setdefault(key.split("@")[0], [0, 0, 0])
        k[0] += f["count"]
        k[1] += f["as_promised"]
        k[2] += f["next_job_ok"]
    healthy = doc["summary"]["healthy_jobs"]
    rows = [
        "| fault | count | as promised | next job ok |",
        "| --- | --- | --- | --- |",
        *(f"| {k} | {c} | {a} | {n} |" for k, (c, a, n) in sorted(kinds.items())),
    ]
    native = {
        name: segs[0]["checked"]["native"].get("growth_mb_per_1000_jobs", "-")
        for name, segs in doc["rss"].items()
        if segs and segs[0].get("checked", {}).get("native")
    }
    native_rss = {
        name: segs[0]["reported"]["native_rss"]["growth_mb_per_1000_jobs"]
        for name, segs in doc["rss"].items()
        if segs and segs[0].get("reported", {}).get("native_rss")
    }
    by_restart = inv.get("canary_recomputed_by_client_restart")
    restarted = f", or {by_restart} dropped by client.restart(), which drops every key" if by_restart else ""
    return (
        f"{doc['jobs']:,} `run_mpi` and `submit_mpi` jobs on two real clusters of {doc['workers_per_cluster']} "
        f"workers (Open MPI in-process and fork, MPICH fork; the forged hellos go to a third of 2 workers on "
        f"tcp+mpi://), {sum(k[0] for k in kinds.values())} of them "
        f"faults, in {doc['seconds']:.0f} s at load average {doc['load_avg']['start'][0]:.1f} to "
        f"{doc['load_avg']['end'][0]:.1f}. Healthy jobs: {sum(h['ok'] for h in healthy.values())} of "
        f"{sum(h['jobs'] for h in healthy.values())} succeeded. Violations: {len(doc['violations'])}; jobs hung: "
        f"{inv['hung_jobs']}; members left frozen: {inv['members_left_frozen']}; chunks of held data computed "
        f"again: {inv['canary_recomputed']}, of which dask-pmix lost {inv['canary_recomputed_by_dask_pmix']} (the "
        f"others were on workers the soak killed{restarted}); leaked namespaces: {inv['leaked_namespaces']}. The "
        "sidecar's C allocator had "
        + ", ".join(f"{mb} MB ({name})" for name, mb in native.items())
        + " more in use per 1,000 jobs (a fitted line after warm-up), and its RSS outside V8's heap grew "
        + ", ".join(f"{mb} MB ({name})" for name, mb in native_rss.items())
        + " (freed memory the allocator keeps included). "
        "What each fault is, and what it must do: `bench/soak.py`. Source: `bench/results/soak.json`.\n\n"
        + "\n".join(rows)
        + "\n"
        + "".join(f"\nViolation: {v}\n" for v in doc["violations"])
    )


def elastic_phases_text(doc: dict) -> str:
    """Where a reconfiguration's time goes, per size (bench/elastic.py's reconfiguration_phases)."""
    parts = []
    for size in doc["sizes"]:
        p = size.get("reconfiguration_phases") or {}
        if {"old_generation_ended", "new_job_created", "new_generation_usable"} <= set(p):
            parts.append(
                f"{size['members']} members {p['old_generation_ended']['median_ms']:.0f} / "
                f"{p['new_job_created']['median_ms']:.0f} / {p['new_generation_usable']['median_ms']:.0f} ms"
            )
    if not parts:
        return ""
    return (
        "\nWhere a reconfiguration's time goes (medians): the commit's agreement and the old generation's job "
        "ending / the next generation's job created by the client's driver / that job's ranks placed by Dask, "
        "joined, their communicator built, the state restored and the first allreduce done: "
        + "; ".join(parts)
        + ". The last part alone is about what a plain job's start costs on this machine: with each generation a job "
        "of its own, the first two would have to vanish for a change of members to take under 100 ms at 16 "
        "members here.\n"
    )


def elastic_section() -> str:
    """Elastic jobs (bench/elastic.py): a change of members against restarting the job."""
    doc = load("elastic.json")
    rows = [
        "| members | reconfiguration: median / p99 (n) | a plain job's start: median / p99 (n) | killed member: "
        "resumed after, median / max (n) | release by Adaptive: median / max (n), bound | restart baseline: "
        "median (n) | baseline over reconfiguration |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ms(d: dict, a: str, b: str) -> str:
        return f"{d[a]:.0f} / {d[b]:.0f} ms ({d['n']})" if d else "-"

    for size in doc["sizes"]:
        base = size.get("restart_baseline") or {}
        restart = f"{base['median_ms']:.0f} ms ({base['n']})" if base else "-"
        adaptive = ms(size.get("adaptive_release") or {}, "median_ms", "max_ms")
        if size.get("adaptive_release_bound_ms"):
            adaptive += f", {size['adaptive_release_bound_ms']:.0f} ms"
        rows.append(
            f"| {size['members']} | {ms(size.get('reconfiguration') or {}, 'median_ms', 'p99_ms')} | "
            f"{ms(size.get('plain_job_start') or {}, 'median_ms', 'p99_ms')} | "
            f"{ms(size.get('killed_member') or {}, 'median_ms', 'max_ms')} | {adaptive} | {restart} | "
            f"{size.get('restart_over_reconfiguration', '-')}x |"
        )
    return (
        "An elastic job (`run_elastic`) of M members on M + 1 workers, committing every "
        f"{doc['step_ms']:.0f} ms, in the default configuration (Open MPI's in-process pool), on a "
        f"{doc['cpus']}-core machine, {_loads(doc['load_avg']['start'], doc['load_avg']['end'])}. "
        "A reconfiguration: the job's last member is drained (as Dask's retirement does), leaves at the next "
        "commit and the spare worker takes its place; timed from rank 0 entering that commit to the next "
        "generation's communicator having carried an allreduce on every member (the state is a few numbers). "
        "A plain job's start: `run_mpi` over M of the same workers, none restarted, from the call to its first "
        "allreduce on every member, the least a generation's start costs. "
        "A killed member: kill -9 of a member's worker; from the kill to the next generation's first allreduce. "
        "A release by Adaptive: `cluster.adapt(minimum=M - 1, maximum=M - 1, interval='500ms', wait_count=3)` while "
        "the job runs; Dask offers Adaptive only the spare, so the job gives its last member back at a commit, and "
        "Adaptive retires it; from the drain's request (Adaptive's first proposal naming the member) to the worker "
        "gone from the scheduler, against the bound of Adaptive's cycle (1.5 s) plus one commit interval plus one "
        "reconfiguration. "
        "The restart baseline is what a launcher without elasticity does on the same event (torchrun restarts "
        "every process of the job): the M members' workers restarted, then the job started again over M "
        "workers, to its first allreduce. One Dask setting differs from its default: "
        "`distributed.deploy.lost-worker-timeout` is put past the run, since a LocalCluster closes for good a "
        "worker it finds missing that long after a loss (one restarting, or killed again); it changes no time "
        "measured. Source: `bench/results/elastic.json`.\n\n"
        + "\n".join(rows)
        + "\n"
        + elastic_phases_text(doc)
        + adaptive_plain_text()
        + elastic_kills_text()
    )


def adaptive_plain_text() -> str:
    """Dask's own Adaptive scale-down (bench/adaptive_plain.py), beside the releases by Adaptive."""
    if not (RESULTS / "adaptive-plain.json").exists():
        return ""
    d = load("adaptive-plain.json")
    return (
        f"\nA release over its bound waited for Adaptive's scale-down before it, which waits for the closed "
        f"workers' processes to end. Dask alone does the same: on a plain LocalCluster of {d['workers']} workers "
        f"(no dask-pmix), with the same Adaptive settings, {d['killed_after_4s']} of {d['closes']} closing workers "
        f"were still alive after 4 s and were killed by their nannies, so Adaptive's next round came that much later "
        f"({d['rounds']} scale-downs, {d['scale_down_s']['median']} s each at the median). "
        "Source: `bench/results/adaptive-plain.json`.\n"
    )


def elastic_kills_text() -> str:
    """Random kills (bench/elastic_kills.py): no hang, results bitwise equal, work lost per kill."""
    if not (RESULTS / "elastic-kills.json").exists():
        return ""
    d = load("elastic-kills.json")
    resumed, again = d["resumed_s"], d["steps_again_per_kill"]
    return (
        f"\nUnder random kills: {d['runs']} runs of an elastic job over {d['workers']} workers ({d['steps']} steps "
        f"of a deterministic iteration over {d['length']:,} float64s, committing every {d['commit_every']} steps), "
        f"each with kill -9 of a random member's worker at a random moment (while it computes or commits), and "
        f"up to {d['kills_per_run'] - 1} more while the job recovers (restores its state, takes the restarted worker "
        f"back). {d['ok']} finished, {d['failed']} failed, {d['hung']} hung; {d['bitwise_equal']} ended "
        f"bitwise equal to a run without faults. The next generation was usable {resumed.get('median', '-')} s after "
        f"a kill at the median ({resumed.get('max', '-')} s at most, {d['killed']} kills, up to {d['kills_per_run']} "
        f"per run, the later ones while the job recovered), and the steps computed again per kill were "
        f"{again.get('median', '-')} at the median and {again.get('max', '-')} at most in a run (one commit interval "
        f"is {d['commit_every']}). "
        + "".join(
            f"The bench stopped after run {c['after_run']}: a killed worker was not back in Dask and ready in the pool "
            f"within 180 s (Dask saw {len(c['dask_workers'])} of {d['workers']} workers, although its nanny had "
            "logged the restart); what keeps it away is not known yet. "
            for c in d.get("cluster_not_whole", [])
        )
        + "".join(
            f"Run {r['run']} failed: {r.get('error', '')[:300]} "
            for r in d.get("records", [])
            if r.get("outcome") == "failed"
        )
        + (
            f"After a kill, {cache['shrunk']} generations over the survivors shrank the communicator they kept "
            f"(`MPI_Comm_shrink`) instead of building one through the sidecar. "
            if (cache := d.get("comm_cache") or {}).get("shrunk")
            else ""
        )
        + f"{_loads(d['load_avg']['start'], d['load_avg']['end']).capitalize()}. "
        "`distributed.deploy.lost-worker-timeout` is put past the run, as above. "
        "Source: `bench/results/elastic-kills.json`.\n"
    )


def floor_section() -> str:
    """A later in-process job against Dask's own floor (bench/job_breakdown.py), and where its time goes."""
    names = [f"job_breakdown-{m}.json" for m in (2, 4, 8, 16)]
    docs = [load(n) for n in names if (RESULTS / n).exists()]
    rows = [
        "| M | `run_mpi` job | the same, cache off | a job of `comm.rank` | Dask's floor | ratio | ratio, "
        "`comm.rank` | traced job: ranks start / communicator ready / tasks finished |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def last(t: dict, name: str) -> str:
        """The phase's median time, of its last member where each member has one."""
        v = t.get(name)
        return f"{(v[1] if isinstance(v, list) else v):.0f}" if v is not None else "-"

    def opt(d: dict, key: str, unit: str = " ms", digits: int = 1) -> str:
        v = d.get(key)
        return f"{v:.{digits}f}{unit}" if v is not None else "-"

    for d in docs:
        t = d["median_ms_since_call"]
        rows.append(
            f"| {d['size']} | {d['job_ms']:.1f} ms | {opt(d, 'job_built_ms')} | {opt(d, 'job_trivial_ms')} | "
            f"{d['dask_floor_ms']['one_graph_secede_gather']:.1f} ms | "
            f"{d['ratio_to_dask_floor']:.2f}x | {opt(d, 'ratio_trivial_to_dask_floor', 'x', 2)} | "
            f"{last(t, 'worker member>')} / {last(t, 'worker comm<')} / "
            f"{last(t, 'task-finished')} ms |"
        )
    loads = ", ".join(f"{d['load_average'][0]:.1f}" for d in docs)
    return (
        "A later job over the same M in-process workers (`run_mpi` of an Allreduce, from the call to its "
        "return) against the least Dask itself takes for the same shape of work: M trivial tasks pinned one per "
        "worker, submitted in one graph, seceding as ranks do, and gathered. Both alternate in one run, each "
        "after 0.3 s of quiet; medians of 20. The job adds, in order: the sidecar's job creation (one request "
        "from the scheduler), the members' join barrier in the scheduler, the job's communicator (a later job "
        "duplicates the one its members kept from the first, `MPI_Comm_dup`; with the communicator cache off, "
        "`dask-pmix.pool.comm-cache: 0`, each builds its own with `MPI_Comm_create_from_group`, a PMIx group in "
        "the sidecar: the third column, alternating with the others), and the job's completion. The fourth "
        "column is the same later job with a function that only returns `comm.rank`, as the floor's tasks do "
        "nothing. The last column "
        f"times those steps in traced jobs of the same run (ms since the call). Load average {loads} (M = "
        f"{', '.join(str(d['size']) for d in docs)}). Source: `bench/results/job_breakdown-<M>.json`.\n\n"
        + "\n".join(rows)
        + "\n"
    )


PAGE_HEAD = """# Performance

Every figure and number on this page is generated at build time by `docs/gen/perf.py` from the
JSON the benchmarks under `bench/` record in `bench/results/`. The benchmarks run both sides in
one run (ours and the MPI library's own launcher, or `tcp://`), so ratios are meaningful even on a
loaded machine; absolute times are upper bounds on the 2-core machine they ran on. Each caption
says what is timed, the machine, the load during the run and the configuration.

## Headline

"""


# --- workloads: MPI on Dask's data (bench/stencil.py, fft.py, kmeans.py) ----------------------


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB" if b >= 2**20 else f"{b / 2**10:.0f} KiB"


def fig_stencil(plt, out: Path, doc: dict) -> str:
    """The stencil's curve: both sides' seconds over the array's size, log-log, with the ratio."""
    sizes = doc["sizes"]
    mib = [s["mib"] for s in sizes]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3))
    ax.plot(mib, [s["dask"]["median_s"] for s in sizes], "o-", label="Dask (map_overlap)")
    ax.plot(mib, [s["mpi"]["median_s"] for s in sizes], "s-", label="MPI job (map_blocks_mpi)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("array (MiB)")
    ax.set_ylabel("seconds, 100 sweeps (median)")
    ax.legend(frameon=False, fontsize=8)
    ax2.plot(mib, [s["ratio_dask_over_mpi"] for s in sizes], "o-")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("array (MiB)")
    ax2.set_ylabel("Dask time / MPI time")
    path = _save(fig, out, "stencil")
    plt.close(fig)
    return path


def _workload_rows(doc: dict, extra: str, mpi_bytes) -> list[str]:
    rows = [
        f"| size | Dask | MPI job | Dask / MPI | Dask moved | MPI job: Dask moved / MPI sent | {extra} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in doc["sizes"]:
        d, m = s["dask"], s["mpi"]
        diff = s.get(
            "max_abs_difference", s.get("max_relative_difference", s.get("max_relative_difference_of_centroids"))
        )
        rows.append(
            f"| {s['mib']} MiB | {d['median_s']:.3f} s | {m['median_s']:.3f} s | {s['ratio_dask_over_mpi']:.2f}x | "
            f"{_mib(d['bytes_moved_between_workers'])} | {_mib(m['bytes_moved_between_workers_by_dask'])} / "
            f"{_mib(mpi_bytes(m))} | {diff:.1e} |"
        )
    return rows


def _runs(doc: dict) -> str:
    loads = [s["load_average_at_start"][0] for s in doc["sizes"]]
    runs = [len(s["dask"]["runs_s"]) for s in doc["sizes"]]
    return (
        f"{doc['workers']} workers of one thread ({doc['configuration']}); medians of "
        f"{min(runs)} to {max(runs)} "
        f"alternating runs per size; load average {min(loads):.1f} to {max(loads):.1f} at the sizes' starts; "
        f"{doc['machine']['cpus']} cores; commit {doc['commit']}"
    )


def workloads_section(plt, out: Path) -> str:
    """The three workloads of docs/user-guide/workloads.md, each against Dask alone on the same
    persisted input; a workload whose results file is absent is left out, saying so."""
    parts = [
        "Three programs run both ways on the same cluster and the same persisted input "
        "([the workloads page](user-guide/workloads.md) has them as runnable examples): each figure "
        "times, from the first call to every output block in memory, Dask's best way found (its graph, "
        "submission and execution) and the whole `map_blocks_mpi` call (placement, admission, "
        "communicator, hand-off, the ranks' work, the output check and the output array of futures). "
        "Both give the same numbers: the last column is the largest difference between them. "
        "'Dask moved' is what the workers sent each other through Dask during the run; 'MPI sent' "
        "is what the ranks sent each other over MPI.\n"
    ]
    if (RESULTS / "stencil.json").exists():
        doc = load("stencil.json")
        path = fig_stencil(plt, out, doc)
        parts.append(
            f"### Iterative stencil\n\n```{{figure}} {path}\n:width: 100%\n\n"
            f"{doc['iterations']} Jacobi sweeps of a 2-D float64 array in {doc['blocks']}: Dask's "
            "`map_overlap` loop (per size the fastest of six variants, each tried once) against one MPI job "
            f"exchanging halo rows and columns. Crossover: {doc['crossover']}. {_runs(doc)}. "
            "Source: `bench/results/stencil.json`.\n```\n\n"
            + "\n".join(_workload_rows(doc, "max abs difference", lambda m: m["halo_bytes_over_mpi"]))
            + "\n"
        )
    else:
        parts.append("### Iterative stencil\n\nNo results recorded yet (`bench/stencil.py`).\n")
    if (RESULTS / "fft.json").exists():
        doc = load("fft.json")
        parts.append(
            "### All-to-all: 2-D FFT\n\nRow slabs, one per worker, to the 2-D FFT in column slabs: Dask's "
            f"`fft` / `rechunk` ({doc['dask_variants']['chosen']}, the faster at {doc['dask_variants']['size']}^2) "
            "/ `fft` against one MPI job with one `Alltoallv`. Sizes are the real input's; the output is "
            f"complex, twice as large. {_runs(doc)}. Source: `bench/results/fft.json`.\n\n"
            + "\n".join(_workload_rows(doc, "max relative difference", lambda m: m["alltoallv_bytes_over_mpi"]))
            + "\n"
        )
    if (RESULTS / "kmeans.json").exists():
        doc = load("kmeans.json")
        parts.append(
            f"### k-means\n\n{doc['k']} clusters of {doc['dimensions']}-D points, {doc['iterations']} Lloyd "
            "iterations from the same centroids: Dask-ML's way (a graph per iteration, centroids on the client) "
            "against one MPI job with an `Allreduce` per iteration ('MPI sent' is what each rank sent in its "
            f"Allreduces). {_runs(doc)}. "
            "Source: `bench/results/kmeans.json`.\n\n"
            + "\n".join(
                _workload_rows(doc, "centroids' max relative difference", lambda m: m["allreduce_bytes_per_rank"])
            )
            + "\n"
        )
    return "\n".join(parts)


def tasks_section() -> str:
    """Whole Dask tasks over tcp+mpi:// against tcp:// (bench/comm.py --only tasks)."""
    if not (RESULTS / "comm-tasks.json").exists():
        return "No whole-task results recorded yet (`bench/comm.py --only tasks`).\n"
    top = load("comm-tasks.json")
    doc = top["tasks"]
    rows = [
        "| dependency | pair | `tcp://` | `tcp+mpi://` | ratio | `tcp+mpi://` as a fraction of a copy "
        "| floor: a 1 KiB task + one copy | best ratio the floor allows |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    small = {r["kind"]: r["tcp+mpi://"]["better_s"] for r in doc["rows"] if r["row"] == "1 KiB"}
    for r in doc["rows"] + doc["rechunk"]:
        t, m = r["tcp://"], r["tcp+mpi://"]
        task = r in doc["rows"] and r["row"] != "1 KiB" and r["kind"] in small
        floor = small[r["kind"]] + m["copy_s"] if task else None
        rows.append(
            f"| {r['row']} | {r['kind']} | {t['better_s'] * 1e3:.1f} ms | {m['better_s'] * 1e3:.1f} ms | "
            f"{r['ratio']:.2f}x | {m['fraction_of_copy']:.2f} | "
            + (f"{floor * 1e3:.1f} ms | {t['better_s'] / floor:.2f}x |" if floor else "| |")
        )
    load_avg = [a["load_avg_1m"] for r in doc["rows"] for a in r["alternations"]]
    return (
        "A task on worker B that reads results made on worker A, timed from the client's submit to its "
        "result, each scheme on its own `LocalCluster` in the default configuration, both alive for the whole "
        "run and alternating round by round. Pairs: `cohort` (workers that started together: MPI over shared "
        "memory), `late` (a worker added 20 s later) and `restarted` (a worker its nanny restarted), whose "
        "large frames the receiver copies out of the sender's memory (the single-copy path); the producers "
        "are cohort workers. Each figure is the better of two alternations' medians; the ratio is `tcp://` over "
        "`tcp+mpi://` (above 1: `tcp+mpi://` is faster). The sixth column is a copy of the same bytes into fresh "
        "memory in the consumer, measured in the same run, over the task's time (1.0: the task costs one "
        "copy). The floor is what no transport can go below: the same pair's 1 KiB task (a task's cost "
        "without its data) plus one copy of the bytes into fresh memory; the last column is `tcp://` over it, "
        "the highest ratio a transport could reach in this run (none for the rechunk, whose tasks also slice "
        f"and concatenate). Load average {min(load_avg):.1f} to {max(load_avg):.1f}; {top['cpus']} cores; "
        f"{top['machine']}; "
        f"commit {top['git']}. Source: `bench/results/comm-tasks.json`.\n\n" + "\n".join(rows) + "\n"
    )


def write_page(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    sections = [
        (
            "Jobs, Open MPI",
            fig_headline(plt, out, "headline-openmpi.json", "mpirun", "mpirun", "run_mpi vs mpirun, Open MPI 5.0.11"),
        ),
        (
            "Jobs, MPICH",
            fig_headline(
                plt, out, "headline-mpich.json", "mpiexec_hydra", "mpiexec (hydra)", "run_mpi vs mpiexec, MPICH 5.0.2"
            ),
        ),
        ("PMIx server", fig_pmix(plt, out)),
        ("PMI server", fig_pmi(plt, out)),
        ("Dask's traffic over MPI", fig_comm(plt, out)),
        ("REST API", fig_rest(plt, out)),
    ]
    body = [PAGE_HEAD + readme_table()]
    body.append("## Dask tasks over `tcp+mpi://`\n\n" + tasks_section())
    for title, (path, caption) in sections:
        body.append(f"## {title}\n\n```{{figure}} {path}\n:width: 100%\n\n{caption}\n```\n")
    body.append("## A job against Dask's own floor\n\n" + floor_section())
    body.append("## Elastic jobs\n\n" + elastic_section())
    body.append("## Workloads: MPI on Dask's data\n\n" + workloads_section(plt, out))
    body.append("## Reliability soak\n\n" + soak_section())
    (out / "performance.md").write_text("\n".join(body))


if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        sys.stdout.write(readme_table())
    elif len(sys.argv) == 2:
        write_page(Path(sys.argv[1]))
    else:
        sys.exit(__doc__)
