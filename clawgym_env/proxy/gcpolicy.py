"""Keep the garbage collector's full passes off the proxy's event loop's back.

A full (generation 2) collection walks every tracked object in the process. After the proxy's imports and
the tokenizer (~100k objects; more next to a trainer) one takes tens to hundreds of milliseconds on the
shared 2-core machine, and while it runs no rollout is answered: it showed as the event loop's worst lag
even at one rollout in flight (benchmarks/proxy_load.py, docs/proxy.md). `freeze_startup_objects` moves
what is alive when the proxy starts into the permanent generation (`gc.freeze()`), so later full passes
walk only what was made since: the calls in flight and the open rollouts. The cost: a reference cycle
among those startup objects that becomes garbage later is not collected (memory, bounded by what existed
at start); reference counting still frees everything else.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_startup_objects() -> int:
    """Collect once, then freeze what is left (once per process); return how many objects are frozen."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
    return gc.get_freeze_count()
