"""Whether the scheduler has the dask-pmix plugin (a call to a handler it lacks never returns)."""

from __future__ import annotations

import time

from ..protocol import Scheduler

PLUGIN_MISSING = (
    "the scheduler has no dask-pmix plugin: start it with `dask scheduler --preload dask_pmix`, "
    "or call client.register_plugin(dask_pmix.SidecarPlugin()) first"
)


def wait_for_plugin(client, timeout: float = 60.0) -> dict:
    """Blocks until the scheduler has the plugin's handlers (its start is asynchronous). Asks
    whether they are there first: a call to a handler the scheduler lacks never returns."""
    deadline = time.monotonic() + timeout
    handler = Scheduler.INFO
    # A lambda travels by value: the check works on a scheduler that cannot even import dask_pmix.
    while not client.run_on_scheduler(lambda dask_scheduler, handler=handler: handler in dask_scheduler.handlers):
        if time.monotonic() > deadline:
            raise RuntimeError(PLUGIN_MISSING)
        time.sleep(0.1)
    return client.sync(getattr(client.scheduler, Scheduler.INFO))
