"""Conversations and their tokens: the normalized conversation every API becomes, the renderers that turn it
into prompt ids (splicing in the ids a rollout really generated) and parse generations back, and the JSON
I/O they share. Below the proxy, which serves it over HTTP, and the white-box loop, which calls it directly.
"""

from clawgym_env.chat.conversation import Conversation, Message, ToolCall, ToolSpec
from clawgym_env.chat.renderers import ChatMLRenderer, Renderer, TemplateMismatch

__all__ = ["ChatMLRenderer", "Conversation", "Message", "Renderer", "TemplateMismatch", "ToolCall", "ToolSpec"]
