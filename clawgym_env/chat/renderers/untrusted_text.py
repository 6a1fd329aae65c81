"""Encoding text that the chat template did not write, so that it cannot make a control token.

A tokenizer turns the text of an added token (`<|im_end|>`, `<tool_call>`, `<think>`) into that token's id
wherever the text appears. In a prompt, text that someone other than the template wrote (a tool's output, a
user message, a system prompt holding a workspace file, the evidence a judge is shown) could so forge turns,
tool calls or reasoning. `UntrustedTextEncoder` encodes a prompt as pieces, each saying which added tokens
its text may make (its trust):

- `"template"`: all of them (the chat template's own markers);
- `"model"`: the non-special ones (`<tool_call>`, `<think>`): the model's own turns re-rendered as text, which
  carry them as the model wrote them; special tokens (turn boundaries, end of text) are text;
- `"plain"`: none: every added token's text is encoded as the ordinary ids of its characters.

Each such text kept as text is counted (the proxy's `control_token_texts`). The text between real tokens is
encoded in one pass across pieces, as the tokenizer itself does (added tokens split the text before it is
pre-tokenized), so pieces with nothing to neutralise get exactly the ids of tokenizing their concatenation.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tokenizers import Tokenizer

Trust = Literal["template", "model", "plain"]
TrustedPiece = tuple[str, Trust]


def _alternation(texts: Sequence[str]) -> re.Pattern[str]:
    """Leftmost, then longest first: how a tokenizer matches its added tokens."""
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)) or "(?!)")


class UntrustedTextEncoder:
    """Encodes pieces of a prompt with `backend` (a `tokenizers.Tokenizer`), each piece by its trust."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend = backend
        added = list(backend.get_added_tokens_decoder().values())
        self.token_ids = {t.content: backend.token_to_id(t.content) for t in added}
        self.special = frozenset(t.content for t in added if t.special)
        self._added_ids = frozenset(self.token_ids.values())
        self._added_re = _alternation(list(self.token_ids))
        self._bare_tokenizer: Tokenizer | None = None  # made on first need (see `_bare`)

    @classmethod
    def of(cls, tokenizer: Any) -> UntrustedTextEncoder:
        """For a transformers fast tokenizer (or a `tokenizers.Tokenizer`)."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not isinstance(backend, Tokenizer):
            raise TypeError(f"{type(tokenizer).__name__} has no Rust (fast) backend tokenizer to encode text safely")
        return cls(backend)

    @property
    def _bare(self) -> Tokenizer:
        """The same tokenizer without its added tokens: any text is encoded as the ordinary ids of its
        characters (the added tokens' ids lie outside the model's vocabulary)."""
        if self._bare_tokenizer is None:
            spec = json.loads(self.backend.to_str())
            spec["added_tokens"] = []
            bare = Tokenizer.from_str(json.dumps(spec))
            for text in self.token_ids:  # a vocabulary that holds an added token's text itself could make it
                if self._added_ids.intersection(bare.encode(text, add_special_tokens=False).ids):
                    raise ValueError(f"this tokenizer makes {text!r} a token even without its added tokens")
            self._bare_tokenizer = bare
        return self._bare_tokenizer

    def _scan(self, pieces: Sequence[TrustedPiece]) -> tuple[list[int], int]:
        """The ids of the added tokens whose text `pieces` spell and may make, in order, and how many
        added-token texts they spell and may not make (those are kept as text)."""
        allowed: list[int] = []
        neutralised = 0
        for text, trust in pieces:
            if trust == "plain":
                neutralised += len(self._added_re.findall(text))
                continue
            for match in self._added_re.finditer(text):
                token = match.group()
                if trust == "model" and token in self.special:
                    neutralised += 1
                else:
                    allowed.append(self.token_ids[token])
        return allowed, neutralised

    def encode(self, pieces: Sequence[TrustedPiece]) -> tuple[list[int], list[tuple[int, int]], int]:
        """Ids and character offsets (into the joined text) of `pieces`, and how many added-token texts
        were kept as text. Without any, one pass of the tokenizer over the joined text, kept only if the
        added tokens it made are exactly those the pieces may make (not one spelled across two pieces, or
        matched only after the tokenizer's normaliser)."""
        allowed, neutralised = self._scan(pieces)
        if not neutralised:
            encoding = self.backend.encode("".join(p[0] for p in pieces), add_special_tokens=False)
            made = [i for i in encoding.ids if i in self._added_ids]
            if made == allowed:
                return list(encoding.ids), list(encoding.offsets), 0
            neutralised = max(1, len(made) - len(allowed))
        ids, offsets = self.encode_split(pieces)
        return ids, offsets, neutralised

    def encode_split(self, pieces: Sequence[TrustedPiece]) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and offsets of `pieces`: the added tokens each piece may make become their ids, all other text
        (between them, across pieces) is encoded by the tokenizer without its added tokens. Without text to
        neutralise this gives the ids and offsets of the one-pass encoding."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        pending: list[str] = []
        pending_at = pos = 0

        def flush() -> None:
            chunk = "".join(pending)
            if chunk:
                encoding = self._bare.encode(chunk, add_special_tokens=False)
                ids.extend(encoding.ids)
                offsets.extend((pending_at + a, pending_at + b) for a, b in encoding.offsets)
            pending.clear()

        for text, trust in pieces:
            cursor = 0
            if trust != "plain":
                for match in self._added_re.finditer(text):
                    token = match.group()
                    if trust == "model" and token in self.special:
                        continue  # stays in the text
                    pending.append(text[cursor : match.start()])
                    flush()
                    ids.append(self.token_ids[token])
                    offsets.append((pos + match.start(), pos + match.end()))
                    cursor = match.end()
                    pending_at = pos + cursor
            pending.append(text[cursor:])
            pos += len(text)
        flush()
        return ids, offsets

    def encode_chat(
        self,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        *,
        trust: Mapping[str, Trust] | None = None,
        **template_kwargs: Any,
    ) -> tuple[list[int], int]:
        """`tokenizer.apply_chat_template(messages, **template_kwargs)` as ids, each message's text content
        encoded with the trust of its role (`trust`, default `"plain"` for every role), and how many added-token
        texts were kept as text. The template is rendered with a unique placeholder in place of each content,
        so whatever the template itself writes (turn markers, tool calls, tool specs) stays real tokens; only
        `content` is untrusted (other fields, `tools` included, are the template's). The template must show
        each content once, unchanged (not trimmed, not branched on): else ValueError.
        """
        trust = trust or {}
        nonce = secrets.token_hex(8)
        while any(nonce in str(m.get("content", "")) for m in messages):
            nonce = secrets.token_hex(8)
        contents: dict[str, TrustedPiece] = {}
        staged: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            content, level = message.get("content"), trust.get(str(message.get("role")), "plain")
            if content is not None and not isinstance(content, str) and level != "template":
                raise ValueError(f"message {i}: only text content can be encoded as text, not {type(content)}")
            if isinstance(content, str) and content and level != "template":
                mark = f"\ue000{nonce}:{i}\ue001"  # private-use characters: nothing a template escapes or trims
                contents[mark] = (content, level)
                message = {**message, "content": mark}
            staged.append(dict(message))
        text = tokenizer.apply_chat_template(staged, tokenize=False, **template_kwargs)
        pieces: list[TrustedPiece] = []
        cursor = 0
        seen: list[str] = []
        for match in re.finditer(f"\ue000{nonce}:[0-9]+\ue001", text):
            pieces.append((text[cursor : match.start()], "template"))
            pieces.append(contents[match.group()])
            seen.append(match.group())
            cursor = match.end()
        pieces.append((text[cursor:], "template"))
        unchanged = "".join(p[0] for p in pieces) == tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, **template_kwargs
        )
        if sorted(seen) != sorted(contents) or not unchanged:
            raise ValueError("the chat template must show each message's content exactly once, unchanged")
        ids, _, neutralised = self.encode(pieces)
        return ids, neutralised
