"""Errors the proxy answers with, in each API's own error format.

What the proxy returns on each failure is chosen on purpose (docs/proxy.md): the official SDKs and the
harnesses retry 408/409/429 and every 5xx (Claude Code for ~180 s), so failures that retrying cannot fix
(caps, a prompt over the context, a stalled or broken engine) are answered with a non-retryable 4xx and the
harness surfaces the failure quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from clawgym_env.specs import ApiStyle

if TYPE_CHECKING:
    from clawgym_env.interfaces import Generation

ErrorKind = Literal[
    "invalid_request",  # malformed body, unsupported feature
    "authentication",  # wrong or missing key
    "not_found",  # unknown rollout
    "gone",  # a closed rollout
    "call_cap",  # the rollout used its calls
    "token_cap",  # the rollout used its tokens
    "context_length",  # the prompt does not fit the policy's context
    "engine_timeout",
    "engine_error",
    "request_too_large",  # body over ProxyGuards.max_body_bytes
    "too_deep",  # JSON nested past ProxyGuards.max_json_depth
    "too_many_in_flight",  # the rollout already has ProxyGuards.max_calls_in_flight_per_rollout calls running
]

STATUS: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "not_found": 404,
    "gone": 410,
    "call_cap": 400,
    "token_cap": 400,
    "context_length": 400,
    "engine_timeout": 400,
    "engine_error": 400,
    "request_too_large": 413,
    "too_deep": 400,
    "too_many_in_flight": 429,  # retrying later does help here
}

_ANTHROPIC_TYPE = {
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "gone": "not_found_error",
    "request_too_large": "request_too_large",
    "too_many_in_flight": "rate_limit_error",
}
_OPENAI_CODE = {
    "authentication": "invalid_api_key",
    "not_found": "not_found",
    "gone": "rollout_closed",
    "call_cap": "rollout_call_limit",
    "token_cap": "rollout_token_limit",
    "context_length": "context_length_exceeded",
    "engine_timeout": "engine_timeout",
    "engine_error": "engine_error",
    "request_too_large": "request_too_large",
    "too_deep": "json_too_deep",
    "too_many_in_flight": "rate_limit_exceeded",
}


class ProxyError(Exception):
    """A failure answered to the harness; `param` names the offending request field where there is one.

    generation: what the engine generated before the failure (kept on the call's record). request: what the
    record keeps instead of a request that was refused before it was read (`{"_omitted": why}`).
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        param: str | None = None,
        *,
        generation: Generation | None = None,
        request: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.generation = generation
        self.request = request

    @property
    def status(self) -> int:
        return STATUS[self.kind]

    def body(self, style: ApiStyle) -> dict[str, Any]:
        return error_body(style, self.kind, self.message, self.param)


def error_body(style: ApiStyle, kind: ErrorKind, message: str, param: str | None = None) -> dict[str, Any]:
    if style == ApiStyle.ANTHROPIC_MESSAGES:
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPE.get(kind, "invalid_request_error"), "message": message},
        }
    error_type = {"authentication": "authentication_error", "too_many_in_flight": "rate_limit_error"}.get(
        kind, "invalid_request_error"
    )
    return {"error": {"message": message, "type": error_type, "param": param, "code": _OPENAI_CODE.get(kind, kind)}}


def validation_message(exc: Any) -> tuple[str, str | None]:
    """A pydantic ValidationError as one readable line plus the dotted path of the first bad field."""
    errors = exc.errors(include_url=False)
    parts = []
    first_param: str | None = None
    for err in errors[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        first_param = first_param or loc or None
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more, first_param
