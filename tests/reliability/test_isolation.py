"""Isolation: from inside a real sandbox, during a live rollout, try to reach another live rollout's
route, records and workspace. Every attempt fails, and the host side shows nothing was touched."""

from __future__ import annotations

import asyncio

from clawgym_env.records import read_calls
from clawgym_env.rollout import run_rollout
from clawgym_env.serving_stack import serving_stack
from clawgym_env.specs import EnvOptions
from tests.reliability import doubles


async def test_a_rollout_cannot_reach_another_rollouts_route_records_or_workspace(tmp_path, sandbox_root):
    run_dir = tmp_path / "run"
    policy = doubles.scripted_policy()
    adapter = doubles.FaultyHarnessTestDouble()
    async with serving_stack(run_dir, backend_options={"root": sandbox_root}) as stack:
        proxy, backend = stack.proxy, stack.backend
        # the victim: a live rollout (one call made, then it waits) with a secret in its workspace
        victim_task = doubles.fault_task("hang", 0, timeout_s=6, workspace={"notes.md": "victim secret 7731\n"})
        victim = asyncio.create_task(
            run_rollout(
                task=victim_task,
                adapter=adapter,
                policy=policy,
                backend=backend,
                proxy=proxy,
                options=EnvOptions(),
                rollout_id="victim",
            )
        )
        for _ in range(400):  # until the victim's harness has made its call and waits
            try:
                if proxy.stats("victim").completed_calls:
                    break
            except KeyError:
                pass
            await asyncio.sleep(0.02)
        (victim_dir,) = [p for p in sandbox_root.iterdir()]
        victim_ws = victim_dir / "workspace"
        victim_url = "http://127.0.0.1:8080/rollouts/victim"
        probe = {
            "read": [str(run_dir / "calls.jsonl"), str(victim_ws / "notes.md"), "/proc/1/environ"],
            "write": [str(victim_ws / "notes.md"), str(run_dir / "calls.jsonl")],
            "list": [str(sandbox_root), str(run_dir), "/proc"],
            "routes": {
                "victim route, own key": [victim_url, "OWN"],
                "victim route, no key": [victim_url, ""],
                "victim route, guessed key": [victim_url, "sk-clawgym-" + "A" * 32],
            },
        }
        # the prober's own key stands in for "OWN" (it knows only its own key)
        attacker_task = doubles.fault_task("probe", 1, probe=probe)
        attacker = await run_rollout(
            task=attacker_task,
            adapter=_OwnKeyProbe(),
            policy=policy,
            backend=backend,
            proxy=proxy,
            options=EnvOptions(),
            rollout_id="attacker",
        )
        # checked while the victim is still alive
        assert not victim.done()
        assert (victim_ws / "notes.md").read_text() == "victim secret 7731\n"
        assert sorted(p.name for p in victim_ws.iterdir()) == ["notes.md"]
        victim_result = await victim

    (event,) = [e for e in attacker.harness_result.events if e.get("type") == "probe"]
    results = event["results"]
    assert results["victim route, own key"] == "refused: 401 invalid_api_key"
    assert results["victim route, no key"] == "refused: 401 invalid_api_key"
    assert results["victim route, guessed key"] == "refused: 401 invalid_api_key"
    for path in (str(run_dir / "calls.jsonl"), str(victim_ws / "notes.md")):
        assert results[path].startswith("refused"), (path, results[path])  # hidden: not there to read or write
    for folder in (str(sandbox_root), str(run_dir)):  # an empty tmpfs on top, or not there at all (/tmp is private)
        assert results[folder] == "listed: " or results[folder].startswith("refused"), (folder, results[folder])
    assert "victim secret" not in str(results) and "sk-clawgym-" not in attacker.harness_result.stdout_tail
    # its own PID namespace: only the prober's own processes are visible
    own_pids = [p for p in results["/proc"].removeprefix("listed: ").split(",") if p.isdigit()]
    assert len(own_pids) <= 4, own_pids

    # the attacker still did its own task; the victim's records hold only the victim's call
    assert attacker.status == "ok" and attacker.reward == 1.0
    assert victim_result.status == "failed" and victim_result.failure.stage == "timeout"
    assert [c.rollout_id for c in victim_result.calls] == ["victim"]
    logged = list(read_calls(run_dir / "calls.jsonl"))
    assert sorted(c.rollout_id for c in logged) == ["attacker", "attacker", "victim"]
    assert all("intruder" not in str(c.request) for c in logged)


class _OwnKeyProbe(doubles.FaultyHarnessTestDouble):
    """The faulty harness double in probe mode, told to use its own key where the probe says "OWN"."""

    async def run(self, ctx):
        probe = ctx.task.metadata["probe"]
        routes = {name: [url, ctx.api_key if key == "OWN" else key] for name, (url, key) in probe["routes"].items()}
        ctx.task = ctx.task.model_copy(update={"metadata": {**ctx.task.metadata, "probe": {**probe, "routes": routes}}})
        return await super().run(ctx)
