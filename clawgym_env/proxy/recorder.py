"""The proxy's call log: every rollout's records and delivery receipts, made durable in groups when asked."""

from __future__ import annotations

import logging
from pathlib import Path

from clawgym_env.proxy.durability import GroupCommit
from clawgym_env.proxy.guards import GuardStats
from clawgym_env.proxy.rollout_state import RolloutState
from clawgym_env.records import CallLog, DeliveryReceipt, ModelCall, read_lines

log = logging.getLogger("clawgym.proxy")


class Recorder:
    """The proxy's call log: every rollout's records, delivery receipts, a grouped fsync when asked for, and
    the count of records it could not write (`GuardStats.record_failures`)."""

    def __init__(self, path: Path, *, fsync: bool, stats: GuardStats) -> None:
        self.path = path
        self.fsync = fsync
        self.stats = stats
        self.log: CallLog | None = None
        self.group: GroupCommit | None = None

    def open(self) -> CallLog:
        if self.log is None:
            # fsync=True: records are synced in groups off the loop before answers go out (GroupCommit)
            self.log = CallLog(self.path, fsync=False)
            self.group = GroupCommit(self.log.sync) if self.fsync else None
        return self.log

    def record(self, state: RolloutState, call: ModelCall) -> None:
        """Append the call to the log and note where its line is; raises OSError if the log cannot take it.
        The record is final: the proxy never changes it, and `calls` reads it back from the line.

        A request the log's writer cannot serialize (nested past its limit) is recorded without it.
        """
        log_ = self.open()
        try:
            line = log_.append(call)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            call.request = {"_omitted": f"not serializable: {exc}"}
            line = log_.append(call)
        if self.group is not None:
            self.group.wrote()
        state.lines.append(line)
        if state.closed:  # a call that finished after its rollout closed: the log need not keep it
            log_.forget(call.rollout_id)

    def calls(self, state: RolloutState) -> list[ModelCall]:
        """The rollout's calls recorded so far, read back from the log with their receipts, in call order:
        new objects, the caller's own (the one way a rollout's calls leave the proxy; a dead shard's are read
        from the same log, `read_calls`)."""
        if not state.lines:
            return []
        return sorted(read_lines(self.path, state.lines, state.receipts), key=lambda c: c.call_index)

    def receipt(self, receipts: dict[int, bool | None], call: ModelCall, delivered: bool) -> None:
        """Whether the call's reply reached its client whole: a line in the receipts file, and in its rollout's
        `receipts` for `calls` (the call's record stays as written)."""
        receipts[call.call_index] = delivered
        if self.log is None:
            return  # the proxy stopped; the record keeps delivered=False
        try:
            self.log.append_receipt(
                DeliveryReceipt(rollout_id=call.rollout_id, call_index=call.call_index, delivered=delivered)
            )
        except (OSError, ValueError) as exc:
            log.warning("could not write the delivery receipt of %s#%d: %s", call.rollout_id, call.call_index, exc)

    async def durable(self) -> None:
        """With fsync: return once every record written so far is on disk (raises OSError if it cannot be)."""
        if self.group is not None:
            await self.group.durable()

    def failed(self, state: RolloutState, what: str, exc: BaseException) -> None:
        log.error("could not record %s: %s", what, exc)
        self.stats.record_failures += 1
        state.stats.count_error("record_failed")

    def forget(self, rollout_id: str) -> None:
        if self.log is not None:
            self.log.forget(rollout_id)  # it kept the rollout's calls for later lines to refer to

    async def close(self) -> None:
        if self.log is not None:
            if self.group is not None:
                try:
                    await self.group.durable()  # no fsync thread may outlive the files it syncs
                except OSError:
                    pass
            self.log.close()
            self.log = None
