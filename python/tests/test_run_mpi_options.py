"""Options that the sidecar would refuse are refused by run_mpi / submit_mpi first, with a
sentence (issue 31): an unknown impl, a timeout that is not a finite number within the
sidecar's bound. What the sidecar still refuses reads as words, not as JSON paths."""

from __future__ import annotations

import math

import pytest

from dask_pmix import SidecarError, run_mpi, submit_mpi
from dask_pmix.errors import readable

from .conftest import start_cluster


def never_called(comm):
    raise AssertionError("the job ran")


class NoCluster:
    """A client that fails the test if anything asks it for anything."""

    def __getattr__(self, name):
        raise AssertionError(f"the cluster was asked ({name}) before the options were checked")


BAD = [
    ({"impl": "bogus"}, r"impl must be 'openmpi', 'mpich' or 'intelmpi' \(or None for the default\), not 'bogus'$"),
    ({"impl": 3}, r"impl must be 'openmpi', 'mpich' or 'intelmpi'"),
    ({"timeout": 1e300}, r"timeout must be a positive number of seconds up to 31,536,000 \(365 days, the sidecar's bound\), or None for no limit, not 1e\+300$"),
    ({"timeout": math.inf}, r"timeout must be a positive number of seconds up to 31,536,000 .* not inf$"),
    ({"timeout": math.nan}, r"timeout must be a positive number of seconds, or None for no limit, not nan$"),
    ({"timeout": 31_536_001}, r"timeout must be a positive number of seconds up to 31,536,000"),
    ({"wiring_timeout": 86_401}, r"wiring_timeout must be a positive number of seconds up to 86,400 \(1 day, the sidecar's bound\)"),
    ({"wiring_timeout": -math.inf}, r"wiring_timeout must be a positive number of seconds, or None"),
]


@pytest.mark.parametrize("call", [run_mpi, submit_mpi], ids=["run_mpi", "submit_mpi"])
@pytest.mark.parametrize("options, message", BAD, ids=[str(o) for o, _ in BAD])
def test_bad_options_are_refused_before_the_cluster_is_asked(call, options, message):
    with pytest.raises(ValueError, match=message):
        call(NoCluster(), never_called, n=1, **options)


def test_the_largest_timeouts_the_sidecar_takes_are_not_refused():
    from dask_pmix.client.run import _check_request

    _check_request(1, None, None, "mpich", 31_536_000, 86_400)
    _check_request(1, None, None, None, 0.001, None)


def test_an_impl_from_the_settings_is_checked_too():
    import dask

    with dask.config.set({"dask-pmix.job.impl": "lam"}), pytest.raises(
        ValueError, match=r"not 'lam' \(from the dask-pmix.job.impl setting\)"
    ):
        run_mpi(NoCluster(), never_called, n=1)


@pytest.mark.parametrize("raw, words", [
    ("invalid request: body/timeoutSeconds must be <= 31536000", "invalid request: the request's timeoutSeconds must be <= 31536000"),
    ("invalid request: body must have required property 'impl'", "invalid request: the request must have required property 'impl'"),
    ("invalid request: querystring/wait must be <= 60", "invalid request: the query's wait must be <= 60"),
    ("invalid request: body/members/0 must be string, body/labels/a must be string",
     "invalid request: the request's members[0] must be string, the request's labels.a must be string"),
    ("no job j9", "no job j9"),
])
def test_a_schema_violation_reads_as_words(raw, words):
    assert readable(400, raw) == words
    assert str(SidecarError(400, raw, "POST", "/v1/jobs")) == f"the sidecar refused the request (400): {words} (POST /v1/jobs)"


def test_the_sidecar_names_the_allowed_impls_in_words():
    cluster, client, sidecar = start_cluster(n_workers=1)
    try:
        with pytest.raises(SidecarError) as e:
            sidecar.create_job({"impl": "bogus", "members": ["x"]})
        assert e.value.status == 400
        assert str(e.value) == (
            "the sidecar refused the request (400): invalid request: the request's impl must be equal to one of "
            'the allowed values: "openmpi", "mpich", "intelmpi" (POST /v1/jobs)'
        )
        with pytest.raises(SidecarError, match=r"the request's timeoutSeconds must be <= 31536000 \(POST"):
            sidecar.create_job({"impl": "openmpi", "members": ["x"], "timeoutSeconds": 1e300})
    finally:
        client.close()
        cluster.close()
