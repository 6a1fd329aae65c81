"""A command's pipes on the host: everything read or written, and each fd closed exactly once, on asyncio and uvloop.

The double close this guards against (uvloop's pipe transports, MagicStack/uvloop#763) closed whatever file
another rollout had just opened under the same number: 4 of 64 rollouts failed in one load-test run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import uvloop

from clawgym_env.interfaces import OutputCap
from clawgym_env.sandbox.pipes import drain, feed, finish_pipes

ROOT = Path(__file__).resolve().parents[2]
LOOPS = pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


async def settle() -> None:
    """Whatever a loop still had scheduled (a transport's deferred close) runs, and so do finalizers."""
    for _ in range(5):
        await asyncio.sleep(0)
    gc.collect()
    for _ in range(5):
        await asyncio.sleep(0)


async def bystander_survives(fd: int) -> bool:
    """Put another file at the number `fd` had, let the loop and the collector run: is it still open?"""
    other = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: often `fd` itself
    if other != fd:
        os.dup2(other, fd)
        os.close(other)
    await settle()
    survived = not closed(fd) and os.path.samestat(os.fstat(fd), os.stat(os.devnull))
    if not closed(fd):
        os.close(fd)
    return survived


@LOOPS
def test_drain_reads_everything_and_closes_its_fd_once(new_loop):
    async def main() -> tuple[bytes, bool, bool]:
        read, write = os.pipe()
        buffer = OutputCap(1 << 20)
        reader = asyncio.create_task(drain(read, buffer))
        await feed(write, b"x" * 300_000)  # past a pipe's 64 KiB: both sides wait on the loop
        await reader
        return buffer.result()[0], closed(read), await bystander_survives(read)

    data, closed_on_return, survived = run(new_loop, main())
    assert data == b"x" * 300_000
    assert closed_on_return and survived  # closed by the time it returns, and never again


@LOOPS
def test_feed_ends_when_the_reader_goes_away_and_closes_its_fd_once(new_loop):
    async def main() -> tuple[bool, bool]:
        read, write = os.pipe()
        feeder = asyncio.create_task(feed(write, b"y" * 1_000_000))
        await asyncio.sleep(0.01)
        os.close(read)  # the command exits without reading its stdin: EPIPE, not an error
        await asyncio.wait_for(feeder, 5)
        return closed(write), await bystander_survives(write)

    closed_on_return, survived = run(new_loop, main())
    assert closed_on_return and survived


@LOOPS
def test_a_pipe_held_open_is_cancelled_after_the_grace_and_closed(new_loop):
    async def main() -> tuple[bytes, bool, bool]:
        read, write = os.pipe()  # `write` stays open: a background process still holding the command's stdout
        os.write(write, b"kept")
        buffer = OutputCap(100)
        await finish_pipes([asyncio.create_task(drain(read, buffer))], grace_s=0.05)
        os.close(write)
        return buffer.result()[0], closed(read), await bystander_survives(read)

    data, closed_on_return, survived = run(new_loop, main())
    assert data == b"kept" and closed_on_return and survived


def run(new_loop, coro):
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)


CLOSES = """
import asyncio, gc, os, sys, uvloop
from clawgym_env.interfaces import OutputCap
from clawgym_env.sandbox.pipes import drain, feed

async def main():
    read, write = os.pipe()
    reader = asyncio.create_task(drain(read, OutputCap(1 << 20)))
    await feed(write, b"x" * 300_000)
    await reader
    for _ in range(5):
        await asyncio.sleep(0)
    gc.collect()
    print(read, write, flush=True)
    os._exit(0)  # nothing after this point may close anything

loop = uvloop.new_event_loop() if sys.argv[1] == "uvloop" else asyncio.new_event_loop()
loop.run_until_complete(main())
"""


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_each_pipe_end_is_closed_by_exactly_one_close_call(loop_name, tmp_path):
    """Counted by strace: a second close of a number is how another thread's file gets closed (it only shows
    when that thread opens something between the two, so a behaviour test sees it rarely)."""
    trace = tmp_path / "trace"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=pipe2,close", "-o", str(trace), sys.executable, "-c", CLOSES, loop_name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    read, write = (int(n) for n in done.stdout.split())
    lines = trace.read_text().splitlines()
    made = max(i for i, line in enumerate(lines) if re.search(rf"pipe2\(\[{read}, {write}\]", line))
    closes = Counter(int(m.group(1)) for line in lines[made:] if (m := re.search(r"close\((\d+)\)", line)))
    assert (closes[read], closes[write]) == (1, 1)
