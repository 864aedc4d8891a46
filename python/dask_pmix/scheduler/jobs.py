"""The scheduler plugin's picture of the sidecar's jobs and frozen workers, kept from the event
stream (and from the answers of the requests the plugin makes). The sidecar is the source of
truth; this mirror decides nothing: it tells the plugin what changed."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..protocol import ACTIVE_STATES, MEMBER_CONNECTED, job_view

# Ended jobs remembered (for a member's or client's late question, and the rank tasks' bookkeeping).
ENDED_KEPT = 4096


@dataclass
class Entry:
    id: str
    view: dict
    owner: str | None = None
    # The ranks whose task finished (in memory): when all have and the job is still active, the
    # members' reports are late or lost, and the plugin ends the job after a grace.
    ranks_done: set[int] = field(default_factory=set)
    # Why the job failed as the plugin sees it, when the sidecar could not say (it is gone).
    failed_here: str | None = None

    @property
    def state(self) -> str:
        return self.view.get("state") or ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES and self.failed_here is None

    @property
    def workers(self) -> list[str]:
        return [m["workerId"] for m in self.view.get("members") or ()]

    def rank_of(self, worker: str) -> int | None:
        return next((m["rank"] for m in self.view.get("members") or () if m["workerId"] == worker), None)

    def worker_of(self, rank: int) -> str | None:
        return next((m.get("workerId") for m in self.view.get("members") or () if m.get("rank") == rank), None)


class JobMirror:
    def __init__(self) -> None:
        self.jobs: dict[str, Entry] = {}
        self._ended: collections.deque[str] = collections.deque()
        self.frozen: dict[str, str] = {}  # worker -> the job the sidecar holds it for

    def get(self, job_id: str) -> Entry | None:
        return self.jobs.get(job_id)

    def active(self) -> list[Entry]:
        return [e for e in self.jobs.values() if e.active]

    def apply(self, job: dict, owner: str | None = None) -> tuple[Entry, str | None]:
        """The sidecar's job as it is now; (its entry, the state it changed from: "" for a job not
        seen before, None when its state did not change)."""
        view = job_view(job)
        entry = self.jobs.get(view["id"])
        before: str | None = ""
        if entry is None:
            entry = self.jobs[view["id"]] = Entry(view["id"], view, owner=owner or job.get("owner") or None)
        else:
            before = entry.state if entry.state != view["state"] else None
            entry.view = view
            entry.owner = entry.owner or owner or job.get("owner") or None
        if not entry.active and entry.id not in self._ended:
            self._ended.append(entry.id)
            while len(self._ended) > ENDED_KEPT:
                self.jobs.pop(self._ended.popleft(), None)
        return entry, before

    def member_changed(self, job_id: str, worker: str, to: str, reason: str = "") -> Entry | None:
        entry = self.jobs.get(job_id)
        if entry is None:
            return None
        for m in entry.view.get("members") or ():
            if m["workerId"] == worker:
                m["state"] = to
                if reason:
                    m["reason"] = reason
        return entry

    def fail_here(self, entry: Entry, reason: str) -> None:
        """The job fails as the plugin sees it (the sidecar is gone)."""
        entry.failed_here = reason
        entry.view = {**entry.view, "state": "failed", "error": reason}
        if entry.id not in self._ended:
            self._ended.append(entry.id)

    def others_connected(self, entry: Entry, worker: str) -> bool:
        return any(m["state"] == MEMBER_CONNECTED for m in entry.view.get("members") or () if m["workerId"] != worker)

    def worker_state(self, worker: str, to: str, job_id: str | None) -> None:
        if to == "frozen" and job_id:
            self.frozen[worker] = job_id
        else:
            self.frozen.pop(worker, None)

    def reset(self, jobs: list[dict], workers: list[dict]) -> list[tuple[Entry, str | None]]:
        """The sidecar's state read afresh (a new stream, or a restarted sidecar); what changed."""
        changed = [self.apply(job) for job in jobs]
        seen = {job.get("id") for job in jobs}
        for entry in list(self.jobs.values()):
            if entry.id not in seen and entry.active:
                # Forgotten by the sidecar (deleted, or lost with a sidecar that had no state
                # directory): it is over.
                self.fail_here(entry, "the sidecar no longer knows this job")
                changed.append((entry, "running"))
        self.frozen = {w["id"]: str(w["jobId"]) for w in workers if w.get("state") == "frozen" and w.get("jobId")}
        return changed
