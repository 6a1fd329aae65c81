"""Attacks on a `ShardedProxy` from inside a real sandbox bound to one shard: the engine hub's socket and the
other shards are out of reach, and the shard it can reach serves no other rollout's route."""

from __future__ import annotations

import json
import textwrap

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines.scripted import ScriptedTestEngine
from clawgym_env.engines.tokenizer import load_qwen_tokenizer
from clawgym_env.interfaces import Policy
from clawgym_env.proxy import ShardedProxy
from clawgym_env.specs import TaskSpec

PROBE = textwrap.dedent(
    """
    import json, socket, sys, urllib.request, urllib.error
    targets, mine, other = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    reached = {}
    for name, path in targets.items():  # the hub and the other shard, at their host paths
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            reached[name] = True
        except OSError as exc:
            reached[name] = type(exc).__name__
    def post(route, key):
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "x"}]}).encode()
        request = urllib.request.Request(
            sys.argv[4] + route + "/v1/chat/completions", data=body,
            headers={"content-type": "application/json", "authorization": "Bearer " + key})
        try:
            return urllib.request.urlopen(request, timeout=20).status
        except urllib.error.HTTPError as exc:
            return exc.code
    reached["own_route"] = post(mine["path_prefix"], mine["api_key"])
    reached["other_route_with_its_key"] = post(other["path_prefix"], other["api_key"])
    print(json.dumps(reached))
    """
)


async def test_a_sandbox_reaches_only_its_own_shard_and_never_the_engine_hub(tmp_path, backend):
    tokenizer = load_qwen_tokenizer()
    policy = Policy(engine=ScriptedTestEngine(tokenizer, ["ok"] * 4), renderer=ChatMLRenderer(tokenizer))
    async with ShardedProxy(tmp_path / "run", shards=2) as proxy:
        endpoint = proxy.endpoint_for("attacker")
        proxy.endpoint_for("victim")
        attacker, victim = (proxy.open_rollout(r, policy) for r in ("attacker", "victim"))
        other_shard = proxy.endpoint_for("victim")
        assert other_shard.unix_socket != endpoint.unix_socket
        targets = {"hub": str(proxy._hub.path), "other_shard": str(other_shard.unix_socket)}
        task = TaskSpec(id="probe", instruction="-", workspace={"probe.py": PROBE}, verifier=lambda d: 0.0)
        async with await backend.create(task, proxy=endpoint) as box:
            routes = [json.dumps(r.model_dump()) for r in (attacker, victim)]
            result = await box.exec(
                ["python3", "probe.py", json.dumps(targets), *routes, box.proxy_base_url],
                cwd=box.workspace_path,
                timeout_s=60,
            )
        assert result.exit_code == 0, result.stderr
        reached = json.loads(result.stdout)
        assert reached["hub"] is not True and reached["other_shard"] is not True, reached
        assert reached["own_route"] == 200
        assert reached["other_route_with_its_key"] == 401  # the victim's route and key: unknown on this shard
        assert [c.error for c in proxy.close_rollout("attacker")] == [None]
        assert proxy.close_rollout("victim") == []
