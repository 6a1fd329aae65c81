"""`serving_stack`: the proxy and a sandbox backend on one run dir, started together and stopped together."""

from __future__ import annotations

import httpx

from clawgym_env.serving_stack import serving_stack


async def test_a_temporary_stack_hides_its_run_dir_and_leaves_nothing(tmp_path):
    async with serving_stack(port=0, backend_options={"root": tmp_path / "sandboxes"}) as stack:
        run_dir, socket = stack.run_dir, stack.proxy.endpoint.unix_socket
        assert run_dir.is_dir() and socket.exists()
        assert run_dir.absolute() in stack.backend.hidden_paths  # sandboxes never see the recorded calls
        async with httpx.AsyncClient(base_url=stack.proxy.origin) as client:
            assert (await client.get("/health")).json()["status"] == "ok"
    assert not run_dir.exists() and not socket.exists()


async def test_a_given_run_dir_is_kept_with_its_call_log(tmp_path):
    async with serving_stack(tmp_path / "run", engine_timeout_s=0.5, keep_closed=4) as stack:
        assert stack.proxy.pipeline.engine_timeout_s == 0.5 and stack.proxy.keep_closed == 4
    assert (tmp_path / "run" / "calls.jsonl").exists()
