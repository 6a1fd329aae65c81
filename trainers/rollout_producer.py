"""The rollout side of the training loop on its own thread, at most `max_staleness` policy versions ahead.

Step batch b (counting from the run's start or resume step s0) is trained by the trainer at version s0 + b.
The producer may start collecting it once the trainer has released version s0 + b - k:

- k = 0 is the synchronous loop: batch b starts after update b - 1 and its bookkeeping (evaluation,
  checkpoint), so every call is served with the weights it is trained against;
- k >= 1 lets the engine generate batch b + 1 (and up to k batches ahead) while the trainer updates on
  batch b. Weight pushes land between calls (the engines wait for in-flight generations and pause new
  ones while they load), so a rollout can straddle a push; its calls keep the version each was served with,
  and trainers.staleness judges the group by its oldest call.

Each produced batch carries the task samplers' position right after it was drawn, so a checkpoint taken
after training it resumes with the very next batch (batches drawn ahead and lost with the process are
drawn again). Time is measured on both sides: how long the collection took, how long the producer waited
for the bound (rollout side idle), and how long the trainer waited for the batch (trainer idle).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainers.rollout_batch import RolloutBatch


@dataclass
class Produced:
    """One step batch and what its collection cost."""

    batch: RolloutBatch
    position: Any  # the task samplers' state right after this batch was drawn (a checkpoint's data position)
    collect_s: float  # wall time of the collection (rollouts, dynamic sampling included)
    bound_wait_s: float  # time the producer waited for the trainer before starting it


class RolloutProducer:
    """Runs `collect()` once per step batch on a daemon thread; `next()` hands batches over in order."""

    def __init__(
        self, collect: Callable[[], tuple[RolloutBatch, Any]], *, start_version: int, batches: int, max_staleness: int
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self._collect = collect
        self.start_version = start_version
        self.batches = batches
        self.max_staleness = max_staleness
        self._released = start_version  # the newest trainer version whose step's bookkeeping is done
        self._stopped = False
        self._cv = threading.Condition()
        self._out: queue.Queue[Produced | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="clawgym-rollout-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for b in range(self.batches):
            waited = time.perf_counter()
            with self._cv:
                while not self._stopped and self._released < self.start_version + b - self.max_staleness:
                    self._cv.wait()
                if self._stopped:
                    return
            waited = time.perf_counter() - waited
            started = time.perf_counter()
            try:
                batch, position = self._collect()
            except BaseException as exc:  # noqa: BLE001 - handed to the trainer thread, which raises it
                self._out.put(exc)
                return
            self._out.put(Produced(batch, position, time.perf_counter() - started, waited))

    def next(self) -> tuple[Produced, float]:
        """The next batch in order, and how long the trainer waited for it; re-raises a collection error."""
        started = time.perf_counter()
        item = self._out.get()
        if isinstance(item, BaseException):
            raise item
        return item, time.perf_counter() - started

    def release(self, version: int) -> None:
        """The trainer is at `version` and done with that step: batches up to version + k may start."""
        with self._cv:
            self._released = max(self._released, version)
            self._cv.notify_all()

    def stop(self, timeout: float = 0.0) -> None:
        """No further batch starts; a collection in progress finishes on its own (the runtime's close ends it)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if timeout:
            self._thread.join(timeout)

    @property
    def released(self) -> int:
        """The newest version the trainer released."""
        return self._released

    @property
    def in_flight(self) -> int:
        """Batches collected but not yet handed to the trainer."""
        return self._out.qsize()
