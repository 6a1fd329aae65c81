"""OpenClaw's pre-built Node compile cache: pointed at when present, and really read inside the sandbox."""

from __future__ import annotations

from clawgym_env.interfaces import HarnessContext
from harness_adapters.openclaw import COMPILE_CACHE, OpenClawAdapter
from tests.harnesses.helpers import one_rollout, scripted_policy, write_call, write_task

FINAL = "Done: the answer is written."


class SandboxStub:
    workspace_path = "/root/.openclaw/workspace"


def ctx() -> HarnessContext:
    return HarnessContext(
        sandbox=SandboxStub(),
        task=write_task(),
        base_url="http://127.0.0.1:9/rollouts/r1",
        api_key="sk-test",
        model_name="policy",
        timeout_s=60,
    )  # type: ignore[arg-type]


def test_compile_cache_env_only_when_the_cache_is_built(tmp_path) -> None:
    assert "NODE_COMPILE_CACHE" not in OpenClawAdapter(install_root=tmp_path).plan(ctx(), "/root/h").env
    (tmp_path / COMPILE_CACHE).mkdir()
    env = OpenClawAdapter(install_root=tmp_path).plan(ctx(), "/root/h").env
    assert env["NODE_COMPILE_CACHE"] == str(tmp_path / COMPILE_CACHE)
    assert env["OPENCLAW_PACKAGED_COMPILE_CACHE_RESPAWNED"] == "1"  # no second Node start into another folder
    assert "NODE_COMPILE_CACHE" not in OpenClawAdapter(install_root=tmp_path, compile_cache=False).plan(ctx(), "/h").env


async def test_openclaw_reads_the_prebuilt_compile_cache_inside_the_sandbox() -> None:
    """Node's own debug log (stderr) says, per module, whether the read-only cache served it."""
    adapter = OpenClawAdapter(extra_env={"NODE_DEBUG_NATIVE": "COMPILE_CACHE"})
    cache = adapter.compile_cache_dir()
    assert cache is not None, "no pre-built cache: run `bash scripts/setup.sh` (step 6)"
    result = await one_rollout(adapter, scripted_policy([write_call("OpenClaw", "42"), FINAL]))
    assert result.status == "ok", result.failure
    assert result.reward == 1.0 and len(result.calls) == 2
    tail = result.harness_result.stderr_tail
    # at exit Node reports each module's entry; a cache hit is "the same", a miss would try (and fail) a write
    assert "because cache was the same" in tail
    assert "read-only file system" not in tail
