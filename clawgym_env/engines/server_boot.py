"""Which life of a vLLM server answered: a header on every answer, so the pool needs no version RPC per call.

`VLLMServerPool` must know the policy version behind every generation. The version changes only two ways:
the pool loads new weights (it knows when), or the server restarts (back to the model it was started with).
A restart is a new process, so each server life carries an id (`CLAWGYM_SERVER_BOOT`, set by `VLLMServer` at
each start and inherited by all of the server's API processes), and `BootIdMiddleware`, loaded into vLLM's
API server with `--middleware`, puts it on every answer as `x-clawgym-boot`. Without that variable it adds
nothing: an id made up per process would differ between the API processes of one server
(`--api-server-count`), and every call would look like a restart. The pool reads a server's version once
per life (the RPC's answer carries the id too) and then checks each generation's id against it: the same
id, the same version; another id, a restart, and the call fails. A server without the header is checked
by RPC before and after each call, as before.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

BOOT_HEADER = "x-clawgym-boot"
BOOT_ENV = "CLAWGYM_SERVER_BOOT"


def new_boot_id() -> str:
    return uuid.uuid4().hex


class BootIdMiddleware:
    """ASGI middleware: adds `x-clawgym-boot: <this server life's id>` to every HTTP answer (streams too).

    boot_id: the id (tests, stand-ins); by default `CLAWGYM_SERVER_BOOT`, and no header without it."""

    def __init__(self, app: Any, boot_id: str | None = None) -> None:
        self.app = app
        boot = boot_id or os.environ.get(BOOT_ENV)
        self.boot_id = boot.encode() if boot else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.boot_id is None:
            await self.app(scope, receive, send)
            return

        async def send_with_boot(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (BOOT_HEADER.encode(), self.boot_id)]}
            await send(message)

        await self.app(scope, receive, send_with_boot)
