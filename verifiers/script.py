"""ScriptVerifier: run a command inside the final sandbox and read the reward from its output.

The ClawGym convention (`reward/reward.sh`): the script's LAST stdout line is a float in [0, 1].
Anything else (no output, text, a value outside [0, 1], a non-zero exit, a timeout) is a verifier
error, never a 0. An earlier stdout line holding a JSON object of numbers is taken as sub-scores.
"""

from __future__ import annotations

import json
import math
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.interfaces import VerifierResult, VerifyContext
from verifiers.base import BaseVerifier, VerifierConfigError


def _tail(text: str, limit: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def parse_reward_output(stdout: str) -> tuple[float, dict[str, float]]:
    """(reward, sub-scores) from a reward script's stdout; ValueError says what was wrong."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the script printed nothing on stdout; its last line must be a float in [0, 1]")
    last = lines[-1]
    try:
        reward = float(last)
    except ValueError:
        raise ValueError(f"the last stdout line {last!r} is not a float in [0, 1]") from None
    if math.isnan(reward) or not 0.0 <= reward <= 1.0:
        raise ValueError(f"the last stdout line {last!r} is outside [0, 1]")
    subscores: dict[str, float] = {}
    for line in reversed(lines[:-1]):
        if line.startswith("{") and line.endswith("}"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            numeric = {
                str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            if numeric and all(0.0 <= v <= 1.0 for v in numeric.values()):
                subscores = numeric
                break
    return reward, subscores


# Python started by the checker imports nothing from the folder of the script it runs nor from the user's site:
# a module the agent planted (`reward/json.py`, `./json.py`) cannot stand in for the standard library's.
ISOLATED_PYTHON_ENV = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class ScriptVerifier(BaseVerifier):
    """Runs `command` in the sandbox (cwd: the workspace unless `cwd` is given).

    `files` (relative path -> content) and/or `files_dir` (a host folder) are copied into the sandbox
    under `<workspace>/<files_dest>` first: that is how ClawGym's `reward/` folder arrives only after
    the agent has finished, so the agent never sees the checker. Where the sandbox can
    (`end_agent_processes`, the local backend), every process the agent left is killed and a fresh init
    started before the files are copied in, so no leftover can swap, rewrite or answer for the checker.

    What the agent left at `files_dest` is removed whole first (the folder is replaced, never merged: a
    planted `reward/json.py` would shadow the checker's `import json`), and Python runs with
    `ISOLATED_PYTHON_ENV` (a checker that imports a module beside it adds its own folder to `sys.path`, or
    passes `env={"PYTHONSAFEPATH": ""}`: its folder now holds only its files). `stdin_file` names one of the verifier's files that is never written into the
    sandbox: its content reaches the command on stdin only, so the agent's program, which the checker may
    run, has no file to read the expected answers from.
    """

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float = 300.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        files_dir: str | Path | None = None,
        files_dest: str = "",
        stdin_file: str | None = None,
        name: str = "script",
    ) -> None:
        if isinstance(command, str) and not command.strip() or not isinstance(command, str) and not command:
            raise VerifierConfigError("ScriptVerifier needs a non-empty command")
        if files_dir is not None and not Path(files_dir).is_dir():
            raise VerifierConfigError(f"files_dir {files_dir} is not a folder")
        self.command = command
        self.timeout_s = timeout_s + 30.0  # outer guard; the sandbox enforces `script_timeout_s` itself
        self.script_timeout_s = timeout_s
        self.cwd = cwd
        self.env = {**ISOLATED_PYTHON_ENV, **(env or {})}
        self.files = dict(files or {})
        self.files_dir = Path(files_dir) if files_dir is not None else None
        self.files_dest = files_dest.strip("/")
        self.stdin_file = stdin_file
        self.name = name
        if stdin_file is not None and stdin_file not in self._files_to_copy():
            raise VerifierConfigError(f"stdin_file {stdin_file!r} is not one of the verifier's files")

    def _files_to_copy(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        if self.files_dir is not None:
            for path in sorted(self.files_dir.rglob("*")):
                if path.is_file():
                    out[path.relative_to(self.files_dir).as_posix()] = path.read_bytes()
        for rel, content in self.files.items():
            out[rel] = content.encode() if isinstance(content, str) else content
        return out

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        sandbox = ctx.sandbox
        if sandbox is None:
            raise VerifierConfigError("ScriptVerifier needs the task's sandbox (ctx.sandbox is None)")
        end_agent = getattr(sandbox, "end_agent_processes", None)
        if end_agent is not None:  # nothing the agent left running may touch the checker or answer for it
            await end_agent()
        workspace = sandbox.workspace_path
        dest_root = posixpath.join(workspace, self.files_dest) if self.files_dest else workspace
        if self.files_dest:  # replaced whole: nothing the agent put there stays beside the checker
            removed = await sandbox.exec(["rm", "-rf", "--", dest_root], timeout_s=60)
            if removed.exit_code != 0:
                raise RuntimeError(f"cannot clear {self.files_dest}/ before verification: {_tail(removed.stderr)}")
        files = self._files_to_copy()
        stdin = files.pop(self.stdin_file) if self.stdin_file is not None else None
        for rel, data in files.items():
            await sandbox.write_file(posixpath.join(dest_root, rel), data)
        env = {"WORKSPACE": workspace, **self.env}
        result = await sandbox.exec(
            self.command, cwd=self.cwd or workspace, env=env, timeout_s=self.script_timeout_s, stdin=stdin
        )
        shown = self.command if isinstance(self.command, str) else " ".join(self.command)
        if result.timed_out or result.killed_reason == "timeout":
            return VerifierResult.failure(f"`{shown}` timed out after {self.script_timeout_s:g} s")
        if result.exit_code != 0:
            reason = f" (killed: {result.killed_reason})" if result.killed_reason else ""
            return VerifierResult.failure(
                f"`{shown}` exited with {result.exit_code}{reason}; stderr: {_tail(result.stderr) or '(empty)'}"
            )
        try:
            reward, subscores = parse_reward_output(result.stdout)
        except ValueError as exc:
            return VerifierResult.failure(f"`{shown}`: {exc}; stdout tail: {_tail(result.stdout) or '(empty)'}")
        return VerifierResult(
            reward=reward,
            subscores=subscores,
            explanation=f"`{shown}` printed reward {reward:g}" + (f" with sub-scores {subscores}" if subscores else ""),
        )
