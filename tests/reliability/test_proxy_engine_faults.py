"""Proxy and engine faults: an engine that fails or stalls mid-generation, a harness that hangs up
mid-stream, and a proxy process killed and restarted during a run.

What must hold: no completed call is lost (read back from calls.jsonl), the affected rollouts are
marked (failed, with the proxy's error kind), and later rollouts on the same engine / proxy succeed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.interfaces import Policy
from clawgym_env.records import read_calls
from clawgym_env.rollout import run_rollout
from clawgym_env.serving_stack import serving_stack
from clawgym_env.specs import EnvOptions
from tests.reliability import doubles

REPO = Path(__file__).resolve().parents[2]


def _logged(run_dir: Path) -> dict[tuple[str, int], object]:
    return {(c.rollout_id, c.call_index): c for c in read_calls(run_dir / "calls.jsonl")}


def test_engine_error_and_stream_disconnect_mid_batch(make_env, tmp_path):
    """One batch: two healthy rollouts, one whose engine call raises, one whose harness hangs up on a
    streamed call the engine is still working on. Then a second batch on the same engine succeeds."""
    env = make_env()
    engine = doubles.FaultyEngineTestDouble(fail_on="POISON", stall_on="STALL")
    policy = Policy(engine=engine, renderer=ChatMLRenderer(doubles.tokenizer()), name="policy")
    tasks = [
        doubles.fault_task("ok", 0),
        doubles.fault_task("ok", 1, marker=" POISON"),
        doubles.fault_task("stream_hang", 2, timeout_s=3, marker=" STALL"),
        doubles.fault_task("ok", 3),
    ]

    async def batch(ts):
        from clawgym_env.vector_env import ClawGymVectorEnv

        return await ClawGymVectorEnv(env, num_envs=len(ts)).arollouts(policy, ts)

    ok0, poisoned, hung_up, ok3 = env.runtime.run(batch(tasks))
    assert (ok0.status, ok0.reward, ok3.status, ok3.reward) == ("ok", 1.0, "ok", 1.0)
    # engine error: the call is answered with a 400 the harness cannot retry, recorded with its error
    assert poisoned.status == "failed" and poisoned.failure.stage == "harness"
    assert [c.error.split(":")[0] for c in poisoned.calls] == ["engine_error"]
    assert "engine worker died mid-generation" in poisoned.failure.reason
    assert engine.failed == 1
    # disconnect: the sandbox killed the hung harness; the proxy freed the engine and recorded the call
    assert hung_up.status == "failed" and hung_up.failure.stage == "timeout"
    assert engine.stalled == 1 and engine.cancelled == 1

    async def stats(rid):
        return (await env.runtime.proxy()).stats(rid)

    assert env.runtime.run(stats(poisoned.rollout_id)).error_kinds == {"engine_error": 1}
    hung_stats = env.runtime.run(stats(hung_up.rollout_id))
    assert hung_stats.disconnects == 1 and hung_stats.error_kinds == {"client_disconnected": 1}
    assert {s: sum(c.values()) for s, c in env.runtime.failures.as_dict().items()} == {"harness": 1, "timeout": 1}

    # later rollouts on the same engine and proxy succeed
    later = env.runtime.run(batch([doubles.fault_task("ok", 4), doubles.fault_task("ok", 5)]))
    assert [(r.status, r.reward) for r in later] == [("ok", 1.0), ("ok", 1.0)]

    # the durable log holds every call: 4 healthy rollouts x 2 completed calls, plus the two failed ones
    logged = _logged(env.run_dir)
    for r in (ok0, ok3, *later, poisoned):
        for call in r.calls:
            assert logged[(r.rollout_id, call.call_index)].generated_ids == call.generated_ids
    errors = sorted((c.error or "ok").split(":")[0] for c in logged.values())
    assert errors == ["client_disconnected", "engine_error"] + ["ok"] * 8
    (disconnected,) = [c for c in logged.values() if c.rollout_id == hung_up.rollout_id]
    # the engine double has no abort(), so it was cancelled: no partial ids to keep (TransformersEngine keeps them)
    assert disconnected.streamed and disconnected.generated_ids == [] and disconnected.prompt_ids


async def test_engine_timeout_marks_the_rollout_and_the_next_one_succeeds(tmp_path, sandbox_root):
    """Engine timeout (the proxy's `engine_timeout_s`) through a real rollout, composed by run_rollout."""
    engine = doubles.FaultyEngineTestDouble(stall_on="STALL")
    policy = Policy(engine=engine, renderer=ChatMLRenderer(doubles.tokenizer()), name="policy")
    run_dir = tmp_path / "run"
    adapter = doubles.FaultyHarnessTestDouble()
    async with serving_stack(run_dir, engine_timeout_s=0.5, backend_options={"root": sandbox_root}) as stack:
        proxy, results = stack.proxy, []
        for i, marker in enumerate([" STALL", "", ""]):
            results.append(
                await run_rollout(
                    task=doubles.fault_task("ok", i, marker=marker),
                    adapter=adapter,
                    policy=policy,
                    backend=stack.backend,
                    proxy=proxy,
                    options=EnvOptions(),
                )
            )
        stalled, *later = results
        assert stalled.status == "failed" and stalled.failure.stage == "harness"
        assert "did not answer within 0.5 s" in stalled.failure.reason  # the proxy's message, surfaced by the harness
        assert proxy.stats(stalled.rollout_id).error_kinds == {"engine_timeout": 1}
        assert engine.stalled == 1 and engine.cancelled == 1  # the engine's slot was freed
        assert [(r.status, r.reward) for r in later] == [("ok", 1.0), ("ok", 1.0)]
    errors = [(c.error or "ok").split(":")[0] for c in read_calls(run_dir / "calls.jsonl")]
    assert errors == ["engine_timeout", "ok", "ok", "ok", "ok"]


# ------------------------------------------------------------------------------- proxy restart
def _start_proxy(run_dir: Path, script: Path, rollouts: list[str]) -> tuple[subprocess.Popen, dict]:
    argv = [
        sys.executable,
        "-m",
        "clawgym_env.proxy",
        "--run-dir",
        str(run_dir),
        "--port",
        "0",
        "--script",
        str(script),
    ]
    for r in rollouts:
        argv += ["--rollout", r]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    info = json.loads(proc.stdout.readline())
    return proc, info


async def _conversation(base: str, key: str, turns: int, answers: list[str], pause_s: float = 0.0) -> None:
    """An append-only chat, like a harness's: each answer goes back into the next request."""
    messages = [{"role": "user", "content": "start"}]
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=20) as client:
        for turn in range(turns):
            reply = await client.chat.completions.create(model="policy", messages=messages)
            text = reply.choices[0].message.content
            answers.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {turn}"}]
            await asyncio.sleep(pause_s)


async def test_proxy_killed_and_restarted_mid_run_loses_no_completed_call(tmp_path):
    run_dir = tmp_path / "run"
    script = tmp_path / "script.json"
    script.write_text(json.dumps([f"answer {i}" for i in range(50)]))
    proc, info = _start_proxy(run_dir, script, ["r1", "r2", "r3"])
    restarted = None
    try:
        routes = {r["rollout_id"]: r for r in info["routes"]}
        base = {rid: info["origin"] + r["path_prefix"] for rid, r in routes.items()}
        answers: dict[str, list[str]] = {rid: [] for rid in routes}
        # r1 and r2 finish before the kill; r3 is mid-conversation when the proxy dies
        await _conversation(base["r1"], routes["r1"]["api_key"], 3, answers["r1"])
        await _conversation(base["r2"], routes["r2"]["api_key"], 3, answers["r2"])
        r3 = asyncio.create_task(_conversation(base["r3"], routes["r3"]["api_key"], 20, answers["r3"], pause_s=0.05))
        while len(answers["r3"]) < 2:
            await asyncio.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        try:
            await r3
            raise AssertionError("r3 went on after its proxy died")
        except (openai.APIConnectionError, openai.APITimeoutError):
            pass  # the affected rollout sees its proxy vanish: it is marked failed by its harness

        # a restarted proxy on the same run dir appends to the same log; later rollouts succeed
        restarted, info2 = _start_proxy(run_dir, script, ["r4", "r5"])
        routes2 = {r["rollout_id"]: r for r in info2["routes"]}
        for rid in ("r4", "r5"):
            answers[rid] = []
            await _conversation(info2["origin"] + routes2[rid]["path_prefix"], routes2[rid]["api_key"], 2, answers[rid])
        # the dead rollout's old route and key get nothing from the new proxy, and nothing is recorded for them
        async with httpx.AsyncClient(base_url=info2["origin"]) as client:
            r = await client.post(
                routes["r3"]["path_prefix"] + "/v1/chat/completions",
                json={"model": "p", "messages": []},
                headers={"authorization": f"Bearer {routes['r3']['api_key']}"},
            )
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    finally:
        for p in (proc, restarted):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    calls = list(read_calls(run_dir / "calls.jsonl"))
    completed = [c for c in calls if c.error is None]
    by_rollout = {rid: [c for c in completed if c.rollout_id == rid] for rid in answers}
    # every answer a client received is a recorded call, in call order; nothing was lost or invented
    for rid, got in answers.items():
        assert len(by_rollout[rid]) >= len(got), f"{rid}: a completed call was lost"
        assert [c.call_index for c in by_rollout[rid][: len(got)]] == list(range(len(got)))
    assert [len(answers[r]) for r in ("r1", "r2", "r4", "r5")] == [3, 3, 2, 2]
    assert len(completed) == sum(len(a) for a in answers.values()) + (len(by_rollout["r3"]) - len(answers["r3"]))
    assert len(by_rollout["r3"]) - len(answers["r3"]) <= 1  # at most the call in flight at the kill
    assert time.time() - calls[0].timings.received_at < 120
