"""distributed's comm contract against tcp+mpi://, over TCP (this process is in no pool) and over
MPI (a process started by Open MPI's own launcher, whose world is its pool).

The checks are distributed's own (distributed.comm.tests.test_comms: check_client_server,
check_comm_closed_implicit/explicit, check_connect_timeout, check_many_listeners,
check_deserialize*, check_repr, check_addresses) where distributed's tests are installed; its
wheels and sdists leave them out, so tests/comm_contract.py states the same contract and runs
always. Set DASK_PMIX_DISTRIBUTED_SRC to a checkout of distributed to run its helpers as well.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from dask_pmix.comm import comm_stats, link, stats

from . import comm_contract
from .comm_contract import CHECKS, scheme_addr, upstream_checks

ADDR = scheme_addr("tcp+mpi")
IMPL = os.environ.get("DASK_PMIX_TEST_IMPL", "openmpi")
UPSTREAM = upstream_checks()
NO_UPSTREAM = ("distributed's comm test helpers are not installed (its wheels and sdists ship no tests); "
               "set DASK_PMIX_DISTRIBUTED_SRC to a distributed checkout to run them")


@pytest.fixture
def no_pool():
    link.set_link(None)
    stats.reset()
    yield
    stats.reset()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_contract_over_tcp(name, no_pool):
    """A process outside any pool: every tcp+mpi connection is TCP, and still keeps the contract."""
    asyncio.run(asyncio.wait_for(CHECKS[name](ADDR), 120))
    s = comm_stats()
    assert s["mpi"]["connections"] == 0 and s["mpi"]["bytes_sent"] == 0
    if name not in ("connect_timeout", "many_listeners"):
        assert s["tcp"]["connections"] > 0 and s["tcp"]["messages_sent"] > 0


@pytest.mark.skipif(UPSTREAM is None, reason=NO_UPSTREAM)
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_upstream_contract_over_tcp(name, no_pool):
    asyncio.run(asyncio.wait_for(UPSTREAM[name](ADDR), 120))


@pytest.mark.skipif(IMPL != "openmpi", reason="the launcher world uses Open MPI's prterun and Sessions")
def test_contract_over_mpi():
    """One process under Open MPI's launcher: both ends of every connection are the same pool
    rank, so each connection runs over a (size-1) pair communicator: frames really go through
    MPI (the self transport), with the same negotiation, tags, framing and engine as between
    workers."""
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    env = {**os.environ, "OMPI_MCA_mpi_yield_when_idle": "1"}
    proc = subprocess.run(
        [mpirun, "--allow-run-as-root", "-n", "1", sys.executable, comm_contract.__file__],
        env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["results"] == dict.fromkeys(CHECKS, "ok")
    if "upstream" in out:
        assert out["upstream"] == dict.fromkeys(CHECKS, "ok")
    # an idle progress engine makes no MPI call (it waits on an event), apart from draining
    # the tags of just-closed connections every 20 ms for a while
    assert out["engine_in_flight"] == 0 and out["idle_polls_per_s"] == 0, out
    s = out["stats"]
    assert s["tcp"]["connections"] == 0  # no connection fell back
    assert s["mpi"]["connections"] > 0 and s["events"]["pair_comms"] == 1
    # the 8 MiB and 4 MiB payloads of the deserialize checks went over MPI, not TCP
    assert s["mpi"]["bytes_received"] >= 8 * 2**20 * 8 and s["tcp"]["bytes_received"] < 2**20
