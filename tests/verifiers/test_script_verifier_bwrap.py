"""ScriptVerifier and imported ClawGym tasks through the real local bubblewrap sandbox."""

import posixpath

import pytest

from clawgym_env.interfaces import SandboxUnavailable, VerifyContext
from clawgym_env.specs import TaskSpec
from task_suites import clawgymbench, reference_files
from verifiers import ScriptVerifier


@pytest.fixture
async def backend(tmp_path):
    from clawgym_env.sandbox.local_backend import LocalSandboxBackend

    try:
        backend = LocalSandboxBackend(root=tmp_path / "sandboxes", use_cgroups=False)
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap sandbox unavailable here: {exc}")
    yield backend
    await backend.aclose()


async def test_clawgymbench_reward_sh_runs_inside_the_sandbox(backend):
    tasks = clawgymbench.load("train", seed=2, count=6)
    for task in tasks:
        async with backend.sandbox(task) as sandbox:
            idle = await task.verifier.verify(VerifyContext(sandbox=sandbox, task=task))
            assert idle.error is None and idle.reward < 0.5, (task.id, idle.explanation)
        async with backend.sandbox(task) as sandbox:
            for rel, content in reference_files(task).items():
                await sandbox.write_file(posixpath.join(sandbox.workspace_path, rel), content)
            solved = await task.verifier.verify(VerifyContext(sandbox=sandbox, task=task))
            assert solved.error is None and solved.reward == 1.0, (task.id, solved.explanation)


async def test_script_errors_and_timeouts_in_the_sandbox(backend):
    cases = {"echo not-a-number": "not a float", "echo 0.5; exit 2": "exited with 2"}
    for command, needle in cases.items():
        verifier = ScriptVerifier(command, timeout_s=20)
        task = TaskSpec(id="t", instruction="x", verifier=verifier)
        async with backend.sandbox(task) as sandbox:
            result = await verifier.verify(VerifyContext(sandbox=sandbox, task=task))
            assert result.error is not None and needle in result.error, result.error
    slow = ScriptVerifier("sleep 30; echo 1", timeout_s=1)
    task = TaskSpec(id="t", instruction="x", verifier=slow)
    async with backend.sandbox(task) as sandbox:
        result = await slow.verify(VerifyContext(sandbox=sandbox, task=task))
        assert result.error is not None and "timed out" in result.error


async def test_workspace_path_is_the_task_mount(backend):
    verifier = ScriptVerifier(
        'test "$PWD" = "$WORKSPACE" && test -f reward/x.txt && echo 1', files={"x.txt": "hi"}, files_dest="reward"
    )
    task = TaskSpec(id="t", instruction="x", verifier=verifier, mount_path="/root/.openclaw/workspace")
    async with backend.sandbox(task) as sandbox:
        result = await verifier.verify(VerifyContext(sandbox=sandbox, task=task))
        assert result.error is None and result.reward == 1.0, result.explanation
