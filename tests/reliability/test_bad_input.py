"""Bad input: fuzzed API requests against a long-running proxy process, fuzzed task folders, bad configs.

Each gets a clear error in its own format; nothing crashes; nothing is written where it should not be.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from clawgym_env.interfaces import RolloutLimits
from clawgym_env.proxy.server import RECORDED_REFUSALS_PAST_CAP
from clawgym_env.records import read_calls

REPO = Path(__file__).resolve().parents[2]
FUZZ_EXAMPLES = 150


@pytest.fixture(scope="module")
def live_proxy(tmp_path_factory):
    """`python -m clawgym_env.proxy` as its own long-running process on loopback, one open route."""
    run_dir = tmp_path_factory.mktemp("fuzz") / "run"
    script = run_dir.parent / "script.json"
    script.write_text(json.dumps(["fine", '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>']))
    argv = [
        sys.executable,
        "-m",
        "clawgym_env.proxy",
        "--run-dir",
        str(run_dir),
        "--port",
        "0",
        "--rollout",
        "fuzz",
        "--script",
        str(script),
        "--max-new-tokens",
        "8",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    info = json.loads(proc.stdout.readline())
    yield proc, info, run_dir
    proc.kill()
    proc.wait()


def _is_api_error(path: str, body: object) -> bool:
    """Anthropic's `{"type":"error","error":{type,message}}` or OpenAI's `{"error":{message,type,code}}`."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    error = body["error"]
    if not isinstance(error.get("message"), str) or not error["message"]:
        return False
    if path.endswith("/v1/messages") or path.endswith("/count_tokens"):
        return body.get("type") == "error" and isinstance(error.get("type"), str)
    return "type" in error and "code" in error


def test_fuzzed_requests_get_clear_4xx_and_the_proxy_survives(live_proxy):
    proc, info, run_dir = live_proxy
    origin, (route,) = info["origin"], info["routes"]
    schema = schemathesis.openapi.from_url(origin + "/openapi.json")
    outcomes: list[tuple[str, str, int, str]] = []  # (method path, target, status, rollout used)

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(), target=st.sampled_from(["route", "route", "route", "wrong_key", "fuzzed_id"]))
    def fuzz(case, target):
        if "rollout_id" in (case.path_parameters or {}) and target != "fuzzed_id":
            case.path_parameters["rollout_id"] = route["rollout_id"]
        key = route["api_key"] if target != "wrong_key" else "sk-not-this-one"
        case.headers = {**(case.headers or {}), "x-api-key": key}
        response = case.call(base_url=origin, timeout=30)
        path = case.formatted_path
        outcomes.append((f"{case.method} {case.operation.path}", target, response.status_code, path))
        assert response.status_code < 500, (path, response.status_code, response.text[:500])
        if response.status_code >= 400 and case.method != "HEAD":
            assert _is_api_error(path, response.json()), (path, response.text[:500])
        if target == "wrong_key" and "rollout_id" in (case.path_parameters or {}) and case.method == "POST":
            assert response.status_code == 401

    fuzz()
    assert proc.poll() is None, "the proxy process died under fuzzing"
    statuses = {s for _, _, s, _ in outcomes}
    assert 400 in statuses and 401 in statuses and statuses <= {200, 400, 401, 404, 405, 410, 422}, statuses
    generation_ops = {op for op, *_ in outcomes if op.startswith("POST") and "count_tokens" not in op}
    assert len(generation_ops) == 3  # messages, chat completions and responses were all fuzzed

    # the long-running proxy still serves a well-formed call
    with httpx.Client(base_url=origin + route["path_prefix"], headers={"x-api-key": route["api_key"]}) as client:
        ok = client.post("/v1/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code in (200, 400) and client.get("/v1/models").status_code == 200
        assert httpx.get(origin + "/health").status_code == 200

    # records: only the open route's generation calls, never a refused key or an unknown rollout; a
    # rejected request is recorded as an error with no generated tokens (nothing a trainer would use)
    calls = list(read_calls(run_dir / "calls.jsonl"))
    assert {c.rollout_id for c in calls} <= {route["rollout_id"]}
    routed = [o for o in outcomes if o[1] == "route" and o[0].startswith("POST") and "count_tokens" not in o[0]]
    answered = [o for o in routed if o[2] in (200, 400)]
    # + the well-formed call above; past the cap (48) only the first few refusals are logged, the rest counted
    assert len(calls) == min(len(answered) + 1, RolloutLimits().max_calls + RECORDED_REFUSALS_PAST_CAP)
    for call in calls:
        assert (call.error is None) == bool(call.generated_ids), call.error
        if call.error:
            assert call.error.split(":")[0] in {"invalid_request", "call_cap", "token_cap", "context_length"}, (
                call.error
            )


# ---------------------------------------------------------------------------------- task folders
ENTRY = {"task_id": "good", "user_query": "Write hi.txt", "input_mount_dir": "/root/.openclaw/workspace"}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(
    entries=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                max_leaves=6,
            ).map(lambda v: json.dumps(v).encode()),
            st.fixed_dictionaries(
                {
                    "task_id": st.text(max_size=5),
                    "user_query": st.text(max_size=5),
                    "input_mount_dir": st.text(max_size=6),
                }
            ).map(lambda v: json.dumps(v).encode()),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_fuzzed_task_folders_are_reported_one_by_one(tmp_path_factory, entries):
    from task_suites.importers import load_clawgym_folder

    root = tmp_path_factory.mktemp("tasks")
    good = root / "a_good"
    (good / "reward").mkdir(parents=True)
    (good / "data_entry.json").write_text(json.dumps(ENTRY))
    (good / "reward" / "reward.sh").write_text("echo 1\n")
    for i, raw in enumerate(entries):
        folder = root / f"b_fuzz_{i}"
        (folder / "reward").mkdir(parents=True)
        (folder / "data_entry.json").write_bytes(raw)
        (folder / "reward" / "reward.sh").write_text("echo 1\n")
    before = _snapshot(root)
    suite = load_clawgym_folder(root)  # never raises while one task loads
    assert _snapshot(root) == before, "the importer wrote into the task folders"
    loaded = {Path(t.metadata["source"]).name for t in suite.tasks}
    broken = {p.path.name: p.reason for p in suite.problems}
    assert "a_good" in loaded and loaded | set(broken) == {"a_good", *(f"b_fuzz_{i}" for i in range(len(entries)))}
    assert not loaded & set(broken)
    for name, reason in broken.items():
        assert reason and ("data_entry.json" in reason or "already used" in reason), (name, reason)
    assert suite.report().count("BROKEN") == len(broken)


# ---------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    "overrides,named",
    [
        (["env.group_size=0"], "env.group_size"),
        (["optim.lr=fast"], "optim.lr"),
        (["+env.grupo_size=4"], "grupo_size"),
        (["algorithm.eps_low=-1"], "eps_low"),
        (["algorithm.correction.mode=sometimes"], "mode"),
        (["+algorithm.no_such=1"], "no_such"),
        (["checkpoint.every=-2"], "checkpoint.every"),
        (["model.dtype=int3"], "model.dtype"),
        (["engine.kind=tpu"], "engine.kind"),
    ],
)
def test_malformed_training_config_names_the_field(overrides, named):
    from trainers.main import compose

    with pytest.raises((ValidationError, ValueError)) as info:
        compose(overrides)
    assert named.split(".")[-1] in str(info.value), str(info.value)


def test_malformed_training_config_from_the_command_line_exits_with_the_field(tmp_path):
    """The real entry point, as a user runs it: a clear message naming the field; nothing of a run is written
    (Hydra itself notes the composed config under <run_dir>/.hydra before the job starts, and that is all)."""
    run_dir = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.main", f"run_dir={run_dir}", "env.tasks_per_step=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "tasks_per_step" in proc.stderr and "greater than or equal to 1" in proc.stderr
    written = {p.relative_to(run_dir).parts[0] for p in run_dir.rglob("*")} if run_dir.exists() else set()
    assert written <= {".hydra", "main.log"}, f"a rejected config still wrote {written}"


@pytest.mark.parametrize(
    "override,named",
    [
        ({"max_calls": 0}, "max_calls"),
        ({"temperature": -1}, "temperature"),
        ({"no_such_option": 1}, "no_such_option"),
        ({"forest": {"max_leaves": 0}}, "max_leaves"),
        ({"rollout_timeout_s": "soon"}, "rollout_timeout_s"),
    ],
)
def test_malformed_env_options_name_the_field(override, named):
    import clawgym_env

    with pytest.raises(ValidationError) as info:
        clawgym_env.make("ReliabilitySuite-WhiteBox", **override)
    assert named in str(info.value)
