import pytest
import torch

# The CI machine's 2 cores are shared by several jobs; one intra-op thread avoids OpenMP barrier stalls
# (engines adopt the creating thread's count).
torch.set_num_threads(1)

from clawgym_env.engines.tokenizer import load_qwen_tokenizer  # noqa: E402 (after the thread count is set)


@pytest.fixture(scope="session")
def qwen_tok():
    return load_qwen_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(qwen_tok):
    from clawgym_env.engines.models import load_policy_model

    model, _ = load_policy_model("tiny-qwen3")
    return model


@pytest.fixture
def chat_prompt(qwen_tok):
    return qwen_tok.apply_chat_template(
        [{"role": "user", "content": "List the files in the workspace."}], add_generation_prompt=True, return_dict=False
    )
