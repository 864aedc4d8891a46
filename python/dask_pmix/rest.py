"""Clients of the sidecar's REST API (httpx) and its event stream (httpx-sse).

``AsyncSidecarClient`` is the one the scheduler plugin uses: every call is awaited on the event
loop, so that any number of requests (a job request waiting in the sidecar's admission line
among them) hold no thread; its requests to a plain http:// sidecar take the lighter transport of
dask_pmix.http11. ``SidecarClient`` is the same API for synchronous callers (scripts,
tests, the demo). Both share one description of the routes (``_Routes``): a method returns
whatever its transport's ``_call`` returns (a value, or a coroutine of it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import quote as _quote

import h11
import httpx
from httpx_sse import EventSource, aconnect_sse, connect_sse

from .errors import SidecarError
from .http11 import Http11Pool, Response

# Asks POST /v1/jobs?wait= for an interim 102 once the request waits in line (src/api/routes/jobs.ts).
QUEUED_HEADER = "x-dask-pmix-queued"

# The sidecar writes a heartbeat on every event stream this often (src/api/routes/events.ts).
HEARTBEAT = 2.0


def quote(segment: str) -> str:
    return _quote(segment, safe="")


def _message(resp: httpx.Response | Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    return (body.get("message") if isinstance(body, dict) else None) or resp.text


def _items(key: str) -> Callable[[Any], list[dict]]:
    def items(body: Any) -> list[dict]:
        if isinstance(body, list):
            return body
        if isinstance(body, dict):
            return body.get(key) or body.get("items") or []
        return []

    return items


class _Routes:
    """The v1 routes; ``_call(method, path, body, timeout, post)`` is the transport's."""

    url: str
    timeout: float

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float | None = None,
        post: Callable[[Any], Any] | None = None,
    ) -> Any:
        raise NotImplementedError

    def _error(self, e: Exception, method: str, path: str, timeout: float | None) -> SidecarError:
        if isinstance(e, httpx.TimeoutException):
            return SidecarError(
                0,
                f"the sidecar at {self.url} did not answer within {timeout or self.timeout:.0f} s ({type(e).__name__})",
                method,
                path,
            )
        return SidecarError(0, f"cannot reach the sidecar at {self.url}: {e}", method, path)

    def _result(
        self, resp: httpx.Response | Response, method: str, path: str, post: Callable[[Any], Any] | None
    ) -> Any:
        if resp.is_error:
            raise SidecarError(resp.status_code, _message(resp), method, path)
        body = resp.json() if resp.content else None
        return post(body) if post else body

    # -- health -----------------------------------------------------------------------------------
    def health(self, timeout: float | None = None):
        return self._call("GET", "/v1/health", timeout=timeout)

    def token_check(self):
        """A guarded route that answers 404 past the token check (the env of a job that does not
        exist): 401 means the token is refused."""
        return self._call("GET", "/v1/jobs/dask-pmix-token-check/env/none", timeout=10)

    # -- workers ----------------------------------------------------------------------------------
    def register_worker(self, worker: dict):
        return self._call("POST", "/v1/workers", worker)

    def remove_worker(self, worker_id: str, reason: str | None = None, returning: bool = False):
        """The worker left the cluster; `returning`: it is expected back (its nanny restarts it, or
        dask-pmix replaces it), so that a job request short of workers meanwhile waits for it."""
        query = [f"reason={quote(reason[:1024])}"] if reason else []
        if returning:
            query.append("returning=true")
        return self._call("DELETE", f"/v1/workers/{quote(worker_id)}" + ("?" + "&".join(query) if query else ""))

    def workers(self):
        return self._call("GET", "/v1/workers", post=_items("workers"))

    # -- process sets -----------------------------------------------------------------------------
    def define_pset(self, name: str, members: list[str] | None = None, selector: dict | None = None):
        body: dict[str, Any] = {"name": name}
        if members is not None:
            body["members"] = members
        if selector is not None:
            body["selector"] = selector
        return self._call("POST", "/v1/psets", body)

    def psets(self):
        return self._call("GET", "/v1/psets", post=_items("psets"))

    def delete_pset(self, name: str):
        return self._call("DELETE", f"/v1/psets/{quote(name)}")

    # -- jobs -------------------------------------------------------------------------------------
    def create_job(self, request: dict, wait: float | None = None):
        """With `wait`, a request whose members are busy waits in the sidecar's admission line
        for up to that many seconds instead of failing at once."""
        if not wait:
            return self._call("POST", "/v1/jobs", request)
        return self._call("POST", f"/v1/jobs?wait={wait:g}", request, timeout=wait + self.timeout)

    def job(self, job_id: str, timeout: float | None = None):
        return self._call("GET", f"/v1/jobs/{quote(job_id)}", timeout=timeout)

    def jobs(self):
        return self._call("GET", "/v1/jobs", post=_items("jobs"))

    def delete_job(self, job_id: str, reason: str | None = None):
        """Ends the job (aborted) and forgets it; ``reason`` is the error an active job ends with."""
        query = f"?reason={quote(reason[:500])}" if reason else ""
        return self._call("DELETE", f"/v1/jobs/{quote(job_id)}{query}")

    # -- elastic jobs -----------------------------------------------------------------------------
    def elastic_jobs(self):
        return self._call("GET", "/v1/elastic", post=_items("elasticJobs"))

    def elastic_job(self, elastic_id: str):
        """An elastic job's generations (its members over time) and the drain requests made of it."""
        return self._call("GET", f"/v1/elastic/{quote(elastic_id)}")

    def record_drain(self, elastic_id: str, worker_id: str, state: str, reason: str = "", generation: int = 0):
        body: dict[str, Any] = {"state": state, "reason": reason[:1024]}
        if generation:
            body["generation"] = generation
        return self._call("PUT", f"/v1/elastic/{quote(elastic_id)}/drains/{quote(worker_id)}", body)

    def member_lost(self, job_id: str, worker_id: str, reason: str):
        return self._call("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/lost", {"reason": reason})

    def report_traffic(self, workers: list[dict]):
        """The bytes each worker's comm backend moved per transport: [{"id", "tcp", "mpi"}]."""
        return self._call("PUT", "/v1/traffic", {"workers": workers})

    def member_env(self, job_id: str, worker_id: str):
        return self._call("GET", f"/v1/jobs/{quote(job_id)}/env/{quote(worker_id)}")

    def join_job(self, job_id: str, worker_id: str, wait: float, ports: dict | None = None):
        """In-process jobs: the member is there; answers when all are (ready) or after `wait` s.
        MPICH / Intel MPI members bring their ports (by merge step) and get everyone's."""
        body: dict = {"waitSeconds": wait}
        if ports:
            body["ports"] = ports
        return self._call(
            "POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/join", body, timeout=wait + self.timeout
        )

    def complete_job(self, job_id: str):
        """In-process jobs: every member's function returned; they all leave at once."""
        return self._call("POST", f"/v1/jobs/{quote(job_id)}/complete")

    def job_reused(self, job_id: str, kept: str):
        """In-process jobs: every member is there and derives its communicator from the one kept
        since job `kept` (the server sees no group construct): the job runs."""
        return self._call("POST", f"/v1/jobs/{quote(job_id)}/reused?from={quote(kept[:128])}")

    def leave_job(self, job_id: str, worker_id: str, ok: bool, reason: str = "", failed_ranks: list[int] | None = None):
        return self._call(
            "POST",
            f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/leave",
            {"ok": ok, "reason": reason[:4096], "failedRanks": [int(r) for r in failed_ranks or []]},
        )

    # -- the in-process pool ----------------------------------------------------------------------
    def join_pool(self, worker_id: str, identity: dict):
        """The worker process joins the pool, saying who it is; answers its rank and environment.
        The first epoch may wait for the workers that start together (cohorts)."""
        return self._call("POST", f"/v1/workers/{quote(worker_id)}/pool", identity, timeout=self.timeout + 30)

    def leave_pool(self, worker_id: str, reason: str):
        return self._call("POST", f"/v1/workers/{quote(worker_id)}/pool/leave", {"reason": reason})


def _stream_headers(last_event_id: str | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    return headers


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class SidecarClient(_Routes):
    """A synchronous client; one connection pool, safe to call from several threads at once."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._http = httpx.Client(base_url=self.url, headers=_headers(token), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _call(self, method, path, body=None, timeout=None, post=None):
        try:
            resp = self._http.request(method, path, json=body, timeout=timeout or self.timeout)
        except httpx.HTTPError as e:
            raise self._error(e, method, path, timeout) from None
        return self._result(resp, method, path, post)

    def token_accepted(self) -> bool:
        try:
            self.token_check()
        except SidecarError as e:
            return e.status != 401
        return True

    @contextlib.contextmanager
    def event_stream(self, last_event_id: str | None = None, read_timeout: float = 45.0) -> Iterator[EventSource]:
        """Opens GET /v1/events; on entry the server is subscribed (the response has begun).
        With `last_event_id`, it first replays what it still holds after that event, or sends a
        `resync` event when it no longer holds everything after it."""
        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        try:
            with connect_sse(
                self._http, "GET", "/v1/events", headers=_stream_headers(last_event_id), timeout=timeout
            ) as source:
                if source.response.is_error:
                    source.response.read()
                    raise SidecarError(source.response.status_code, _message(source.response), "GET", "/v1/events")
                yield source
        except httpx.HTTPError as e:
            raise SidecarError(0, f"the event stream from {self.url} broke: {e}", "GET", "/v1/events") from None

    def events(self, last_event_id: str | None = None) -> Iterator[dict]:
        """Yields the events' JSON until the stream ends (no resync handling: see event_stream)."""
        with self.event_stream(last_event_id) as source:
            for sse in source.iter_sse():
                if sse.data:
                    yield sse.json()


class AsyncSidecarClient(_Routes):
    """An asynchronous client: every route is a coroutine. Waits hold a connection, never a thread."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # A job request may wait in the sidecar's admission line: one connection each, so that
        # waiting requests never queue behind each other in the pool (the sidecar bounds them).
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=_headers(token),
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        # The requests (not the event stream) of a plain http:// sidecar, every job's among them,
        # go through the lighter transport; httpx serves any other URL.
        self._fast = Http11Pool(self.url, _headers(token)) if self.url.startswith("http://") else None

    async def aclose(self) -> None:
        if self._fast is not None:
            await self._fast.aclose()
        await self._http.aclose()

    async def _call(self, method, path, body=None, timeout=None, post=None):
        if self._fast is None:
            try:
                resp = await self._http.request(method, path, json=body, timeout=timeout or self.timeout)
            except httpx.HTTPError as e:
                raise self._error(e, method, path, timeout) from None
            return self._result(resp, method, path, post)
        seconds = timeout or self.timeout
        try:
            fast = await asyncio.wait_for(self._fast.request(method, path, body), seconds)
        except asyncio.TimeoutError:
            raise SidecarError(
                0, f"the sidecar at {self.url} did not answer within {seconds:.0f} s (timed out)", method, path
            ) from None
        except (OSError, h11.ProtocolError) as e:
            raise SidecarError(
                0, f"cannot reach the sidecar at {self.url}: {e or type(e).__name__}", method, path
            ) from None
        return self._result(fast, method, path, post)

    async def create_job_in_line(self, request: dict, wait: float, on_queued: Callable[[], None]):
        """create_job(request, wait) that calls `on_queued()` once the request waits in the sidecar's
        admission line (an interim 102), or with the answer when it never waited (it may be called more
        than once: make it idempotent). Cancelling it
        takes the request out of the line (its connection closes). Over httpx (a sidecar that is
        not plain http://) the 102 is not seen: `on_queued()` comes with the answer."""
        path = f"/v1/jobs?wait={wait:g}"
        try:
            if self._fast is None:
                return await self._call("POST", path, request, timeout=wait + self.timeout)
            seconds = wait + self.timeout
            try:
                fast = await asyncio.wait_for(
                    self._fast.request(
                        "POST",
                        path,
                        request,
                        headers=[(QUEUED_HEADER, "notify")],
                        on_interim=lambda status: on_queued() if status == 102 else None,
                    ),
                    seconds,
                )
            except asyncio.TimeoutError:
                raise SidecarError(
                    0, f"the sidecar at {self.url} did not answer within {seconds:.0f} s (timed out)", "POST", path
                ) from None
            except (OSError, h11.ProtocolError) as e:
                raise SidecarError(
                    0, f"cannot reach the sidecar at {self.url}: {e or type(e).__name__}", "POST", path
                ) from None
            return self._result(fast, "POST", path, None)
        finally:
            on_queued()

    async def token_accepted(self) -> bool:
        try:
            await self.token_check()
        except SidecarError as e:
            return e.status != 401
        return True

    @contextlib.asynccontextmanager
    async def event_stream(
        self, last_event_id: str | None = None, read_timeout: float = 45.0
    ) -> AsyncIterator[EventSource]:
        """As SidecarClient.event_stream; a stream silent for `read_timeout` s raises
        SidecarError(0) (the sidecar writes a heartbeat every HEARTBEAT s)."""
        timeout = httpx.Timeout(self.timeout, read=read_timeout)
        try:
            async with aconnect_sse(
                self._http, "GET", "/v1/events", headers=_stream_headers(last_event_id), timeout=timeout
            ) as source:
                if source.response.is_error:
                    await source.response.aread()
                    raise SidecarError(source.response.status_code, _message(source.response), "GET", "/v1/events")
                yield source
        except httpx.TimeoutException:
            raise SidecarError(
                0, f"the event stream from {self.url} was silent for {read_timeout:g} s", "GET", "/v1/events"
            ) from None
        except httpx.HTTPError as e:
            raise SidecarError(0, f"the event stream from {self.url} broke: {e}", "GET", "/v1/events") from None
