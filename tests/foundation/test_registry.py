"""The registry and specs: make/register, clear errors for unknown ids and malformed specs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import clawgym_env
from clawgym_env import EnvSpec, HarnessSpec, TaskSpec, TaskSuite
from clawgym_env.registry import Registry, UnknownEnvironmentError
from clawgym_env.specs import ApiStyle


def _task(task_id: str = "t0", **kw) -> TaskSpec:
    return TaskSpec(
        id=task_id, instruction="write hi to a.txt", workspace={"in.txt": "x"}, verifier=lambda p: 1.0, **kw
    )


def test_builtin_pairs_registered_at_import():
    ids = clawgym_env.registry.list()
    for suite in ("OfficeQA", "JobBench", "ClawGymBench", "PinchBench", "OfficeQAEasy", "JobBenchEasy"):
        for harness in ("ClaudeCode", "OpenClaw", "Codex", "Pi", "WhiteBox"):
            assert f"{suite}-{harness}" in ids
    env = clawgym_env.make("OfficeQA-ClaudeCode")
    assert env.harness.api_style is ApiStyle.ANTHROPIC_MESSAGES
    assert "OfficeQA-ClaudeCode" in repr(env)


def test_unknown_id_lists_close_matches():
    with pytest.raises(UnknownEnvironmentError) as err:
        clawgym_env.make("OfficeQA-ClaudCode")
    message = str(err.value)
    assert "OfficeQA-ClaudeCode" in message and "Did you mean" in message


def test_unknown_id_without_close_match_says_how_to_list():
    with pytest.raises(UnknownEnvironmentError, match="clawgym list"):
        clawgym_env.make("zzzz")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(id="", instruction="x", verifier=lambda p: 1.0), "id"),
        (dict(id="a", instruction="", verifier=lambda p: 1.0), "instruction"),
        (dict(id="a", instruction="x", verifier=lambda p: 1.0, mount_path="relative/ws"), "mount_path"),
        (dict(id="a", instruction="x", verifier=lambda p: 1.0, timeout_s=-1), "timeout_s"),
        (dict(id="a", instruction="x", verifier=lambda p: 1.0, workspace={"../evil": "x"}), "workspace"),
        (dict(id="a", instruction="x", verifier=lambda p: 1.0, workspace={"/etc/passwd": "x"}), "workspace"),
        (dict(id="a", instruction="x", verifier=42), "verifier"),
    ],
)
def test_malformed_task_spec_names_the_field(kwargs, field):
    with pytest.raises((ValidationError, TypeError)) as err:
        TaskSpec(**kwargs)
    assert field in str(err.value)


def test_bad_override_names_the_option():
    with pytest.raises(ValidationError) as err:
        clawgym_env.make("OfficeQA-ClaudeCode", max_calls=0)
    assert "max_calls" in str(err.value)
    with pytest.raises(ValidationError) as err:
        clawgym_env.make("OfficeQA-ClaudeCode", no_such_option=1)
    assert "no_such_option" in str(err.value)


def test_override_reaches_env_options():
    env = clawgym_env.make("OfficeQA-ClaudeCode", max_calls=5, split="test")
    assert env.options.max_calls == 5 and env.options.split == "test"
    # the registered defaults are untouched
    assert clawgym_env.make("OfficeQA-ClaudeCode").options.max_calls != 5


def test_register_suite_pairs_with_every_harness():
    reg = Registry()
    reg.register_harness(HarnessSpec(name="H1", adapter="x:y", api_style="openai-chat"))
    reg.register_suite(TaskSuite(name="S1", tasks=[_task()]))
    reg.register_harness(HarnessSpec(name="H2", adapter="x:y", api_style="anthropic-messages"))
    assert reg.list() == ["S1-H1", "S1-H2"]


def test_register_pair_needs_known_parts():
    with pytest.raises(UnknownEnvironmentError, match="suite 'Nope'"):
        clawgym_env.register(EnvSpec(id="Nope-ClaudeCode", suite="Nope", harness="ClaudeCode"))


@pytest.mark.parametrize("wrong", ["Nope-ClaudeCode", {"name": "S", "tasks": []}, None])
def test_register_takes_one_form_a_spec(wrong):
    with pytest.raises(TypeError, match="takes a TaskSuite, a HarnessSpec or an EnvSpec"):
        clawgym_env.register(wrong)
    with pytest.raises(TypeError):
        clawgym_env.register(name="S", tasks=[_task()])  # the keyword forms are gone: build the spec


def test_suite_and_harness_names_reject_dashes():
    with pytest.raises(ValidationError, match="name"):
        TaskSuite(name="My-Suite", tasks=[_task()])
    with pytest.raises(ValidationError, match="api_style"):
        HarnessSpec(name="H", adapter="x:y", api_style="smoke-signals")


def test_env_spec_id_must_match_parts():
    with pytest.raises(ValidationError, match="must be"):
        EnvSpec(id="A-B", suite="A", harness="C")


def test_suite_needs_exactly_one_source():
    with pytest.raises(ValidationError, match="exactly one"):
        TaskSuite(name="S")


def test_loader_suite_is_lazy_and_cached():
    calls = []

    def loader(split: str, **kw):
        calls.append(split)
        return [_task(f"{split}-{i}", metadata={"split": split}) for i in range(3)]

    suite = TaskSuite(name="Lazy", loader=loader)
    assert calls == []
    assert [t.id for t in suite.load("test")] == ["test-0", "test-1", "test-2"]
    suite.load("test")
    assert calls == ["test"]
    with pytest.raises(ValueError, match="no split 'dev'"):
        suite.load("dev")
