"""The proxy's garbage-collector policy (clawgym_env.proxy.gcpolicy) is in force once a proxy has started."""

from __future__ import annotations

import gc

from clawgym_env.proxy.gcpolicy import FULL_PASS_EVERY, YOUNG_PASS_EVERY, freeze_startup_objects


def test_startup_objects_are_frozen_and_passes_spaced_out() -> None:
    frozen = freeze_startup_objects()
    assert frozen > 0 and gc.get_freeze_count() == frozen  # what was alive at start is out of every pass
    young, _, full = gc.get_threshold()
    assert young >= YOUNG_PASS_EVERY > 700  # CPython's default young threshold is 700
    assert full >= FULL_PASS_EVERY > 10
    assert freeze_startup_objects() == gc.get_freeze_count()  # once per process: a second call changes nothing
