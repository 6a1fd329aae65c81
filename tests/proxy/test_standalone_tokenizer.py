"""Every way of starting a proxy renders with the served model's own tokenizer and chat template.

Qwen2.5's vocabulary lacks Qwen3's <tool_response> / <think> tokens: their ids (151665-151668) are [PAD]
entries there. A model folder with such a vocabulary is built from tiny-qwen3 (its weights, a Qwen2.5-style
tokenizer.json): a proxy that rendered it with the Qwen3 tokenizer would put 151665 in every tool result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.chat.conversation import Conversation, Message, ToolCall
from clawgym_env.engines.models import make_tiny_qwen3
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.interfaces import Policy
from clawgym_env.proxy.__main__ import build_policy, main
from clawgym_env.proxy.server import ServingProxy
from clawgym_env.records import read_calls

QWEN3_ONLY = {151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
TOOL_RUN = Conversation(
    [
        Message("user", "ls"),
        Message("assistant", "", [ToolCall("ls", {})]),
        Message("tool", "a.txt"),
    ]
)


@pytest.fixture(scope="module")
def qwen25_style_model(tmp_path_factory) -> Path:
    """tiny-qwen3's weights with a vocabulary where Qwen3's extra tokens are [PAD] entries (as in Qwen2.5)."""
    source = make_tiny_qwen3()
    folder = tmp_path_factory.mktemp("qwen25-style")
    for item in source.iterdir():
        if item.name != "tokenizer.json":
            (folder / item.name).symlink_to(item)
    spec = json.loads((source / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        if token["id"] in QWEN3_ONLY:
            token["content"] = f"[PAD{token['id']}]"
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def args(engine: str, script: Path | None = None):
    import argparse

    return argparse.Namespace(engine=engine, script=script, model_name="policy")


def test_standalone_policy_renders_with_the_models_own_tokenizer(qwen25_style_model):
    policy = build_policy(args(str(qwen25_style_model)))
    try:
        assert policy.renderer.tokenizer is policy.engine.tokenizer
        ids = policy.renderer.render(TOOL_RUN).prompt_ids
        assert not set(ids) & set(QWEN3_ONLY)  # no [PAD] ids: <tool_response> is ordinary text here
        assert "<tool_response>\na.txt\n</tool_response>" in policy.renderer.decode(ids)
        template = policy.engine.tokenizer.apply_chat_template(
            ChatMLRenderer.template_messages(TOOL_RUN), tokenize=False, add_generation_prompt=True
        )
        assert ids == policy.engine.tokenizer.encode(template, add_special_tokens=False)
    finally:
        policy.engine.close()


def test_standalone_tiny_qwen3_keeps_the_qwen3_vocabulary():
    policy = build_policy(args("tiny-qwen3"))
    try:
        ids = policy.renderer.render(TOOL_RUN).prompt_ids
        assert {151665, 151666} <= set(ids)  # Qwen3's single-token tool tags
    finally:
        policy.engine.close()


def test_standalone_scripted_engine_shares_its_tokenizer(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["hi"]))
    policy = build_policy(args("tiny-qwen3", script))
    assert policy.renderer.tokenizer is policy.engine.tokenizer


async def test_a_policy_whose_renderer_has_another_vocabulary_is_refused(qwen25_style_model, tmp_path):
    from transformers import AutoTokenizer

    from clawgym_env.engines.scripted import ScriptedTestEngine

    model_tokenizer = AutoTokenizer.from_pretrained(str(qwen25_style_model), local_files_only=True)
    mismatched = Policy(
        engine=ScriptedTestEngine(model_tokenizer, ["x"]), renderer=ChatMLRenderer(load_qwen_tokenizer())
    )
    proxy = ServingProxy(tmp_path / "run", port=0)
    with pytest.raises(ValueError, match="tokenize differently.*make_policy"):
        proxy.open_rollout("r", mismatched)
    fitting = Policy(engine=ScriptedTestEngine(model_tokenizer, ["x"]), renderer=ChatMLRenderer(model_tokenizer))
    proxy.open_rollout("r2", fitting)


def test_standalone_proxy_process_records_the_models_own_ids(qwen25_style_model, tmp_path):
    """`python -m clawgym_env.proxy --engine <folder>`, a real process: a tool result reaches the engine as text."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [
        sys.executable,
        "-m",
        "clawgym_env.proxy",
        "--run-dir",
        str(run),
        "--port",
        "0",
        "--rollout",
        "r1",
        "--engine",
        str(qwen25_style_model),
        "--max-new-tokens",
        "4",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(proc.stdout.readline() or "null") or pytest.fail(proc.stderr.read())
        route = info["routes"][0]
        body = {
            "model": "policy",
            "messages": [
                {"role": "user", "content": "ls"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "a.txt"},
            ],
        }
        r = httpx.post(
            f"{info['origin']}{route['path_prefix']}/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {route['api_key']}"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
    finally:
        proc.kill()
        proc.wait()
    (call,) = read_calls(run / "calls.jsonl")
    assert not set(call.prompt_ids) & set(QWEN3_ONLY)
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(str(qwen25_style_model), local_files_only=True)
    assert "<tool_response>\na.txt\n</tool_response>" in own.decode(call.prompt_ids)


@pytest.mark.slow
def test_standalone_qwen25_coder_uses_its_own_vocabulary():
    """The real model (fetched at set-up time: `python -m clawgym_env.engines.fetch qwen2.5-coder-0.5b`)."""
    policy = build_policy(args("qwen2.5-coder-0.5b"))
    try:
        assert policy.renderer.tokenizer is policy.engine.tokenizer
        ids = policy.renderer.render(TOOL_RUN).prompt_ids
        assert not set(ids) & set(QWEN3_ONLY)
        assert "<tool_response>\na.txt\n</tool_response>" in policy.renderer.decode(ids)
    finally:
        policy.engine.close()


def test_main_rejects_a_missing_listener():
    with pytest.raises(SystemExit):
        main(["--run-dir", "x"])
