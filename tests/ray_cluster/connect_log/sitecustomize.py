"""Loaded by every Python process of a test's Ray cluster (this folder is on its PYTHONPATH): when
``NEMO_GYM_ENV_TEST_CONNECT_LOG`` names a folder, each ``connect()`` to a network address (and each name looked up) is written
to a file of that folder named for the process, so a test sees even a connection that lasted a millisecond."""

import os
import sys

_folder = os.environ.get("NEMO_GYM_ENV_TEST_CONNECT_LOG")


def _record(event: str, args: tuple) -> None:
    if event == "socket.connect" and isinstance(args[1], tuple):  # AF_INET/AF_INET6; a Unix socket is a path
        host, port = args[1][:2]
    elif event == "socket.getaddrinfo" and args[0] not in (None, "", b"", "0.0.0.0", "::"):  # a name looked up is a
        # connection meant, even where DNS fails (the unspecified address is a listening socket's, not a peer)
        host, port = args[0], args[1]
    else:
        return
    host = host.decode() if isinstance(host, bytes) else str(host)
    with open(os.path.join(_folder, str(os.getpid())), "a") as log:
        log.write(f"{host.replace(' ', '_')} {port} {' '.join(sys.argv[:2])[:200]}\n")


if _folder and os.path.isdir(_folder):
    sys.addaudithook(_record)
