"""ScriptedTestEngine (a named test double) emits scripted text as real Qwen token ids."""

import pytest

from clawgym_env.engines import ScriptedTestEngine, ScriptExhausted
from clawgym_env.interfaces import InferenceEngine, SamplingParams

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


async def test_replays_script_with_stop_token(qwen_tok):
    engine = ScriptedTestEngine(qwen_tok, [TOOL_CALL, "Done."])
    assert isinstance(engine, InferenceEngine)
    prompt = qwen_tok.apply_chat_template(
        [{"role": "user", "content": "go"}], add_generation_prompt=True, return_dict=False
    )
    first = await engine.generate(prompt, SamplingParams())
    assert first.token_ids[0] == 151657 and first.token_ids[-1] == 151645  # <tool_call> ... <|im_end|>
    assert qwen_tok.decode(first.token_ids) == TOOL_CALL + "<|im_end|>"
    assert first.logprobs == [0.0] * len(first.token_ids) and first.finish_reason == "stop"
    second = await engine.generate(prompt + first.token_ids, SamplingParams())
    assert qwen_tok.decode(second.token_ids, skip_special_tokens=True) == "Done."
    assert engine.prompts == [prompt, prompt + first.token_ids]
    assert engine.prompt_texts[0].endswith("<|im_start|>assistant\n")
    with pytest.raises(ScriptExhausted, match="only 2 scripted completions"):
        await engine.generate(prompt, SamplingParams())


async def test_function_script_and_length_limit(qwen_tok):
    engine = ScriptedTestEngine(qwen_tok, lambda prompt: "echo: " + prompt[-10:])
    out = await engine.generate(qwen_tok.encode("abcdefghijklmnop"), SamplingParams())
    assert qwen_tok.decode(out.token_ids, skip_special_tokens=True) == "echo: ghijklmnop"
    cut = await engine.generate(qwen_tok.encode("abcdefghijklmnop"), SamplingParams(max_tokens=2))
    assert len(cut.token_ids) == 2 and cut.finish_reason == "length"
    engine.update_weights({}, version=3)
    assert (await engine.generate([1], SamplingParams())).policy_version == 3
