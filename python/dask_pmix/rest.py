"""A small synchronous client for the sidecar's REST API (httpx), and its event stream (httpx-sse)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import httpx
from httpx_sse import EventSource, connect_sse

from .errors import SidecarError

# The sidecar sends a heartbeat every 15 s: a stream silent for longer than this is dead.
EVENT_READ_TIMEOUT = 45.0


def quote(segment: str) -> str:
    from urllib.parse import quote as q

    return q(segment, safe="")


class SidecarClient:
    """One connection pool per client; safe to call from several threads at once."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            resp = self._http.request(method, path, json=body, timeout=timeout or self.timeout)
        except httpx.TimeoutException as e:
            raise SidecarError(0, f"the sidecar at {self.url} did not answer within {timeout or self.timeout:.0f} s "
                                  f"({type(e).__name__})", method, path) from None
        except httpx.HTTPError as e:
            raise SidecarError(0, f"cannot reach the sidecar at {self.url}: {e}", method, path) from None
        if resp.is_error:
            raise SidecarError(resp.status_code, _message(resp), method, path)
        return resp.json() if resp.content else None

    # -- health ---------------------------------------------------------------------------------
    def health(self, timeout: float | None = None) -> dict:
        return self._request("GET", "/v1/health", timeout=timeout)

    # -- workers --------------------------------------------------------------------------------
    def register_worker(self, worker: dict) -> dict:
        return self._request("POST", "/v1/workers", worker)

    def remove_worker(self, worker_id: str) -> None:
        self._request("DELETE", f"/v1/workers/{quote(worker_id)}")

    def workers(self) -> list[dict]:
        return _items(self._request("GET", "/v1/workers"), "workers")

    # -- process sets ---------------------------------------------------------------------------
    def define_pset(self, name: str, members: list[str] | None = None, selector: dict | None = None) -> dict:
        body: dict[str, Any] = {"name": name}
        if members is not None:
            body["members"] = members
        if selector is not None:
            body["selector"] = selector
        return self._request("POST", "/v1/psets", body)

    def psets(self) -> list[dict]:
        return _items(self._request("GET", "/v1/psets"), "psets")

    def delete_pset(self, name: str) -> None:
        self._request("DELETE", f"/v1/psets/{quote(name)}")

    # -- jobs -----------------------------------------------------------------------------------
    def create_job(self, request: dict, wait: float | None = None) -> dict:
        """With `wait`, a request whose members are busy waits in the sidecar's admission line
        for up to that many seconds instead of failing at once."""
        if not wait:
            return self._request("POST", "/v1/jobs", request)
        return self._request("POST", f"/v1/jobs?wait={wait:g}", request, timeout=wait + self.timeout)

    def job(self, job_id: str, timeout: float | None = None) -> dict:
        return self._request("GET", f"/v1/jobs/{quote(job_id)}", timeout=timeout)

    def jobs(self) -> list[dict]:
        return _items(self._request("GET", "/v1/jobs"), "jobs")

    def delete_job(self, job_id: str) -> dict | None:
        return self._request("DELETE", f"/v1/jobs/{quote(job_id)}")

    def member_lost(self, job_id: str, worker_id: str, reason: str) -> dict:
        return self._request("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/lost", {"reason": reason})

    def report_traffic(self, workers: list[dict]) -> dict:
        """The bytes each worker's comm backend moved per transport: [{"id", "tcp", "mpi"}]."""
        return self._request("PUT", "/v1/traffic", {"workers": workers})

    def member_env(self, job_id: str, worker_id: str) -> dict:
        return self._request("GET", f"/v1/jobs/{quote(job_id)}/env/{quote(worker_id)}")

    def token_accepted(self) -> bool:
        """Whether the sidecar takes this client's token (or its absence): asks a guarded route
        for the env of a job that does not exist, which answers 404 past the token check."""
        try:
            self._request("GET", "/v1/jobs/dask-pmix-token-check/env/none", timeout=10)
        except SidecarError as e:
            return e.status != 401
        return True

    def join_job(self, job_id: str, worker_id: str, wait: float, ports: dict | None = None) -> dict:
        """In-process jobs: the member is there; answers when all are (ready) or after `wait` s.
        MPICH / Intel MPI members bring their ports (by merge step) and get everyone's."""
        body: dict = {"waitSeconds": wait}
        if ports:
            body["ports"] = ports
        return self._request("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/join",
                             body, timeout=wait + self.timeout)

    def leave_job(self, job_id: str, worker_id: str, ok: bool, reason: str = "",
                  failed_ranks: list[int] | None = None) -> dict:
        return self._request("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/leave",
                             {"ok": ok, "reason": reason[:4096], "failedRanks": [int(r) for r in failed_ranks or []]})

    # -- the in-process pool --------------------------------------------------------------------
    def join_pool(self, worker_id: str, identity: dict) -> dict:
        """The worker process joins the pool, saying who it is; answers its rank and environment."""
        return self._request("POST", f"/v1/workers/{quote(worker_id)}/pool", identity, timeout=self.timeout + 30)

    def leave_pool(self, worker_id: str, reason: str) -> dict:
        return self._request("POST", f"/v1/workers/{quote(worker_id)}/pool/leave", {"reason": reason})

    # -- events ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def event_stream(self, last_event_id: str | None = None) -> Iterator[EventSource]:
        """Opens GET /v1/events; on entry the server is subscribed (the response has begun).
        With `last_event_id`, it first replays what it still holds after that event, or sends a
        `resync` event when it no longer holds everything after it."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        timeout = httpx.Timeout(self.timeout, read=EVENT_READ_TIMEOUT)
        try:
            with connect_sse(self._http, "GET", "/v1/events", headers=headers, timeout=timeout) as source:
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


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    return (body.get("message") if isinstance(body, dict) else None) or resp.text


def _items(body: Any, key: str) -> list[dict]:
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        return body.get(key) or body.get("items") or []
    return []
