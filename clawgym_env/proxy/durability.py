"""Group commit for the call log: one fsync, off the event loop, covers every call written before it.

With `ServingProxy(fsync=True)` a generated call must be on disk (not only in the OS) before its answer
goes out, so a machine crash loses no call a harness saw. An fsync per call on the event loop stalls every
other rollout for the disk's flush time (milliseconds; more under load); with 1,000 rollouts in flight that
is the whole loop. `GroupCommit` keeps the guarantee and batches: each call's record is written (in the OS)
as before, then its answer awaits `durable()`, which waits for an fsync, run in a worker thread, that
started after that write. Calls arriving while one fsync runs share the next one, so the number of fsyncs
per second is bounded by the disk, not by the call rate.

Receipts (`calls.receipts`) are synced with the same fsync when one runs; a receipt lost in a crash leaves
its call reading `delivered: false`, the conservative default (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class GroupCommit:
    """Counts writes, and makes `durable()` wait for one shared fsync that covers them all."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync  # flushes every file written so far to disk (CallLog.sync); raises OSError
        self.written = 0  # writes so far
        self.synced = 0  # writes covered by the last fsync that succeeded
        self.fsyncs = 0  # fsyncs run (each covers every write before it started)
        self._task: asyncio.Task[None] | None = None

    def wrote(self) -> None:
        self.written += 1

    async def durable(self) -> None:
        """Return once every write made so far is on disk; raise the fsync's OSError if it failed.

        A caller cancelled while waiting does not cancel the fsync the others wait for.
        """
        upto = self.written
        while self.synced < upto:
            if self._task is None:
                self._task = asyncio.ensure_future(self._sync_once(self.written))
            await asyncio.shield(self._task)

    async def _sync_once(self, target: int) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._sync)
            self.fsyncs += 1
            self.synced = max(self.synced, target)
        finally:
            self._task = None
