"""The dask-pmix page in the Dask dashboard (/dask-pmix/ on the scheduler's HTTP server) and at a
standalone sidecar's `/`, loaded in a real headless Chromium against a live cluster whose workers
talk tcp+mpi://: the timeline of jobs across workers (a running job, its end, a failed job), the
pool epoch's ranks in use, the MPI bytes of a transfer, the tables; and the relay, which carries
the page's view alone (no namespaces, pids or uids) and can be turned off."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import dask
import pytest

from dask_pmix import run_mpi

from .conftest import IMPL, start_cluster

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "browser" / "probe.mjs"
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the page is the same whatever the MPI library")


class Browser:
    def __init__(self):
        self.proc = subprocess.Popen(["node", str(PROBE)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = {}
        reader = threading.Thread(target=lambda: answer.update(json.loads(self.proc.stdout.readline() or "{}")))
        reader.start()
        reader.join(90)
        assert answer, f"the browser did not answer {cmd} within 90 s"
        assert answer.get("ok"), answer
        assert not answer["pageErrors"], answer["pageErrors"]
        return answer

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def column(rows: list[list[str]], i: int) -> list[str]:
    return [r[i] for r in rows]


def _until(browser, expression, what, timeout=30):
    """Polls a page expression until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = browser(eval=expression)["value"]
        if value:
            return value
        assert time.monotonic() < deadline, f"the page did not show {what} within {timeout} s"
        time.sleep(0.2)


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def _fails(comm):
    if comm.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    comm.Barrier()


def test_the_page_shows_jobs_across_workers_epochs_and_traffic_live(tmp_path):
    cluster, client, sidecar = start_cluster(3, protocol="tcp+mpi://")
    browser = Browser()
    release = tmp_path / "release"
    try:
        workers = sorted(client.scheduler_info()["workers"])
        deadline = time.monotonic() + 120  # every worker in the pool, so that the jobs run in-process
        while not all((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()):
            assert time.monotonic() < deadline, sidecar.workers()
            time.sleep(0.2)
        sidecar.define_pset("pair", members=workers[:2])
        dashboard = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}/dask-pmix/"

        def held(comm, flag):
            deadline = time.monotonic() + 60
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.05)
            return comm.allreduce(1)

        outcome = {}
        job = threading.Thread(target=lambda: outcome.update(results=run_mpi(client, held, str(release),
                                                                             workers=workers[1:], impl=IMPL)))
        job.start()
        deadline = time.monotonic() + 30
        while not [j for j in sidecar.jobs() if j["state"] == "running"]:
            assert time.monotonic() < deadline, sidecar.jobs()
            time.sleep(0.1)
        running_job = next(j for j in sidecar.jobs() if j["state"] == "running")
        job_id = running_job["id"]
        assert running_job["mode"] == "inprocess", running_job

        assert browser(goto=dashboard)["status"] == 200
        browser(waitText=["#jobs", job_id])
        browser(waitText=["#status", "live"])
        pool = browser(rows="#pool")["rows"]
        assert sorted(column(pool, 0)) == workers
        states = dict(zip(column(pool, 0), column(pool, 2)))
        assert states == {workers[0]: "available", workers[1]: "frozen", workers[2]: "frozen"}
        seats = {w["id"]: w.get("pool") for w in sidecar.workers()}
        for row in pool:  # epoch and pool rank as the sidecar has them
            seat = seats[row[0]]
            assert (row[4], row[5]) == ((str(seat["epoch"]), str(seat["rank"])) if seat else ("", ""))
        assert browser(rows="#psets")["rows"][0][:2] == ["pair", ", ".join(workers[:2])]
        running = next(r for r in browser(rows="#jobs")["rows"] if r[0] == job_id)
        assert running[1] == "running"
        assert running[4] == f"0: {workers[1]} connected; 1: {workers[2]} connected", running

        # The timeline: a running bar for each member of the job, on its worker's row.
        short = [w.split("://", 1)[1] for w in workers]
        bars = _until(browser, f"daskPmix.timeline().filter(b => b.job === {job_id!r})", "the running job")
        assert sorted((b["worker"], b["rank"], b["outcome"]) for b in bars) == \
            [(short[1], 0, "running"), (short[2], 1, "running")], bars
        # The pool's epoch: the job's two members are its ranks in use.
        epoch = seats[workers[1]]["epoch"]
        epochs = _until(browser, "daskPmix.epochs()", "the pool's epochs")
        mine = next(e for e in epochs if e["label"].startswith(f"epoch {epoch} "))
        assert mine["in a running job"] == 2 and mine["seated, idle"] == 1, epochs
        browser(screenshot=str(tmp_path / "dashboard-running.png"))

        # The job ends: the page follows without a reload, and its bars say how it ended.
        release.touch()
        job.join(60)
        assert outcome.get("results") == [2, 2]
        browser(waitText=["#jobs", "completed"])
        bars = _until(browser, f"daskPmix.timeline().filter(b => b.job === {job_id!r} && b.state === 'completed')",
                      "the completed job")
        assert {b["outcome"] for b in bars} == {"completed, in-process"} and len(bars) == 2, bars
        assert set(column(browser(rows="#pool")["rows"], 2)) == {"available"}

        # A failed job is marked as failed on the timeline.
        with pytest.raises(Exception, match="fails on purpose"):
            run_mpi(client, _fails, workers=workers[:2], impl=IMPL)
        failed = next(j for j in sidecar.jobs() if j["state"] == "failed")
        bars = _until(browser, f"daskPmix.timeline().filter(b => b.job === {failed['id']!r} && b.state === 'failed')",
                      "the failed job")
        assert {b["outcome"] for b in bars} == {"failed / aborted"} and len(bars) == 2, bars

        # Dask's own traffic: 8 MiB from one worker to another goes over MPI, and the page shows it.
        data = client.submit(lambda: os.urandom(8 << 20), workers=[workers[0]], pure=False)
        assert client.submit(len, data, workers=[workers[1]]).result() == 8 << 20
        traffic = _until(browser, f"daskPmix.traffic().filter(t => t.worker === {short[1]!r} && t.mpi >= {8 << 20})",
                         "the MPI bytes of the transfer", timeout=60)
        assert traffic[0]["mpi"] > traffic[0]["tcp"], traffic
        assert traffic[0]["cma"] == 0, traffic  # a cohort pair: nothing by single copy
        browser(screenshot=str(tmp_path / "dashboard.png"))

        # The relay carries the page's view and nothing else: no namespace, pid or uid, no other route.
        status, text = _get(dashboard + "v1/dashboard")
        assert status == 200
        for w in sidecar.workers():
            assert w["pool"]["namespace"] not in text and f'"pid": {w["pid"]}' not in text
        assert all(j["namespace"] not in text for j in sidecar.jobs())
        assert not re.search(r'"(pid|uid|gid|namespace)"', text), text[:500]
        for other in ("v1/jobs", "v1/workers", "v1/events", f"v1/jobs/{job_id}/env/{workers[1]}"):
            assert _get(dashboard + other)[0] == 404, other
        # ... and is off with dask-pmix.dashboard.relay: false.
        with dask.config.set({"dask-pmix.dashboard.relay": False}):
            assert _get(dashboard)[0] == 404 and _get(dashboard + "v1/dashboard")[0] == 404

        # The standalone sidecar serves the same page at `/`; its reads want the token.
        assert browser(goto=sidecar.url + "/")["status"] == 200
        browser(waitText=["#status", "not reachable"])
        browser(fill=["#token", sidecar.token])
        browser(click="#auth button")
        browser(waitText=["#jobs", job_id])
        assert sorted(column(browser(rows="#pool")["rows"], 0)) == workers
        _until(browser, f"daskPmix.timeline().filter(b => b.job === {job_id!r})", "the job at the sidecar's page")

        # A worker replaced (as one stuck inside MPI asks to be) is a notice, with why.
        client.sync(client.scheduler.dask_pmix_replace_worker, worker=workers[0], reason="stuck inside MPI (a test)")
        browser(waitText=["#notices", "replaced by dask-pmix: stuck inside MPI (a test)"])
        # It leaves the pool, then the sidecar's workers (as a worker expected back): both say why.
        notices = [(r[1], r[2]) for r in browser(rows="#notices")["rows"] if "stuck inside MPI" in r[3]]
        assert ("left the pool", workers[0]) in notices, notices
        if os.environ.get("DASK_PMIX_SCREENSHOT"):
            (ROOT / "docs").mkdir(exist_ok=True)
            (ROOT / "docs" / "dashboard.png").write_bytes((tmp_path / "dashboard.png").read_bytes())
    finally:
        release.touch()
        browser.close()
        client.close()
        cluster.close()
