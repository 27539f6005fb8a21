"""One background event loop per process, behind every sync API.

All HTTP of every env and vector env in a process runs on this loop with one connection
pool, so a synchronous ``env.step`` and an ``await env.astep`` share the same client and
cookies never cross threads.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["BackgroundLoop", "background_loop"]


class BackgroundLoop:
    """An asyncio loop running forever in a daemon thread.

    Example:
        >>> import asyncio
        >>> async def two(): return 2
        >>> background_loop().run(two())
        2
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="nemo-gym-env-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where blocking on it would deadlock)."""
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block for its result."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("blocking call made from the background loop thread; use the async API there")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the background loop from any other running loop."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


_lock = threading.Lock()
_instance: BackgroundLoop | None = None
_pid: int | None = None


def background_loop() -> BackgroundLoop:
    """The process's background loop, created on first use (and anew in a forked child)."""
    global _instance, _pid
    with _lock:
        if _instance is None or _pid != os.getpid():
            _instance = BackgroundLoop()
            _pid = os.getpid()
        return _instance


@atexit.register
def _stop_at_exit() -> None:
    if _instance is not None and _pid == os.getpid():
        _instance.stop()
