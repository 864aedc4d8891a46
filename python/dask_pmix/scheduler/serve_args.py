"""The arguments of the sidecar the scheduler plugin starts (`dask-pmix serve`)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse

from .. import config


def sidecar_argv(given: list[str], scheduler_address: str) -> list[str]:
    """The embedded sidecar's arguments: those derived from the scheduler's address and the
    configuration, then the given ones (or, if none, `dask-pmix.sidecar.args`). serve takes the
    last value of an option, so given arguments override derived ones without dropping the rest
    (a listener on the scheduler's routable address, the pool's size and cohorts)."""
    return [*_serve_args_for(scheduler_address), *(list(given) or config.get("sidecar.args", []))]


def _serve_args_for(scheduler_address: str) -> list[str]:
    """Ranks on other hosts reach the sidecar where they reach the scheduler: when the scheduler
    listens on a routable address, so do the embedded sidecar's PMIx and PMI listeners (its REST
    API stays on loopback, for this plugin only)."""
    pmix, pmi = config.get("interfaces.pmix"), config.get("interfaces.pmi")
    host = urlparse(scheduler_address).hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None and not (ip.is_loopback or ip.is_unspecified or ip.version != 4):
        pmix, pmi = pmix or str(ip), pmi or str(ip)
    pool, cohort, cohort_max = config.get("pool.size"), config.seconds("pool.cohort"), config.seconds("pool.cohort-max")
    return [
        *(["--pmix-if", pmix] if pmix else []),
        *(["--pmi-host", pmi] if pmi else []),
        *(["--pool-size", str(int(pool))] if pool else []),
        *(["--pool-cohort", f"{cohort:g}"] if cohort is not None else []),
        *(["--pool-cohort-max", f"{cohort_max:g}"] if cohort_max is not None else []),
    ]
