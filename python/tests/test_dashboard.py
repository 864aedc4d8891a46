"""The dask-pmix page in the Dask dashboard (/dask-pmix/ on the scheduler's HTTP server) and at a
standalone sidecar's `/`, loaded in a real headless Chromium against a live cluster: the pool, a
process set, a running job with its members, its end shown without a reload, and the events."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

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


def test_the_page_shows_pool_psets_jobs_and_events_live(tmp_path):
    cluster, client, sidecar = start_cluster(3)
    browser = Browser()
    release = tmp_path / "release"
    try:
        workers = sorted(client.scheduler_info()["workers"])
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
        job_id = next(j["id"] for j in sidecar.jobs() if j["state"] == "running")

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
        browser(screenshot=str(tmp_path / "dashboard.png"))

        # The job ends: the page follows without a reload.
        release.touch()
        job.join(60)
        assert outcome.get("results") == [2, 2]
        browser(waitText=["#jobs", "completed"])
        browser(waitText=["#events", f"{job_id}: running → completed"])
        events = browser(rows="#events")["rows"]
        assert "jobStateChanged" in column(events, 2)
        browser(waitText=["#events", f"{workers[2]}: frozen → available"])
        assert set(column(browser(rows="#pool")["rows"], 2)) == {"available"}

        # The standalone sidecar serves the same page at `/`; its reads want the token.
        assert browser(goto=sidecar.url + "/")["status"] == 200
        browser(waitText=["#status", "not reachable"])
        browser(fill=["#token", sidecar.token])
        browser(click="#auth button")
        browser(waitText=["#jobs", job_id])
        assert sorted(column(browser(rows="#pool")["rows"], 0)) == workers
        browser(waitText=["#events", "jobStateChanged"])
        if os.environ.get("DASK_PMIX_SCREENSHOT"):
            (ROOT / "docs").mkdir(exist_ok=True)
            (ROOT / "docs" / "dashboard.png").write_bytes((tmp_path / "dashboard.png").read_bytes())
    finally:
        release.touch()
        browser.close()
        client.close()
        cluster.close()
