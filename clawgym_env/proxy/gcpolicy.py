"""Keep the garbage collector's full passes off the proxy's event loop's back.

A full (generation 2) collection walks every tracked object in the process, and while it runs no rollout is
answered. `freeze_startup_objects` moves what is alive when the proxy starts (imports, the tokenizer) into the
permanent generation (`gc.freeze()`), so later passes walk only what was made since: the calls in flight and
the open rollouts. It also makes full passes rarer (`FULL_PASS_EVERY`) and young passes rarer
(`YOUNG_PASS_EVERY`), since a model call allocates hundreds of objects that live across other calls. What it
buys (less GC time per call, more calls per proxy CPU-second at 64-1,000 rollouts) is measured by
`benchmarks/proxy_load.py` (`gc_ms_per_call`); the tuning runs are in docs/results_log/proxy-4.md. The cost: garbage
in reference cycles waits longer to be freed, and a cycle among startup objects is never collected.
"""

from __future__ import annotations

import gc

_frozen = False
FULL_PASS_EVERY = 100  # generation-1 passes per full pass considered (CPython's default is 10)
YOUNG_PASS_EVERY = 50_000  # container allocations per young pass (CPython's default is 700)


def freeze_startup_objects() -> int:
    """Collect once, then freeze what is left, and space full passes out (once per process); return how many
    objects are frozen."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        first, second, third = gc.get_threshold()
        gc.set_threshold(max(first, YOUNG_PASS_EVERY), second, max(third, FULL_PASS_EVERY))
        _frozen = True
    return gc.get_freeze_count()
