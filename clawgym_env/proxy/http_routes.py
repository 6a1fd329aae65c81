"""The proxy's one route table, served two ways, and how a pipeline `Answer` becomes an HTTP response.

Every model call of every rollout is a POST to `/rollouts/<id>/v1/...`. `HotRoutes` matches those few paths
by string, builds the starlette `Request` and awaits the handler itself: through FastAPI each call would also
pass its exception middlewares, route matching and dependency solving, ~10-15 % of the proxy's CPU per call
(`benchmarks/proxy_handler.py`). Everything else (the OpenAPI schema, /health, HEAD probes, unknown paths,
trailing-slash redirects) goes to the FastAPI app, which `build_app` makes from the same table. A handler's
unexpected exception still gets a 500 in the API's own format.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response, StreamingResponse
from pydantic.json_schema import models_json_schema
from starlette.requests import Request

from clawgym_env.chat import jsonio
from clawgym_env.proxy.apis import AnthropicAdapter, ApiAdapter, ChatAdapter, ResponsesAdapter
from clawgym_env.proxy.apis.anthropic import CountTokensRequest, MessagesRequest
from clawgym_env.proxy.apis.openai_chat import ChatCompletionRequest
from clawgym_env.proxy.apis.openai_responses import ResponsesRequest
from clawgym_env.proxy.errors import error_body
from clawgym_env.proxy.pipeline import Answer
from clawgym_env.specs import ApiStyle

log = logging.getLogger("clawgym.proxy")

ROUTE_PREFIX = "/rollouts/"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# The model-call routes: path under /rollouts/<id> -> (API adapter, request schema, OpenAPI tag)
GENERATION_ROUTES: dict[str, tuple[ApiAdapter, type, str]] = {
    "/v1/messages": (AnthropicAdapter(), MessagesRequest, "anthropic"),
    "/v1/chat/completions": (ChatAdapter(), ChatCompletionRequest, "openai"),
    "/v1/responses": (ResponsesAdapter(), ResponsesRequest, "openai"),
}
Handler = Callable[[Request, str], Awaitable[Response]]


class RouteHandlers:
    """What the routes call: `generation(adapter)` is the handler of a model-call route."""

    def __init__(self, generation: Callable[[ApiAdapter], Handler], count_tokens: Handler, models: Handler):
        self.generation, self.count_tokens, self.models = generation, count_tokens, models

    def hot(self) -> dict[str, tuple[Handler, ApiStyle]]:
        routes = {
            path: (self.generation(adapter), adapter.style) for path, (adapter, _, _) in GENERATION_ROUTES.items()
        }
        routes[COUNT_TOKENS_PATH] = (self.count_tokens, ApiStyle.ANTHROPIC_MESSAGES)
        return routes


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
            response = json_response(body, 500)
        await response(scope, receive, send)  # fails only once the answer is under way: uvicorn closes then


def serve(handlers: RouteHandlers) -> HotRoutes:
    """The ASGI app of the proxy: the hot routes in front of the FastAPI app."""
    return HotRoutes(build_app(handlers), handlers.hot())


def build_app(handlers: RouteHandlers) -> FastAPI:
    """The FastAPI app of the route table, with the request schemas in its OpenAPI document."""
    app = FastAPI(
        title="ClawGym serving proxy",
        description="Anthropic Messages, OpenAI Chat Completions and OpenAI Responses for one policy, per rollout.",
        version="1",
    )
    prefix = "/rollouts/{rollout_id}"
    errors: dict[int | str, dict[str, Any]] = {
        400: {"description": "bad request"},
        401: {"description": "wrong key"},
        404: {"description": "unknown rollout"},
        410: {"description": "closed rollout"},
    }

    def body_of(model: type) -> dict[str, Any]:
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
        return {"requestBody": {"required": True, "content": content}}

    posts = [
        (path, handlers.generation(adapter), schema, tag) for path, (adapter, schema, tag) in GENERATION_ROUTES.items()
    ]
    posts.append((COUNT_TOKENS_PATH, handlers.count_tokens, CountTokensRequest, "anthropic"))
    for path, handler, schema, tag in posts:
        app.add_api_route(
            prefix + path, handler, methods=["POST"], openapi_extra=body_of(schema), responses=errors, tags=[tag]
        )
    app.add_api_route(prefix + "/v1/models", handlers.models, methods=["GET"], responses=errors)

    async def ok() -> Response:
        return Response(status_code=200)  # HEAD probes (Claude Code's preconnect) say nothing about a rollout

    app.add_api_route("/", ok, methods=["HEAD"])
    app.add_api_route(prefix, ok, methods=["HEAD"])

    async def health() -> Response:
        return json_response({"status": "ok"})  # counts are for the host (`table_sizes()`), not for sandboxes

    app.add_api_route("/health", health, methods=["GET"])

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            models = [model for _, _, model, _ in posts]
            _, defs = models_json_schema(
                [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(content=jsonio.dumps(body), status_code=status, media_type="application/json", headers=headers)


def to_response(answer: Answer, on_end: Callable[[], None]) -> Response:
    """The HTTP response of a pipeline answer; `on_end` runs once it is sent (a live stream: once it ends)."""
    if answer.pump is not None:
        return LiveResponse(answer.pump, answer.headers, on_end=on_end)
    on_end()
    if answer.media_type == "text/event-stream":
        return StreamingResponse(_one_chunk(answer.body), media_type=answer.media_type, headers=answer.headers)
    return Response(answer.body, answer.status, headers=answer.headers or None, media_type=answer.media_type)


async def _one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data


class LiveResponse(Response):
    """An SSE response whose body a coroutine writes while the generation runs (`send(data, last=False)`)."""

    media_type = "text/event-stream"

    def __init__(
        self, pump: Callable[..., Awaitable[None]], headers: dict[str, str], on_end: Callable[[], None] | None = None
    ) -> None:
        super().__init__(content=None, headers=headers, media_type=self.media_type)
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]  # chunked
        self.pump = pump
        self.on_end = on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False

        async def write(data: bytes, last: bool = False) -> None:
            nonlocal ended
            ended = ended or last
            await send({"type": "http.response.body", "body": data, "more_body": not last})

        try:
            await self.pump(write)
        finally:
            if self.on_end is not None:
                self.on_end()
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
