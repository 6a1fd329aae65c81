"""One adapter per model API: request -> Conversation, finished call -> response body or SSE events."""

from clawgym_env.proxy.apis.anthropic import AnthropicAdapter, CountTokensAdapter
from clawgym_env.proxy.apis.base import ApiAdapter, CallOutput
from clawgym_env.proxy.apis.openai_chat import ChatAdapter
from clawgym_env.proxy.apis.openai_responses import ResponsesAdapter

__all__ = ["AnthropicAdapter", "ApiAdapter", "CallOutput", "ChatAdapter", "CountTokensAdapter", "ResponsesAdapter"]
