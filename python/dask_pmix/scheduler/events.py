"""Following the sidecar's event stream from the scheduler's event loop, and telling a sidecar that
is gone from one that is only slow.

The stream carries a heartbeat every few seconds (rest.HEARTBEAT). The sidecar counts as gone
when its stream has been silent, or it has been unreachable, for `gone_after` seconds (or at once,
when the plugin sees its process exit): a shorter stall (a GC pause, a loaded host, SIGSTOP)
changes nothing. A broken stream is reopened with the last event's id, so that the sidecar replays
what was missed; when it cannot (its history moved on, or it is a restarted sidecar) it says
`resync`, and the reader reads the state afresh."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..errors import SidecarError
from ..rest import HEARTBEAT, AsyncSidecarClient

logger = logging.getLogger("dask_pmix")

RECONNECT_DELAY = 0.5


class EventStream:
    def __init__(
        self,
        rest: AsyncSidecarClient,
        *,
        gone_after: float,
        on_event: Callable[[str, dict], None],
        on_resync: Callable[[], Awaitable[None]],
        on_gone: Callable[[str], None],
        on_back: Callable[[], None],
    ):
        self.rest = rest
        self.gone_after = max(gone_after, 2 * HEARTBEAT)
        self.on_event = on_event
        self.on_resync = on_resync
        self.on_gone = on_gone
        self.on_back = on_back
        self.gone = False
        self._deadline: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def gone_now(self, reason: str) -> None:
        """The sidecar is gone (its process exited, or it stayed unreachable past the bound)."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self.gone:
            self.gone = True
            logger.warning("dask-pmix: %s; its running jobs fail", reason)
            self.on_gone(reason)

    def _unreachable(self, why: str) -> None:
        if self._deadline is None and not self.gone:
            loop = asyncio.get_running_loop()
            reason = f"the dask-pmix sidecar at {self.rest.url} has not answered for {self.gone_after:g} s ({why})"
            self._deadline = loop.call_later(self.gone_after, self.gone_now, reason)

    def _reachable(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.gone:
            self.gone = False
            logger.warning("dask-pmix: the sidecar at %s answers again", self.rest.url)
            self.on_back()

    async def _run(self) -> None:
        last_id: str | None = None
        while True:
            try:
                async with self.rest.event_stream(last_id, read_timeout=self.gone_after) as source:
                    if last_id is None:
                        await self.on_resync()  # the stream is open: nothing after this reading is missed
                    self._reachable()
                    async for sse in source.aiter_sse():
                        if sse.event == "resync":
                            await self.on_resync()
                            continue
                        if sse.event == "overflow":
                            break  # this reader fell behind: reopen from the last event
                        if sse.id:
                            last_id = sse.id
                        if sse.data:
                            try:
                                self.on_event(sse.event, sse.json())
                            except Exception:  # noqa: BLE001 - one bad event must not end the stream
                                logger.exception("dask-pmix: handling the sidecar's %s event failed", sse.event)
            except asyncio.CancelledError:
                raise
            except SidecarError as e:
                if e.status == 400:
                    last_id = None  # an id this sidecar cannot place: start afresh
                elif "silent" in e.message:
                    self.gone_now(f"the dask-pmix sidecar at {self.rest.url} has been silent for {self.gone_after:g} s")
                else:
                    self._unreachable(e.message)
            except Exception as e:  # noqa: BLE001 - the stream must outlive any one failure
                logger.exception("dask-pmix: following the sidecar's events failed")
                self._unreachable(repr(e))
            await asyncio.sleep(RECONNECT_DELAY)
