"""Runs one module of mpi4py's own test suite in this MPI rank and returns every test's outcome.

The same code runs under `mpiexec` (ref_rank.py), inside a dask-pmix in-process member and in a
fork-mode rank, so the three configurations differ only in how the rank got its MPI. The module
runs unchanged, loaded as mpi4py's runner (test/main.py) loads it: the sdist's test directory
first on sys.path (the modules import mpiunittest, arrayimpl, ... from it), CuPy and Numba hidden
as main.py hides them by default, and mpiunittest.skipMPI's known failures left on (main.py's
default, as in mpi4py's CI).

A rank appends `start <id>`, `end <id> <outcome>` and `stop <id>` lines to a progress file as it goes, so that a
module that hangs or kills its rank still says which test it was in.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import unittest

# Worst first: a test's outcome over the ranks is the worst of its ranks' outcomes.
OUTCOMES = ("error", "fail", "xpass", "pass", "xfail", "skip")


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(testdir: str, err) -> tuple[str, str, str]:
    """(one line: exception and message, where in the test dir it was raised, a short traceback)."""
    etype, value, tb = err
    line = "".join(traceback.format_exception_only(etype, value)).strip().splitlines()
    message = _short(line[-1] if line else etype.__name__)
    where = ""
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith(testdir):
            where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    text = "".join(traceback.format_exception(etype, value, tb))
    return message, where, text[-1500:]


class _Result(unittest.TestResult):
    def __init__(self, testdir: str, progress):
        super().__init__()
        self.testdir = testdir
        self.progress = progress
        self.tests: dict[str, dict] = {}
        self._t0 = 0.0

    def _log(self, line: str) -> None:
        if self.progress is not None:
            self.progress.write(line + "\n")
            self.progress.flush()

    def startTest(self, test):
        super().startTest(test)
        self._t0 = time.monotonic()
        self._log(f"start {test.id()}")

    def stopTest(self, test):
        super().stopTest(test)
        self._log(f"stop {test.id()}")

    def _record(self, test, outcome: str, err=None, message: str = "") -> None:
        entry = {"outcome": outcome, "seconds": round(time.monotonic() - self._t0, 4)}
        if err is not None:
            entry["message"], entry["where"], entry["traceback"] = _reason(self.testdir, err)
        elif message:
            entry["message"] = _short(message)
        old = self.tests.get(test.id())
        # A test with subtests: keep its worst outcome and the first failing subtest's reason.
        if old is None or OUTCOMES.index(outcome) < OUTCOMES.index(old["outcome"]):
            self.tests[test.id()] = entry
        self._log(f"end {test.id()} {outcome}")

    def addSuccess(self, test):
        super().addSuccess(test)
        self.tests.setdefault(test.id(), {"outcome": "pass", "seconds": round(time.monotonic() - self._t0, 4)})
        self._log(f"end {test.id()} pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", err)

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass/setUpModule errors come as a _ErrorHolder whose id names the fixture.
        self._record(test, "error", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", message=reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "xpass")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "fail" if issubclass(err[0], test.failureException) else "error"
            self._record(test, outcome, err)


def _hide_optional_modules() -> None:
    # test/main.py's defaults (--no-cupy, --no-numba): those array types are not tested.
    for name in ("cupy", "numba"):
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]


def run_module(
    testdir: str, module: str, progress_path: str | None = None, comm=None, exclude: list[str] | None = None
) -> dict:
    """Runs test module `module` of `testdir` here; returns this rank's outcomes.

    `comm`: the communicator a dask-pmix job hands its function (to report the rank; the module
    itself uses MPI.COMM_WORLD as it always does). `exclude`: fnmatch patterns of test ids left
    out (as main.py's -x)."""
    import fnmatch

    t0 = time.monotonic()
    testdir = os.path.abspath(testdir)
    if testdir not in sys.path:
        sys.path.insert(0, testdir)
    _hide_optional_modules()
    from mpi4py import MPI

    world = comm if comm is not None else MPI.COMM_WORLD
    name, version = MPI.get_vendor()
    out: dict = {
        "rank": world.Get_rank(),
        "size": world.Get_size(),
        "pid": os.getpid(),
        "tests": {},
        "library": f"{name} {'.'.join(map(str, version))}",
    }
    progress = open(progress_path, "a", buffering=1) if progress_path else None  # noqa: SIM115
    try:
        try:
            mod = __import__(module)
        except Exception:
            out["import_error"] = _short(traceback.format_exc().strip().splitlines()[-1])
            out["import_traceback"] = traceback.format_exc()[-1500:]
            return out
        suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
        if exclude:
            suite = _filtered(suite, lambda tid: not any(fnmatch.fnmatchcase(tid, p) for p in exclude))
        result = _Result(testdir, progress)
        suite.run(result)
        out["tests"] = result.tests
        out["ran"] = result.testsRun
    finally:
        out["seconds"] = round(time.monotonic() - t0, 3)
        if progress is not None:
            progress.write(f"done {out['seconds']}\n")
            progress.close()
    return out


def _filtered(suite, keep):
    new = unittest.TestSuite()
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            new.addTest(_filtered(item, keep))
        elif keep(item.id()):
            new.addTest(item)
    return new


def job(comm, testdir: str, module: str, progress_dir: str | None = None, exclude: list[str] | None = None) -> dict:
    """The function of one dask-pmix job: `run_mpi(client, job, testdir, module, ...)`."""
    progress = os.path.join(progress_dir, f"rank-{comm.Get_rank()}.log") if progress_dir else None
    return run_module(testdir, module, progress, comm=comm, exclude=exclude)


def probe(comm) -> int:
    """A trivial job: the run's check that the cluster is back before the next module."""
    return comm.allreduce(1)


def where(comm) -> int:
    """The process a rank runs in: the run's check that in-process ranks are the workers."""
    return os.getpid()
