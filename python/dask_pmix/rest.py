"""A small synchronous client for the sidecar's REST API (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

from .errors import SidecarError


def quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class SidecarClient:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("message") or raw.decode(errors="replace")
            except ValueError:
                message = raw.decode(errors="replace")
            raise SidecarError(e.code, message, method, path) from None
        except (urllib.error.URLError, OSError) as e:
            raise SidecarError(0, f"cannot reach the sidecar at {self.url}: {e}", method, path) from None
        return json.loads(raw) if raw else None

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
    def create_job(self, request: dict) -> dict:
        return self._request("POST", "/v1/jobs", request)

    def job(self, job_id: str, timeout: float | None = None) -> dict:
        return self._request("GET", f"/v1/jobs/{quote(job_id)}", timeout=timeout)

    def jobs(self) -> list[dict]:
        return _items(self._request("GET", "/v1/jobs"), "jobs")

    def delete_job(self, job_id: str) -> dict | None:
        return self._request("DELETE", f"/v1/jobs/{quote(job_id)}")

    def member_lost(self, job_id: str, worker_id: str, reason: str) -> dict:
        return self._request("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/lost", {"reason": reason})

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

    def join_job(self, job_id: str, worker_id: str, wait: float) -> dict:
        """In-process jobs: the member is there; answers when all are (ready) or after `wait` s."""
        return self._request("POST", f"/v1/jobs/{quote(job_id)}/members/{quote(worker_id)}/join",
                             {"waitSeconds": wait}, timeout=wait + self.timeout)

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
    def events(self, timeout: float | None = None) -> Iterator[dict]:
        """Yields events from the server-sent event stream until it closes."""
        req = urllib.request.Request(self.url + "/v1/events", headers={"Accept": "text/event-stream"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data: list[str] = []
            for raw in resp:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    try:
                        yield json.loads("\n".join(data))
                    except ValueError:
                        pass
                    data = []


def _items(body: Any, key: str) -> list[dict]:
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        return body.get(key) or body.get("items") or []
    return []
