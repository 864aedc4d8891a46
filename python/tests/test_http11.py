"""The scheduler's transport to the sidecar (dask_pmix.http11, under AsyncSidecarClient), against
the real embedded sidecar: connections kept alive and reused, concurrent requests on their own
connections, the sidecar's errors as SidecarError, a stalled sidecar bounded by the timeout
without poisoning the pool, and a connection the server closed never reused."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from dask_pmix.errors import SidecarError
from dask_pmix.rest import AsyncSidecarClient

from .conftest import start_cluster


@pytest.fixture(scope="module")
def sidecar():
    cluster, client, rest = start_cluster(n_workers=1)
    pid = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dask-pmix"].embedded.proc.pid)
    yield rest.url, rest.token, pid
    client.close()
    cluster.close()


def _local_ports(c: AsyncSidecarClient) -> list[int]:
    return [conn.writer.get_extra_info("sockname")[1] for conn in c._fast._idle]


def test_requests_reuse_one_connection_and_concurrent_ones_get_their_own(sidecar):
    url, token, _ = sidecar

    async def go():
        c = AsyncSidecarClient(url, token, timeout=10)
        assert c._fast is not None
        try:
            ports = set()
            for _ in range(20):
                assert (await c.health())["status"] == "ok"
                ports.update(_local_ports(c))
            assert len(ports) == 1, ports  # one connection for 20 sequential requests
            answers = await asyncio.gather(*(c.workers() for _ in range(16)))
            assert all(len(a) == 1 for a in answers)
            assert 1 < len(c._fast._idle) <= 16
        finally:
            await c.aclose()
        assert c._fast._idle == []

    asyncio.run(go())


def test_the_sidecars_errors_keep_their_status_and_message(sidecar):
    url, token, _ = sidecar

    async def go():
        c = AsyncSidecarClient(url, token, timeout=10)
        try:
            with pytest.raises(SidecarError) as e:
                await c.complete_job("no-such-job")
            assert e.value.status == 404 and "no-such-job" in str(e.value)
            with pytest.raises(SidecarError) as e:
                await c.create_job({"impl": "openmpi"})  # neither members, pset nor selector
            assert e.value.status == 400, e.value
            assert (await c.health())["status"] == "ok"  # the connection is still good after errors
            assert not await AsyncSidecarClient(url, "wrong-token", timeout=10).token_accepted()
            gone = AsyncSidecarClient("http://127.0.0.1:9", token, timeout=10)
            with pytest.raises(SidecarError) as e:
                await gone.health()
            assert e.value.status == 0 and "cannot reach the sidecar" in str(e.value)
        finally:
            await c.aclose()

    asyncio.run(go())


def test_a_stalled_sidecar_times_out_and_its_connection_is_not_reused(sidecar):
    url, token, pid = sidecar

    async def go():
        c = AsyncSidecarClient(url, token, timeout=10)
        try:
            await c.health()
            before = _local_ports(c)
            os.kill(pid, signal.SIGSTOP)
            try:
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                with pytest.raises(SidecarError) as e:
                    await c.health(timeout=1)
                assert e.value.status == 0 and "did not answer within 1 s" in str(e.value)
                assert loop.time() - t0 < 3
                assert c._fast._idle == []  # the timed-out request's connection was closed
            finally:
                os.kill(pid, signal.SIGCONT)
            assert (await c.health())["status"] == "ok"
            assert _local_ports(c) != before
        finally:
            await c.aclose()

    asyncio.run(go())


def test_a_connection_the_server_closed_is_not_reused():
    """A server that answers with keep-alive and then closes the connection (as one restarting or
    past its idle timeout does): the next request opens a new connection and gets its answer."""
    from dask_pmix.http11 import Http11Pool

    async def go():
        seen = []

        async def serve(reader, writer):
            seen.append(writer.get_extra_info("peername")[1])
            while (line := await reader.readline()) not in (b"\r\n", b""):
                pass
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Http11Pool(f"http://127.0.0.1:{port}", {})
        try:
            for _ in range(3):
                r = await pool.request("GET", "/")
                assert (r.status_code, r.json()) == (200, {})
                await asyncio.sleep(0.05)  # the server's FIN arrives
            assert len(set(seen)) == 3
        finally:
            await pool.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(go())
