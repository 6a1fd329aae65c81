"""The proxy's hot routes straight to their handlers, in front of the FastAPI app.

Every model call of every rollout is a POST to `/rollouts/<id>/v1/...`. Through FastAPI each one also
passes its exception middlewares, route matching over every route, and dependency solving for the path
parameter: ~10-15% of the proxy's CPU per call (cProfile, benchmarks/proxy_load.py). `HotRoutes` matches
those few paths by string, builds the starlette `Request` and awaits the handler itself; everything else
(the OpenAPI schema, /health, HEAD probes, unknown paths, trailing-slash redirects) goes to the app as
before. The handlers answer every failure in the API's own format already; anything they raise still gets
a 500 in that format here, (FastAPI's error middleware gave a bare
500).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from clawgym_env.proxy.errors import error_body
from clawgym_env.specs import ApiStyle

log = logging.getLogger("clawgym.proxy")

ROUTE_PREFIX = "/rollouts/"
Handler = Callable[[Request, str], Awaitable[Response]]


class HotRoutes:
    """ASGI app: `POST /rollouts/<id><suffix>` for the suffixes in `handlers` goes to `handler(request, id)`."""

    def __init__(self, app: Any, handlers: dict[str, tuple[Handler, ApiStyle]]) -> None:
        self.app = app
        self.handlers = handlers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(ROUTE_PREFIX):
                slash = path.find("/", len(ROUTE_PREFIX))
                entry = self.handlers.get(path[slash:]) if slash > len(ROUTE_PREFIX) else None
                if entry is not None:
                    await self._serve(entry, path[len(ROUTE_PREFIX) : slash], scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _serve(
        entry: tuple[Handler, ApiStyle], rollout_id: str, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        handler, style = entry
        try:
            response = await handler(Request(scope, receive, send), rollout_id)
        except Exception as exc:  # the handlers answer their own failures; this is a bug's last line
            log.exception("proxy failure on %s", scope.get("path"))
            body = error_body(style, "engine_error", f"clawgym proxy internal error: {type(exc).__name__}")
            response = Response(orjson.dumps(body), 500, media_type="application/json")
        await response(scope, receive, send)  # fails only once the answer is under way: uvicorn closes then
