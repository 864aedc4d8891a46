"""The per-pair path choice of tcp+mpi:// (dask_pmix.comm.paths): shared memory only where both
ends list each other on their node in one epoch, a single copy between other workers of one host,
a fabric only where both were told so, else the TCP stream; the same answer at both ends; each
path with its own threshold."""

from __future__ import annotations

import dask
import pytest

from dask_pmix.comm import paths


def desc(rank, local=(), epoch="ns#0", fabric=False, host=None):
    return {"epoch": epoch, "rank": rank, "local": sorted(local), "fabric": fabric, "pid": 100 + rank, "host": host}


def both(a, b):
    ab, ba = paths.choose(a, b), paths.choose(b, a)
    assert ab == ba  # symmetric: both ends agree without another round trip
    return ab


def test_workers_declared_on_one_node_share_memory():
    p = both(desc(0, {0, 1, 2}), desc(2, {0, 1, 2}))
    assert p is not None and p.name == "sm"


def test_a_worker_that_is_not_on_the_others_node_talks_tcp():
    # rank 3 joined later: alone on its node; the cohort does not list it either
    assert both(desc(0, {0, 1}), desc(3, {3})) is None
    assert paths.why_not(desc(0, {0, 1}), desc(3, {3})) == "path-tcp"


def test_one_sided_locality_is_not_enough():
    # Open MPI's sm transport needs each process to have set the other up at initialisation
    assert both(desc(0, {0, 1}), desc(1, {1})) is None


def test_different_epochs_never_share_a_path():
    a, b = desc(0, {0, 1}, epoch="ns0#0"), desc(1, {0, 1}, epoch="ns1#1")
    assert both(a, b) is None
    assert paths.why_not(a, b) == "other-epoch"


def test_outside_the_pool_is_tcp():
    outside = {"epoch": None, "rank": None}
    assert paths.choose(outside, desc(0, {0})) is None and paths.choose(desc(0, {0}), outside) is None
    assert paths.why_not(desc(0, {0}), outside) == "connector-no-pool"


def test_a_fabric_needs_both_ends():
    assert both(desc(0, fabric=True), desc(5, fabric=False)) is None
    p = both(desc(0, fabric=True), desc(5, fabric=True))
    assert p is not None and p.name == "fabric"
    # shared memory wins over the fabric between processes of one node
    assert both(desc(0, {0, 5}, fabric=True), desc(5, {0, 5}, fabric=True)).name == "sm"


@pytest.mark.parametrize("name,key,value,expect", [
    ("sm", "sm-threshold", "2 MiB", 2 << 20),
    ("fabric", "fabric-threshold", "512 KiB", 512 << 10),
])
def test_each_path_has_its_own_threshold(name, key, value, expect):
    with dask.config.set({f"dask-pmix.comm.{key}": value}):
        local = {0, 1} if name == "sm" else set()
        p = both(desc(0, local, fabric=True), desc(1, local, fabric=True))
    assert p.name == name and p.threshold == expect


def test_the_description_names_what_the_choice_needs():
    from dask_pmix.comm.link import PoolLink

    link = PoolLink(epoch="ns#0", rank=3, MPI=None, create_comm=lambda r, t: None, local_peers=frozenset({3, 1}))
    d = paths.describe(link)
    assert d["epoch"] == "ns#0" and d["rank"] == 3 and d["local"] == [1, 3] and d["fabric"] is False
    assert paths.describe(None) == {"epoch": None, "rank": None}


def test_workers_of_one_host_outside_each_others_node_copy_single():
    # rank 3 joined later on the cohort's host: not on the cohort's node, same kernel and pid namespace
    p = both(desc(0, {0, 1}, host="boot/pid:[1]"), desc(3, {3}, host="boot/pid:[1]"))
    assert p is not None and p.name == "cma" and p.threshold == 1 << 20
    # shared memory first where MPI has it; another host or pid namespace, or the path off: none
    assert both(desc(0, {0, 1}, host="h"), desc(1, {0, 1}, host="h")).name == "sm"
    assert both(desc(0, {0}, host="boot/pid:[1]"), desc(3, {3}, host="boot/pid:[2]")) is None
    assert both(desc(0, {0}, host="h"), desc(3, {3})) is None
    # and never across epochs (the hello is authenticated with the epoch's secret)
    assert both(desc(0, {0}, host="h"), desc(3, {3}, epoch="ns#1", host="h")) is None


def test_the_description_names_the_host_only_when_the_single_copy_is_on():
    from dask_pmix.comm import cma
    from dask_pmix.comm.link import PoolLink

    link = PoolLink(epoch="ns#0", rank=3, MPI=None, create_comm=lambda r, t: None, local_peers=frozenset({3}))
    assert paths.describe(link)["host"] == (cma.host() if cma.available() else None)
    with dask.config.set({"dask-pmix.comm.cma": False}):
        assert paths.describe(link)["host"] is None


def test_a_cohort_can_take_the_single_copy_instead_of_mpi():
    a, b = desc(0, {0, 1}, host="h"), desc(1, {0, 1}, host="h")
    with dask.config.set({"dask-pmix.comm.same-host": "copy"}):
        assert both(a, b).name == "cma"
    with dask.config.set({"dask-pmix.comm.same-host": "bogus"}), pytest.raises(ValueError, match="same-host"):
        paths.choose(a, b)
