"""The wire protocol between the host and a sandbox's init (sandbox_init.c / sandbox_init.py).

Requests go over a SOCK_SEQPACKET socket, one per message, fields separated by NUL; an exec request
carries the command's stdin/stdout/stderr pipe ends (SCM_RIGHTS). Replies are one line of text each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

MAX_REQUEST = 1 << 20  # the inits read requests into a buffer of this size


def exec_request(request_id: int, cwd: str, argv: Sequence[str], env: Mapping[str, str]) -> bytes:
    """'exec\\0<id>\\0<cwd>\\0<argc>\\0<argv...>\\0<NAME=value...>', the inits' request format."""
    fields = [b"exec", str(request_id).encode(), os.fsencode(cwd), str(len(argv)).encode(), *map(os.fsencode, argv)]
    for name, value in env.items():
        if "=" in name or not name:
            raise ValueError(f"invalid environment variable name {name!r}")
        fields.append(os.fsencode(f"{name}={value}"))
    if any(b"\0" in field for field in fields):
        raise ValueError("the command, its folder and its environment must not contain NUL characters")
    request = b"\0".join(fields)
    if len(request) >= MAX_REQUEST:
        raise ValueError(f"command and environment too large ({len(request)} bytes, at most {MAX_REQUEST - 1})")
    return request


def kill_request(request_id: int) -> bytes:
    return b"kill\0%d" % request_id


def parse_reply(data: bytes) -> dict[str, Any]:
    """The init's one-line replies: 'exit <id> <code> <signal>' or 'error <id> <message>'."""
    words = data.decode(errors="replace").split(" ", 2)
    try:
        if words[0] == "exit":
            code, _, sig = words[2].partition(" ")
            return {"op": "exit", "id": int(words[1]), "code": int(code), "signal": int(sig or 0) or None}
        if words[0] == "error":
            return {"op": "error", "id": int(words[1]), "error": words[2] if len(words) > 2 else ""}
    except (IndexError, ValueError):
        pass
    return {"op": "unknown"}
