"""A response's head waits for its first body bytes, so both leave in one socket write.

uvicorn writes `http.response.start` (the status line and headers) to the socket at once, then each body
message in a write of its own. Every write to a loopback or Unix socket wakes the client and makes the
kernel deliver a segment, so a model call answered in one body message paid for two writes, two wake-ups
and two reads on the client's side. Joined: +10-18% calls per proxy CPU-second and ~0.05 ms less added
latency at one rollout in flight, within noise at 64 and 1,000 (benchmarks/proxy_load.py, docs/proxy.md).

`HeadWithBody` is the transport uvicorn's request cycle writes through (`GuardedHttpProtocol` sets it on
each cycle): it holds the cycle's first write (the head) and sends it joined with the next write. Nothing
waits longer than the loop iteration it was written in: whatever is still held then is sent by a
`call_soon` callback, so an answer whose body comes later (a live stream waiting for tokens), a body-less
answer, or uvicorn's own `100 Continue` still leave at once. Order is kept (one buffer, always sent before
anything written after it), and a close sends what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody:
    """One request cycle's view of the connection's transport: its first write waits for the second."""

    __slots__ = ("_transport", "_loop", "_held", "_first")

    def __init__(self, transport: asyncio.WriteTransport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes) -> None:
        if self._first:
            self._first = False
            self._held = data
            self._loop.call_soon(self.flush)  # at the latest at the end of this loop iteration
            return
        if self._held is not None:
            data, self._held = self._held + data, None
        self._transport.write(data)

    def flush(self) -> None:
        """Send what is held now (a no-op once it went out with a later write)."""
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # anything else a cycle may ask the transport (get_extra_info, ...)
        return getattr(self._transport, name)
