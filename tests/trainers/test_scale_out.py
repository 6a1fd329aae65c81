"""Scale-out simulated on one machine: 2 trainer ranks under torchrun (FSDP2 on gloo), 2 vLLM server processes,
local sandboxes, one full training step of the bundled loop (white-box rollouts, update, weight sync).

The servers are started by the test, as on other hosts, and the trainer connects to them
(`engine.options.urls`, the weight file on a shared `checkpoint_dir`): the test owns the processes, stops them
whatever happens, and asks them itself which policy version they hold. The fast tests check the recipe's
config composition, that a trainer rank does not hand torchrun's variables to the servers it starts, and that
`sandbox=daytona` gives the proxy the public URL and TCP port remote sandboxes need.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from clawgym_env.engines.vllm_engine import VLLM_MISSING, vllm_available

WORKER = Path(__file__).with_name("scale_out_worker.py")
REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-qwen3-h64"  # head_dim 64: a head size vLLM's CPU attention supports
SERVER = dict(dtype="float32", max_model_len=4096, kv_cache_memory_bytes=64 * 2**20)  # 64k tokens of KV each
FLOAT32_TOLERANCE = 1e-4  # a vLLM float32 log-prob against transformers' (as in tests/engines/test_vllm_server.py)

# The recipe's overrides (docs/scale_out.md), made small: one task, 4 rollouts of at most 2 calls, 2 held-out
# rollouts at the end. A random tiny model earns equal rewards, so degenerate groups are kept and an entropy bonus
# gives the update a gradient; lr 1e-3 moves the weights enough to tell the new policy from the old by log-probs.
RECIPE = [
    "steps=1",
    "threads=1",
    f"model={MODEL}",
    "engine=vllm_server",
    "sandbox=local",
    "env.tasks_per_step=1",
    "env.group_size=4",
    "env.eval_tasks=1",
    "eval.repeats=2",
    "eval.at_start=false",
    "eval.every=0",
    "env.options.max_calls=2",
    "env.options.max_new_tokens=32",
    "algorithm.drop_degenerate=false",
    "algorithm.entropy_coef=0.01",
    "optim.lr=1e-3",
    "checkpoint.every=1",
    "logging.tensorboard=false",
    "logging.plot_every=0",
    "logging.progress=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_worker():
    spec = importlib.util.spec_from_file_location("scale_out_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


def test_the_recipe_composes() -> None:
    from trainers.main import compose

    cfg = compose([*RECIPE, "run_dir=/tmp/x", "engine.options.urls=[http://10.0.0.2:8000,http://10.0.0.3:8000]"])
    assert cfg.engine.kind == "vllm_server" and cfg.model.name == MODEL and cfg.sandbox.backend == "local"
    assert cfg.engine.options["urls"] == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    cfg = compose(["engine=vllm_server", "engine.options.servers=3", "engine.options.checkpoint_dir=/shared/w"])
    assert cfg.engine.options["servers"] == 3 and cfg.engine.options["checkpoint_dir"] == "/shared/w"


def test_servers_started_by_a_trainer_rank_do_not_inherit_torchrun_variables(monkeypatch) -> None:
    from clawgym_env.engines.vllm_server import VLLMServer

    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    for key, value in {**torchrun, "TORCHELASTIC_RUN_ID": "x", "SOMETHING_ELSE": "kept"}.items():
        monkeypatch.setenv(key, value)
    server = VLLMServer(MODEL, port=free_port(), **SERVER)  # not started: the command and environment only
    assert not set(torchrun) & set(server.env) and "TORCHELASTIC_RUN_ID" not in server.env
    assert server.env["SOMETHING_ELSE"] == "kept" and server.env["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.fixture
def two_servers(tmp_path):
    """Two vLLM servers of the model, started in parallel; always stopped (their process groups) afterwards."""
    from clawgym_env.engines.vllm_server import VLLMServer

    servers = [VLLMServer(MODEL, log_path=tmp_path / f"vllm-{i}.log", **SERVER) for i in range(2)]
    try:
        for server in servers:
            server.start()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.wait_ready(900), servers))
        yield servers
    finally:
        for server in servers:
            server.stop()
        assert not any(s.alive() for s in servers)


def server_version(url: str) -> int:
    response = httpx.post(
        f"{url}/collective_rpc", json={"method": "clawgym_get_policy_version", "args": []}, timeout=30
    )
    response.raise_for_status()
    return min(int(v) for v in response.json()["results"])


def teacher_forced(model, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0]
    logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)], -1)  # temperature 1
    return [float(logp[i, t]) for i, t in enumerate(ids)]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason=VLLM_MISSING)
@pytest.mark.timeout(1500)
def test_two_ranks_two_servers_one_full_step(tmp_path, two_servers) -> None:
    from clawgym_env.engines.models import load_policy_model
    from clawgym_env.records import read_calls

    urls = [s.url for s in two_servers]
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    assert [server_version(u) for u in urls] == [0, 0]
    overrides = [
        *RECIPE,
        f"run_dir={run_dir}",
        f"engine.options.urls=[{','.join(urls)}]",
        f"engine.options.checkpoint_dir={tmp_path / 'shared-weights'}",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = str(REPO)
    started = time.perf_counter()
    for _attempt in range(2):  # a second try only if the rendezvous port was taken meanwhile
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        cmd += ["--master_port", str(free_port()), str(WORKER), str(out), *overrides]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            break
    print(f"torchrun: {time.perf_counter() - started:.0f} s, load {os.getloadavg()}")
    assert proc.returncode == 0, proc.stderr[-4000:]

    # the step finished on both ranks, which hold the same (sharded, then gathered) weights
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["world"], r["step"], r["sharded"]) for r in ranks] == [(0, 2, 1, True), (1, 2, 1, True)]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]
    checkpoint = torch.load(run_dir / "checkpoints" / "step_000001.pt", map_location="cpu", weights_only=False)
    assert checkpoint["step"] == 1
    worker = load_worker()
    model, _ = load_policy_model(MODEL)
    names = {name for name, _ in model.named_parameters()}
    assert (
        worker.params_digest({k: v for k, v in checkpoint["model"].items() if k in names}) == ranks[0]["params_sha256"]
    )

    # both servers hold the new policy; the rollouts were spread over both; nothing failed
    assert [server_version(u) for u in urls] == [1, 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    pool = summary["engine"]
    assert pool["policy_version"] == 1 and pool["weight_updates"] == 1
    assert pool["failed_calls"] == 0 and pool["servers_lost"] == 0
    assert [s["url"] for s in pool["servers"]] == urls and all(s["served"] >= 1 for s in pool["servers"])
    assert sum(s["served"] for s in pool["servers"]) == pool["calls"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if m.get("kind", "train") == "train" and m.get("step") == 1)
    assert step["update_skipped"] == 0 and step["trained_tokens"] > 0

    # the 4 training rollouts ran on version 0; the 2 held-out rollouts after the update on version 1 (every call
    # checked on its server), with the log-probs of the trained weights, not the initial ones
    calls = list(read_calls(run_dir / "rollouts" / "calls.jsonl"))
    versions: dict[str, set[int]] = {}
    for call in calls:
        versions.setdefault(call.rollout_id, set()).add(call.policy_version)
    assert sorted(sorted(v) for v in versions.values()) == [[0]] * 4 + [[1]] * 2
    assert len(calls) == pool["calls"]
    initial = model
    trained, _ = load_policy_model(MODEL)
    trained.load_state_dict(checkpoint["model"], strict=False)
    after = [c for c in calls if c.policy_version == 1 and c.generated_ids]
    assert after
    moved = 0.0
    for call in after:
        served = call.logprobs
        want = teacher_forced(trained, call.prompt_ids, call.generated_ids)
        assert max(abs(a - b) for a, b in zip(served, want)) < FLOAT32_TOLERANCE
        before = teacher_forced(initial, call.prompt_ids, call.generated_ids)
        moved = max(moved, *(abs(a - b) for a, b in zip(served, before)))
    assert moved > 100 * FLOAT32_TOLERANCE  # the update changed the policy visibly: the servers serve the new one


def test_daytona_recipe_gives_the_proxy_a_public_url_and_a_tcp_port(tmp_path) -> None:
    """Daytona sandboxes reach the proxy only at a public URL (the backend refuses a proxy without one): the
    training config's sandbox.proxy_public_url reaches the runtime's proxy, which then also listens on TCP."""
    from clawgym_env.runtime import Runtime
    from trainers.main import compose

    cfg = compose(["sandbox=daytona", "sandbox.proxy_public_url=https://tunnel.example/"])
    assert cfg.sandbox.backend == "daytona" and cfg.sandbox.proxy_port is None
    runtime = Runtime(tmp_path, proxy_port=cfg.sandbox.proxy_port, proxy_public_url=cfg.sandbox.proxy_public_url)
    try:
        endpoint = runtime.run(runtime.proxy()).endpoint
        assert endpoint.public_url == "https://tunnel.example/" and endpoint.port
        with socket.create_connection((endpoint.host, endpoint.port), timeout=5):  # really listening
            pass
    finally:
        runtime.close()
    local = compose(["sandbox=local"])  # local sandboxes: the Unix socket only, as before
    assert local.sandbox.proxy_port is None and local.sandbox.proxy_public_url is None
