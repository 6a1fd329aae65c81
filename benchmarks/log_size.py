"""The call log's size: whole lines against lines that hold what each call adds (clawgym_env.records).

    .venv/bin/python -m benchmarks.log_size RUN/rollouts/calls.jsonl [more calls.jsonl ...]

Each given log (any recorded run: whole lines or not) is read back (`read_calls`) and written again the way
the proxy writes it: each rollout's requests pass through the proxy's request sharing (what a request
repeats becomes the previous request's very objects, as when it arrived), then `CallLog.append`, and each
rollout is closed after its last call. Printed per log: calls, calls per rollout, bytes written whole
(`record_line` of every call) and as the proxy writes now, the ratio, and the most calls the reader held at
once; the rewritten log is read back and compared with the original calls.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from clawgym_env.proxy.request_sharing import RequestMemory
from clawgym_env.records import CallLog, ModelCall, read_calls, record_line


def rewrite(calls: list[ModelCall], path: Path) -> int:
    """Write `calls` (in log order) to a fresh log at `path` as the proxy would; its size in bytes."""
    requests: dict[str, RequestMemory] = {}
    last = {call.rollout_id: position for position, call in enumerate(calls)}
    with CallLog(path) as log:
        for position, call in enumerate(calls):
            memory = requests.setdefault(call.rollout_id, RequestMemory())
            log.append(call.model_copy(update={"request": memory.share(dict(call.request))}))
            if last[call.rollout_id] == position:
                log.forget(call.rollout_id)  # the proxy closes the rollout: the receipts note it
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", type=Path)
    args = parser.parse_args()
    print(f"{'log':70} {'calls':>6} {'per rollout':>11} {'whole kB':>9} {'now kB':>8} {'whole/now':>9} {'held':>5}")
    for path in args.logs:
        calls = list(read_calls(path))
        rollouts = len({c.rollout_id for c in calls})
        whole = sum(len(record_line(c)) for c in calls)
        with tempfile.TemporaryDirectory() as tmp:
            now = rewrite(calls, Path(tmp) / "calls.jsonl")
            reader = read_calls(Path(tmp) / "calls.jsonl")
            back = list(reader)
        if [c.model_dump() for c in back] != [c.model_dump() for c in calls]:
            raise SystemExit(f"{path}: the rewritten log does not read back equal")
        print(
            f"{str(path)[-70:]:70} {len(calls):6} {len(calls) / max(1, rollouts):11.1f} "
            f"{whole / 1e3:9.0f} {now / 1e3:8.0f} {whole / max(1, now):9.1f}x {reader.most_held:5}"
        )


if __name__ == "__main__":
    main()
