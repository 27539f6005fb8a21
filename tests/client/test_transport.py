"""The client's HTTP/1.1 transport against a scripted raw-socket server on loopback.

The real servers (uvicorn) are covered by test_env.py and test_vector.py; here each route of
a tiny asyncio server answers in one particular way HTTP allows (chunked, gzip, close-
delimited, ``Connection: close``, hanging, garbage), so every branch of the parser and of
the pool is exercised.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Self

import pytest

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.errors import ServerError


class RawServer:
    """Answers each request by its path; counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None
        self.url = ""

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if not await self._answer(path, headers, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, path: str, headers: dict, body: bytes, writer: asyncio.StreamWriter) -> bool:
        echo = json.dumps({"path": path, "cookie": headers.get("cookie"), "body": body.decode()}).encode()
        if path == "/cl":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nset-cookie: s=abc; path=/\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(echo), echo))
        elif path == "/chunked":
            half = len(echo) // 2
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            writer.write(b"%x\r\n%s\r\n" % (half, echo[:half]))
            await writer.drain()
            writer.write(b"%x;ext=1\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n" % (len(echo) - half, echo[half:]))
        elif path == "/gzip":
            packed = gzip.compress(echo)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(packed), packed))
        elif path == "/close":
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(echo), echo))
            await writer.drain()
            return False
        elif path == "/eof":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=latin-1\r\n\r\ncaf\xe9")
            await writer.drain()
            return False
        elif path == "/idle_close":  # answers, then closes the idle keep-alive connection
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            return False
        elif path == "/logout":
            writer.write(b"HTTP/1.1 200 OK\r\nset-cookie: s=; Max-Age=0; path=/\r\ncontent-length: 2\r\n\r\n{}")
        elif path == "/empty":
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        elif path == "/hang":
            await asyncio.sleep(30)
        elif path == "/garbage":
            writer.write(b"NOT-HTTP\r\n\r\n")
            await writer.drain()
            return False
        elif path == "/cut":  # promises 100 bytes, sends 5, dies
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello")
            await writer.drain()
            return False
        elif path == "/":
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n{"status":"ok"}')
        await writer.drain()
        return True


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_content_length_cookies_and_keep_alive():
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url)
            jar: dict[str, str] = {}
            first = await client.post_json("/cl", {"x": "é"}, jar)
            assert first == {"path": "/cl", "cookie": None, "body": '{"x": "é"}'} and jar == {"s": "abc"}
            second = await client.post_json("/cl", [1], jar)
            assert second["cookie"] == "s=abc"
            assert server.connections == 1  # the connection was kept alive and reused
            await client.post_raw("/logout", {}, jar)
            assert jar == {}

    run(main())


@pytest.mark.parametrize("route", ["/chunked", "/gzip", "/close"])
def test_framings_give_the_same_body(route):
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url)
            for _ in range(2):
                assert (await client.post_json(route, {"k": 1}, {}))["body"] == '{"k": 1}'
            return server.connections

    connections = run(main())
    assert connections == (2 if route == "/close" else 1)


def test_body_delimited_by_close_and_charset():
    async def main():
        async with RawServer() as server:
            return await ResourcesClient(server.url).call_tool("eof", {}, {})

    assert run(main()) == "café"


def test_server_closing_an_idle_connection_is_noticed():
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url)
            assert await client.call_tool("idle_close", {}, {}) == "ok"
            await asyncio.sleep(0.05)  # the FIN arrives while the connection is idle in the pool
            assert await client.call_tool("idle_close", {}, {}) == "ok"
            return server.connections

    assert run(main()) == 2


def test_a_connection_closed_while_the_loop_was_busy_is_not_reused():
    """The server's FIN arrived but the loop has not read it yet: the socket itself says so."""
    from nemo_gym_env.client.transport import _pool

    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url)
            await client.post_json("/cl", {}, {})
            (conn,) = _pool("http", "127.0.0.1", int(server.url.rsplit(":", 1)[1])).idle
            assert not conn.peer_gone()
            conn.transport.pause_reading()  # as if the loop were too busy to look at this socket
            server.writers[0].close()
            await asyncio.sleep(0.1)
            assert not conn.closed and conn.peer_gone()
            conn.idle_since -= 2.0  # idle long enough to be checked before reuse
            assert (await client.post_json("/cl", {}, {}))["path"] == "/cl"
            return server.connections

    assert run(main()) == 2


def test_no_content_and_health():
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url)
            reply = await client.post_raw("/empty", {}, {})
            return reply.status_code, reply.content, await client.health(), server.connections

    assert run(main()) == (204, b"", True, 1)


def test_timeout_names_server_and_route():
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url, timeout_s=0.3)
            with pytest.raises(ServerError, match=r"/hang \(task 7\): no answer within 0.3 s"):
                await client.post_raw("/hang", {}, {}, task_index=7)
            assert (await client.post_json("/cl", {}, {}))["path"] == "/cl"  # the pool still works

    run(main())


@pytest.mark.parametrize("route", ["/garbage", "/cut"])
def test_broken_replies_are_server_errors(route):
    async def main():
        async with RawServer() as server:
            with pytest.raises(ServerError, match="mid-request"):
                await ResourcesClient(server.url).post_raw(route, {}, {})

    run(main())


def test_refused_connection_is_retried_then_reported():
    async def main():
        async with RawServer() as server:
            url = server.url
        client = ResourcesClient(url, connect_retries=2)
        with pytest.raises(ServerError, match="cannot connect.*is the server running"):
            await client.post_raw("/cl", {}, {})
        assert not await client.health(timeout_s=1)

    run(main())


def test_unserializable_body_and_bad_url():
    with pytest.raises(ServerError, match="not JSON-serializable"):
        run(ResourcesClient("http://127.0.0.1:9").post_raw("/x", {"x": float("nan")}, {}))
    with pytest.raises(ValueError, match="http:// or https://"):
        ResourcesClient("ftp://example.org")


def test_many_concurrent_requests_share_a_bounded_pool():
    async def main():
        async with RawServer() as server:
            client = ResourcesClient(server.url, max_in_flight=50)
            replies = await asyncio.gather(*(client.post_json("/cl", {"i": i}, {}) for i in range(2000)))
            assert [json.loads(r["body"])["i"] for r in replies] == list(range(2000))
            return server.connections

    assert run(main()) <= 50
