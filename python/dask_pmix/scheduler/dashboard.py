"""The dask-pmix page in the Dask dashboard: /dask-pmix/ on the scheduler's HTTP server shows a
timeline of jobs across workers, the pool's epochs with their rank usage, the bytes each worker's
comm backend moved over MPI and TCP, the process sets and the jobs, refreshing live. The page
(dashboard/index.html) is the one the sidecar serves at `/`.

Least exposure: Dask's dashboard has no authentication of its own, so the scheduler relays one
read, the sidecar's GET v1/dashboard, which carries what the page shows and nothing that lets a
reader join a job or pose as a worker (no namespaces, pids, uids or credentials). The relay adds
the plugin's token itself; the page needs none. It lives in the dashboard's own HTTP server, so it
is served where, how (TLS) and under the prefix the dashboard is, and `dask-pmix.dashboard.relay:
false` turns the page and the relay off.

The plugin adds these routes when it starts; listing `dask_pmix.scheduler.dashboard` in
`distributed.scheduler.http.routes` adds them through Dask's own route configuration instead.
The plugin also reports each worker's comm counters (the `dask_pmix_comm` worker metric) to the
sidecar every few seconds (TrafficReport), for the page's traffic view."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from distributed.http.utils import RequestHandler
from tornado import httpclient, web

from .. import config
from ..protocol import SCHEDULER_PLUGIN

logger = logging.getLogger("dask_pmix")

PAGE = Path(__file__).resolve().parents[1] / "dashboard" / "index.html"
PREFIX = "dask-pmix/"
# The one read relayed: the page's view of the sidecar. Nothing that changes state, and none of
# the other reads (they carry namespaces, pids and uids).
RELAYED = r"v1/dashboard"
# How often the workers' comm counters go to the sidecar, at most one request each time.
TRAFFIC_EVERY = 2.0


def enabled() -> bool:
    return bool(config.get("dashboard.relay", True))


def _plugin(server):
    plugin = getattr(server, "plugins", {}).get(SCHEDULER_PLUGIN)
    if plugin is None or not getattr(plugin, "url", None):
        raise web.HTTPError(503, reason="the dask-pmix plugin is not running on this scheduler")
    return plugin


class DashboardPage(RequestHandler):
    def get(self):
        if not enabled():
            raise web.HTTPError(404)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE.read_bytes())


class SidecarRelay(RequestHandler):
    """GET v1/dashboard relayed to the sidecar, with the plugin's token."""

    async def get(self):
        if not enabled():
            raise web.HTTPError(404)
        plugin = _plugin(self.server)
        headers = {"Accept": "application/json"}
        if plugin.token:
            headers["Authorization"] = f"Bearer {plugin.token}"
        self.set_header("Cache-Control", "no-store")
        request = httpclient.HTTPRequest(
            plugin.url.rstrip("/") + "/" + RELAYED, headers=headers, connect_timeout=10, request_timeout=30
        )
        try:
            response = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as e:
            raise web.HTTPError(502, reason=f"cannot reach the sidecar: {e}") from None
        if response.code == 599:
            raise web.HTTPError(502, reason="cannot reach the sidecar")
        self.set_status(response.code)
        self.set_header("Content-Type", response.headers.get("Content-Type", "application/json"))
        self.write(response.body or b"")


routes = [
    (PREFIX.rstrip("/"), web.RedirectHandler, {"url": PREFIX}),
    (PREFIX, DashboardPage, {}),
    (PREFIX + RELAYED, SidecarRelay, {}),
]


def _dashboard_prefix(app) -> str:
    """The prefix the scheduler's HTTP routes were given (`--dashboard-prefix`), read off its own
    health route, so that the page sits beside the rest of the dashboard."""
    for rule in getattr(getattr(app, "wildcard_router", None), "rules", []):
        pattern = getattr(getattr(rule.matcher, "regex", None), "pattern", "")
        if pattern.endswith("health$"):
            return pattern[: -len("health$")] or "/"
    return "/"


def install(scheduler) -> None:
    """Adds the page to a running scheduler's HTTP server, unless Dask's route configuration did,
    or the relay is turned off."""
    import dask.config
    from distributed.http.utils import get_handlers

    app = getattr(scheduler, "http_application", None)
    if (
        app is None
        or not enabled()
        or __name__ in dask.config.get("distributed.scheduler.http.routes", [])
        or getattr(app, "_dask_pmix_routes", False)
    ):
        return
    app.add_handlers(r".*$", get_handlers(server=scheduler, modules=[__name__], prefix=_dashboard_prefix(app)))
    app._dask_pmix_routes = True


def _traffic(metric) -> dict | None:
    """A worker's `dask_pmix_comm` metric as the sidecar takes it, or None. "cma" (single copies) is
    left out for a worker whose backend does not count them."""
    try:
        return {
            t: {"bytesSent": int(metric[t]["bytes_sent"]), "bytesReceived": int(metric[t]["bytes_received"])}
            for t in ("tcp", "mpi", "cma")
            if t != "cma" or t in metric
        }
    except (KeyError, TypeError, ValueError):
        return None


class TrafficReport:
    """Sends the workers' comm counters that changed to the sidecar, every TRAFFIC_EVERY seconds,
    in one request; workers running no tcp+mpi:// backend report none and are left out."""

    def __init__(self, scheduler: Any, send: Callable[[list[dict]], Awaitable[object]]) -> None:
        self.scheduler = scheduler
        self.send = send  # awaited: list of {"id", "tcp", "mpi", "cma"} -> None
        self.sent: dict[str, dict] = {}
        self.task: asyncio.Task | None = None

    def changed(self) -> list[dict]:
        out = []
        for address, ws in list(self.scheduler.workers.items()):
            t = _traffic((getattr(ws, "metrics", None) or {}).get("dask_pmix_comm"))
            if t is not None and self.sent.get(address) != t:
                out.append({"id": address, **t})
        return out

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TRAFFIC_EVERY)
            batch = self.changed()
            if not batch:
                continue
            try:
                await self.send(batch)
            except Exception as e:  # the sidecar restarting: the next round sends them again
                logger.debug("dask-pmix: traffic report not taken: %s", e)
                continue
            for entry in batch:
                self.sent[entry["id"]] = {"tcp": entry["tcp"], "mpi": entry["mpi"]}
            for gone in set(self.sent) - set(self.scheduler.workers):
                del self.sent[gone]

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None
