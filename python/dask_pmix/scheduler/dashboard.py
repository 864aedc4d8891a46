"""The dask-pmix page in the Dask dashboard: /dask-pmix/ on the scheduler's HTTP server shows the
pool, process sets, jobs and recent events, refreshing live. The page (dashboard/index.html) is the
one the sidecar serves at `/`; here the scheduler relays its read-only v1/ requests to its sidecar,
with the plugin's token, so the dashboard needs none.

The plugin adds these routes when it starts; listing `dask_pmix.scheduler.dashboard` in
`distributed.scheduler.http.routes` adds them through Dask's own route configuration instead."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

from tornado import httpclient, iostream, web

from distributed.http.utils import RequestHandler

from ..protocol import SCHEDULER_PLUGIN

PAGE = Path(__file__).resolve().parents[1] / "dashboard" / "index.html"
PREFIX = "/dask-pmix/"
# What the page reads; nothing that changes state is relayed.
READ_ONLY = r"v1/(health|workers|psets|jobs|events)"


def _plugin(server):
    plugin = getattr(server, "plugins", {}).get(SCHEDULER_PLUGIN)
    if plugin is None or not getattr(plugin, "url", None):
        raise web.HTTPError(503, reason="the dask-pmix plugin is not running on this scheduler")
    return plugin


class DashboardPage(RequestHandler):
    def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE.read_bytes())


class SidecarRelay(RequestHandler):
    """GET v1/... relayed to the sidecar, with the plugin's token."""

    async def get(self, what):
        plugin = _plugin(self.server)
        path = self.request.uri[len(PREFIX) - 1:]
        headers = {"Accept": self.request.headers.get("Accept", "application/json")}
        if plugin.token:
            headers["Authorization"] = f"Bearer {plugin.token}"
        self.set_header("Cache-Control", "no-store")
        if what == "events":
            await self._stream(plugin.url, path, headers)
            return
        request = httpclient.HTTPRequest(plugin.url.rstrip("/") + path, headers=headers, connect_timeout=10,
                                         request_timeout=30)
        try:
            response = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as e:
            raise web.HTTPError(502, reason=f"cannot reach the sidecar: {e}") from None
        if response.code == 599:
            raise web.HTTPError(502, reason="cannot reach the sidecar")
        self.set_status(response.code)
        self.set_header("Content-Type", response.headers.get("Content-Type", "application/json"))
        self.write(response.body or b"")

    async def _stream(self, url: str, path: str, headers: dict[str, str]) -> None:
        """The event stream, relayed as it arrives until either side closes. HTTP/1.0 upstream, so
        the body comes unchunked and the socket can simply be closed when the browser leaves."""
        target = urlsplit(url)
        try:
            reader, self._upstream = await asyncio.wait_for(
                asyncio.open_connection(target.hostname, target.port or 80), timeout=10)
        except (OSError, asyncio.TimeoutError) as e:
            raise web.HTTPError(502, reason=f"cannot reach the sidecar: {e}") from None
        try:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            self._upstream.write(f"GET {path} HTTP/1.0\r\nHost: {target.netloc}\r\n{lines}\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
            status, *fields = head.decode("latin-1").split("\r\n")
            self.set_status(int(status.split()[1]))
            for field in fields:
                name, _, value = field.partition(":")
                if name.lower() == "content-type":
                    self.set_header("Content-Type", value.strip())
            while chunk := await reader.read(65536):
                self.write(chunk)
                await self.flush()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, iostream.StreamClosedError):
            pass  # either side went away
        finally:
            self._upstream.close()

    def on_connection_close(self):
        upstream = getattr(self, "_upstream", None)
        if upstream is not None:
            upstream.close()  # ends the read loop above


routes = [
    (PREFIX.rstrip("/"), web.RedirectHandler, {"url": PREFIX}),
    (PREFIX, DashboardPage, {}),
    (PREFIX + READ_ONLY, SidecarRelay, {}),
]


def install(scheduler) -> None:
    """Adds the page to a running scheduler's HTTP server, unless Dask's route configuration did."""
    import dask.config
    from distributed.http.utils import get_handlers

    app = getattr(scheduler, "http_application", None)
    if app is None or __name__ in dask.config.get("distributed.scheduler.http.routes", []) \
            or getattr(app, "_dask_pmix_routes", False):
        return
    app.add_handlers(r".*$", get_handlers(server=scheduler, modules=[__name__], prefix="/"))
    app._dask_pmix_routes = True
