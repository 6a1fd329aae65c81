"""A command's pipes on the host side: drain its output, feed its input, each fd closed exactly once.

The sandbox hands a command fresh pipe ends (SCM_RIGHTS) and keeps the other ends here. These read and
write them with the event loop's reader and writer callbacks rather than pipe transports: uvloop's
`connect_read_pipe` and `connect_write_pipe` close the fd twice (libuv and the file object each close it,
MagicStack/uvloop#763), and between the two closes another rollout's socket or file can get that number
and lose it. A process that installs uvloop (uvicorn does) would see other rollouts fail at random.
"""

from __future__ import annotations

import asyncio
import os

from clawgym_env.interfaces import OutputCap


async def drain(fd: int, buffer: OutputCap) -> None:
    """Read a pipe into `buffer` until end of file, never pausing (the writer never blocks on us); `fd` is
    closed once, before this returns or when it is cancelled."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""  # EIO and the like: nothing more will come
        if data:
            buffer.add(data)
        elif not done.done():
            done.set_result(None)

    try:
        os.set_blocking(fd, False)
        loop.add_reader(fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


async def feed(fd: int, data: bytes) -> None:
    """Write `data` to a pipe, then close it (the command sees end of file); a command that exits or closes
    its stdin before reading everything ends the feed. `fd` is closed once, as in `drain`."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    try:
        os.set_blocking(fd, False)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(fd, _set_once, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(fd)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        os.close(fd)


async def finish_pipes(pipes: list[asyncio.Task[None]], grace_s: float) -> None:
    """Wait for a command's pipe tasks; those still open after `grace_s` (a background process holds the
    other end) are cancelled, which closes their fds and keeps what came so far."""
    _, pending = await asyncio.wait(pipes, timeout=grace_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pipes, return_exceptions=True)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
