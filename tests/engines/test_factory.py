"""make_engine builds each kind, and refuses bad requests clearly."""

import pytest

from clawgym_env.engines import ScriptedTestEngine, make_engine
from clawgym_env.engines.remote_engine import RemoteEngine
from clawgym_env.engines.transformers_engine import TransformersEngine
from clawgym_env.interfaces import SamplingParams


async def test_kinds(tiny_model, qwen_tok, chat_prompt):
    eng = make_engine("transformers", model=tiny_model, tokenizer=qwen_tok, max_batch_size=2)
    assert isinstance(eng, TransformersEngine) and eng.max_batch_size == 2
    assert len((await eng.generate(chat_prompt, SamplingParams(max_tokens=2))).token_ids) == 2
    eng.close()
    by_name = make_engine("transformers", model="tiny-qwen3")
    assert by_name.tokenizer.eos_token == "<|im_end|>"
    by_name.close()
    scripted = make_engine("scripted", completions=["hi"])
    assert isinstance(scripted, ScriptedTestEngine)
    remote = make_engine("remote", base_url="http://127.0.0.1:9", api="sglang")
    assert isinstance(remote, RemoteEngine) and remote.api == "sglang"
    await remote.aclose()


def test_bad_requests():
    with pytest.raises(ValueError, match="unknown engine kind 'tgi'"):
        make_engine("tgi")
    with pytest.raises(ValueError, match="needs base_url"):
        make_engine("remote")
    with pytest.raises(ValueError, match="needs completions"):
        make_engine("scripted")


async def test_vllm_server_pool_connects_to_given_urls_and_fails_calls_to_a_dead_one(tmp_path, chat_prompt):
    """Nothing listens on port 9: the call fails (counted), the server is marked lost, no call is retried there."""
    from clawgym_env.engines.vllm_server import ServerUnavailable, VLLMServerPool

    pool = make_engine("vllm_server", urls=["http://127.0.0.1:9"], checkpoint_dir=tmp_path)
    assert isinstance(pool, VLLMServerPool) and pool.policy_version == 0
    with pytest.raises(ServerUnavailable, match="127.0.0.1:9"):
        await pool.generate(chat_prompt, SamplingParams(max_tokens=2))
    with pytest.raises(ServerUnavailable, match="all 1 vLLM servers are down"):
        await pool.generate(chat_prompt, SamplingParams(max_tokens=2))
    assert pool.stats.failed_calls == 2 and pool.stats.servers_lost == 1
    await pool.aclose()
    with pytest.raises(ValueError, match="at least one server"):
        VLLMServerPool([])


def test_a_server_pool_removes_its_temporary_checkpoints_on_close(tmp_path):
    """Without a shared folder the pool writes each update's full model to a temporary one: it must not
    outlive the pool (runs left gigabytes per pool in /tmp); a folder the user gave is the user's."""
    from clawgym_env.engines.vllm_server import VLLMServerPool

    pool = VLLMServerPool(["http://127.0.0.1:9"])  # no server is contacted before the first call
    temp = pool.checkpoint_dir
    (temp / "policy-v1.safetensors").write_bytes(b"x" * 1024)
    pool.close()
    assert not temp.exists()
    given = VLLMServerPool(["http://127.0.0.1:9"], checkpoint_dir=tmp_path / "shared")
    (given.checkpoint_dir / "policy-v1.safetensors").write_bytes(b"x")
    given.close()
    assert (tmp_path / "shared" / "policy-v1.safetensors").is_file()


async def test_closing_a_server_pool_waits_for_the_checkpoint_a_broadcast_still_writes():
    """After a broadcast update the pool writes the checkpoint file in the background (for servers that come
    back later); closing the pool meanwhile failed with "Directory not empty" while removing its temporary
    folder (seen in `benchmarks.engine_bench --compare-engines`). It waits for the write, then removes it."""
    import asyncio

    from clawgym_env.engines.vllm_server import VLLMServerPool

    pool = VLLMServerPool(["http://127.0.0.1:9"])
    folder = pool.checkpoint_dir

    async def late_write() -> None:
        await asyncio.sleep(0.2)
        (folder / "policy-v1.safetensors").write_bytes(b"x" * 1024)

    async def start_writing() -> None:  # on the pool's own loop, as `_update_weights` starts it
        pool._checkpoint_written = asyncio.create_task(late_write())

    await pool._engine_loop.call(start_writing())
    await pool.aclose()
    assert pool._checkpoint_written.done() and not pool._checkpoint_written.cancelled()  # the file was written
    assert not folder.exists()  # and then removed with its folder
