import pytest

from clawgym_env.engines.tokenizer import load_qwen_tokenizer


@pytest.fixture(scope="session")
def qwen_tok():
    return load_qwen_tokenizer()
