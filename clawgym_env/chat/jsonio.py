"""JSON writing for what the proxy sends and compares: orjson, with the standard library for what it refuses.

orjson writes no integer past 64 bits ("Integer exceeds 64-bit range"). Such integers reach the proxy from
harness requests and from the policy itself (a generated tool call `{"n": 1e30}`, or a float the argument
canonicalisation turns into an int), so every writer on the request and answer path goes through here.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON bytes; the standard library's writer where orjson refuses the value."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0)
    except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits (or a key it does not write)
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_str(value: Any, *, sort_keys: bool = False) -> str:
    return dumps(value, sort_keys=sort_keys).decode()
