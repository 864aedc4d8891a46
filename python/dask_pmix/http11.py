"""Keep-alive HTTP/1.1 requests over asyncio streams, parsed by h11: the scheduler's transport to
the sidecar for plain ``http://`` URLs.

Every job crosses it at least twice (create, complete) on the scheduler's event loop, so its cost
is the job's: a request here takes about 0.2 ms of CPU against httpx's 1.5 ms (httpx's client,
anyio and connection-pool layers over the same h11), on a loopback sidecar.

A request takes an idle connection or opens one, so that concurrent requests (job requests
waiting in the sidecar's admission line among them) never queue behind each other; a connection
goes back to the idle list only after a whole response the server will keep alive. One that the
server may have closed (end of file seen, or idle longer than IDLE_FOR) is not reused: a request
is sent once, never again on another connection, as a create may not be repeated."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import h11

# Fastify closes a keep-alive connection idle for 72 s; never reuse one near that.
IDLE_FOR = 30.0
KEEP_IDLE = 64


class Response:
    """What a caller reads of a response (the names httpx.Response has for them)."""

    def __init__(self, status_code: int, content: bytes):
        self.status_code = status_code
        self.content = content

    @property
    def is_error(self) -> bool:
        return self.status_code >= 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def reusable(self, now: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.idle_since < IDLE_FOR

    def close(self) -> None:
        self.writer.close()


class Http11Pool:
    def __init__(self, url: str, headers: dict[str, str]):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not a plain http:// URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.headers = [("Host", parts.netloc), *headers.items()]
        self._idle: list[_Connection] = []

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if c.reusable(now):
                return c
            c.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        return _Connection(reader, writer)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: list[tuple[str, str]] | None = None,
        on_interim: Callable[[int], None] | None = None,
    ) -> Response:
        """One request and its whole response; raises OSError or h11.ProtocolError when the
        connection fails. Cancelling it (a timeout) closes its connection. `on_interim` hears of
        each 1xx answer before the response (its status)."""
        data = b"" if body is None else json.dumps(body).encode()
        headers = [*self.headers, *(headers or ()), ("Content-Length", str(len(data)))]
        if body is not None:
            headers.append(("Content-Type", "application/json"))
        c = await self._connection()
        done = False
        try:
            out = c.h11.send(h11.Request(method=method, target=self.prefix + path, headers=headers))
            out += c.h11.send(h11.Data(data=data)) if data else b""
            out += c.h11.send(h11.EndOfMessage())
            c.writer.write(out)
            status, chunks = 0, []
            while True:
                event = c.h11.next_event()
                if event is h11.NEED_DATA:
                    # b"" at the end of the stream: h11 then raises if the response is cut short.
                    c.h11.receive_data(await c.reader.read(65536))
                elif isinstance(event, h11.InformationalResponse):
                    if on_interim is not None:
                        on_interim(event.status_code)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise ConnectionResetError("the sidecar closed the connection before its answer")
            done = True
            return Response(status, b"".join(chunks))
        finally:
            if done and c.h11.our_state is h11.DONE and c.h11.their_state is h11.DONE and len(self._idle) < KEEP_IDLE:
                c.h11.start_next_cycle()
                c.idle_since = time.monotonic()
                self._idle.append(c)
            else:
                c.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
