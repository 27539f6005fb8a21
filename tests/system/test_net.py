"""``system/net.listen_socket``: what every server run by hand, the viewer and the head server listen on."""

from __future__ import annotations

import asyncio
import socket

from nemo_gym_env.system.net import listen_socket


def _nodelay_of_accepted(sock: socket.socket) -> list[int]:
    """TCP_NODELAY of the connection an asyncio server on ``sock`` accepts from one client."""
    seen: list[int] = []

    async def main() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(asyncio.wait_for(main(), 10))
    return seen


def test_connections_accepted_from_a_listen_socket_have_nodelay():
    """asyncio sets TCP_NODELAY only on connections accepted from a socket made with its protocol named; without
    it a reply written in two parts (uvicorn: head, then body) waits ~40 ms for the client's delayed ACK."""
    sock = listen_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    assert _nodelay_of_accepted(sock) == [1]


def test_a_plain_socket_would_not_get_nodelay():
    """What the test above guards against: the same server on ``socket.socket()`` (protocol 0)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    assert _nodelay_of_accepted(sock) == [0]
