"""Renderers: API conversation -> prompt token ids, generated ids -> text / tool calls / reasoning."""

from clawgym_env.chat.renderers.base import (
    EchoContext,
    ParsedOutput,
    RenderedPrompt,
    Renderer,
    SplicedTurn,
    SpliceLookup,
    check_renderer_fits_engine,
)
from clawgym_env.chat.renderers.chatml import ChatMLRenderer, TemplateMismatch
from clawgym_env.chat.renderers.toolcall_parsing import parse_generation_text

__all__ = [
    "ChatMLRenderer",
    "EchoContext",
    "ParsedOutput",
    "RenderedPrompt",
    "Renderer",
    "SpliceLookup",
    "SplicedTurn",
    "TemplateMismatch",
    "check_renderer_fits_engine",
    "parse_generation_text",
]
