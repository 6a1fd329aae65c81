"""Keep the garbage collector's full passes off the proxy's event loop's back.

A full (generation 2) collection walks every tracked object in the process. After the proxy's imports and
the tokenizer (~100k objects; more next to a trainer) one takes tens to hundreds of milliseconds on the
shared 2-core machine, and while it runs no rollout is answered: it showed as the event loop's worst lag
even at one rollout in flight (benchmarks/proxy_load.py, docs/proxy.md). `freeze_startup_objects` moves
what is alive when the proxy starts into the permanent generation (`gc.freeze()`), so later full passes
walk only what was made since: the calls in flight and the open rollouts. The cost: a reference cycle
among those startup objects that becomes garbage later is not collected (memory, bounded by what existed
at start); reference counting still frees everything else.

With 1,000 rollouts open the objects made since start are millions (each open rollout's requests, prompt
ids and splice memory), and a full pass over them took 0.7-1.2 s; CPython 3.11 considered one every 10
generation-1 passes (`gc.get_threshold()[2]`), about every 70k allocations, and ran 10-13 per 4,000 calls.
`FULL_PASS_EVERY` = 100 makes that 10x rarer (1 per 4,000 calls measured; +17% calls per proxy
CPU-second at N = 1,000). Garbage in reference cycles then waits longer to be freed (more memory between
passes; memory-bound tests still pass).

A young (generation 0) pass runs every 700 container allocations by default, and a model call allocates
hundreds (the parsed request, the conversation, the rendered segments, the record): each pass walks
whatever of those is still alive at that moment. With 64 calls in flight, a call's objects live across
many other calls' allocations, so a pass every 5,000 (+5-10% calls per proxy CPU-second at N = 64 over 700)
still walked most of them: the GC took 54-59 µs per call (the GC's own callbacks, `proxy_load --json`
`gc_ms_per_call`). `YOUNG_PASS_EVERY` = 50,000: 22-25 µs per call at N = 64, 75 → 26 µs with 32-call
rollouts (+11% calls per proxy CPU-second there), 90 → 45 µs at N = 1,000, 25 → 17 µs at N = 1; 100,000
and 200,000 took no less (what is left is what calls keep). A young pass takes a few milliseconds at
most (3.3 ms with all 50,000 objects alive, timed here); garbage in reference cycles waits a
little longer to be freed.
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
