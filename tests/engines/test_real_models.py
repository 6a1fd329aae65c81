"""The shipped policy models, end to end on CPU (slow: run with `-m slow`)."""

import json

import pytest
import torch

from clawgym_env.engines.models import load_policy_model, smollm2_gguf
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def teacher_forced(model, prompt, generated):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0]
    return [float(torch.log_softmax(logits[len(prompt) - 1 + i].float(), -1)[t]) for i, t in enumerate(generated)]


async def test_smollm2_converted_copy_matches_gguf_and_engine_logprobs():
    from transformers import AutoModelForCausalLM

    model, tok = load_policy_model("smollm2-135m")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, return_dict=False
    )
    gguf = smollm2_gguf()
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    with torch.no_grad():
        a = model(torch.tensor([prompt])).logits
        b = direct(torch.tensor([prompt])).logits
    assert torch.allclose(a, b, atol=1e-4)
    engine = TransformersEngine(model, tok)
    gen = await engine.generate(prompt, SamplingParams(max_tokens=24, seed=0))
    assert max(abs(x - y) for x, y in zip(gen.logprobs, teacher_forced(model, prompt, gen.token_ids))) < 1e-4
    assert tok.decode(gen.token_ids, skip_special_tokens=True).strip()
    engine.close()


async def test_qwen25_coder_calls_a_tool_and_logprobs_match():
    model, tok = load_policy_model("qwen2.5-coder-0.5b")
    assert tok.eos_token == "<|im_end|>"
    # the GGUF's tokenizer agrees with the one built from qwen-tokenizer on ordinary text
    text = "def main():\n    print('héllo, 世界')  # 12345"
    assert tok.encode(text, add_special_tokens=False) == load_qwen_tokenizer().encode(text, add_special_tokens=False)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "List the files in the current directory."}],
        tools=TOOLS,
        add_generation_prompt=True,
        return_dict=False,
    )
    engine = TransformersEngine(model, tok)
    gen = await engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0))
    out = tok.decode(gen.token_ids, skip_special_tokens=True)
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    start, end = out.index("{"), out.rindex("}") + 1  # bare, fenced or tagged JSON
    call = json.loads(out[start:end])
    assert call["name"] == "bash" and "ls" in json.dumps(call["arguments"])
    ref = teacher_forced(model, prompt, gen.token_ids)
    assert max(abs(x - y) for x, y in zip(gen.logprobs, ref)) < 1e-3
    engine.close()
