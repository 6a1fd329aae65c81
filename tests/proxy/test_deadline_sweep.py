"""Header/body deadlines are checked by one sweep per proxy (GuardState), not by a timer per request."""

from __future__ import annotations

import asyncio

from clawgym_env.proxy.guards import GuardState, ProxyGuards


class Conn:
    """Stands in for a GuardedHttpProtocol: the fields the sweep reads, and a record of deadlines passed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, due_in: float | None) -> None:
        self.loop = loop
        self._deadline_at = None if due_in is None else loop.time() + due_in
        self.passed = 0

    def _deadline_passed(self) -> None:
        self._deadline_at = None
        self.passed += 1


def test_the_sweep_closes_only_overdue_connections_and_stops_when_none_is_live():
    state = GuardState(ProxyGuards(header_timeout_s=0.3, body_timeout_s=5))
    assert state.sweep_interval_s == 0.03  # a tenth of the shortest deadline

    async def run() -> tuple[Conn, Conn, Conn]:
        loop = asyncio.get_running_loop()
        late, later, idle = Conn(loop, 0.05), Conn(loop, 10), Conn(loop, None)
        for conn in (late, later, idle):
            state.watch(conn)
        await asyncio.sleep(0.2)
        assert late.passed == 1 and later.passed == 0 and idle.passed == 0
        state.live.clear()  # every connection lost
        await asyncio.sleep(0.1)
        assert state.sweep is None  # no timer left behind once no connection is open
        return late, later, idle

    asyncio.run(run())


def test_a_sweep_stranded_on_a_closed_loop_does_not_disable_deadlines_on_the_next():
    state = GuardState(ProxyGuards(header_timeout_s=0.3, body_timeout_s=5))

    async def first() -> None:
        state.watch(Conn(asyncio.get_running_loop(), 10))  # the loop closes with this sweep pending

    async def second() -> int:
        state.live.clear()
        conn = Conn(asyncio.get_running_loop(), 0.05)
        state.watch(conn)
        await asyncio.sleep(0.2)
        return conn.passed

    asyncio.run(first())
    assert state.sweep is not None  # stranded
    assert asyncio.run(second()) == 1
