"""OpenClaw (`openclaw` 2026.9.6) headless through `openclaw agent exec` (Node 24).

    openclaw agent exec --config <generated json5> --cwd <workspace> --model policy/<name> --json "<instruction>"

The API style is selectable: openai-responses (default: the only mode whose `input` list is an exact prefix
extension of the previous call), openai-completions, anthropic-messages (both rewrite history; docs/harnesses.md).
OpenClaw has no loop guard of its own (2,205 calls in one measured run), so the proxy's per-rollout call cap
matters here. MCP servers go in the config's `mcp.servers` (stdio: command, args, env). OpenClaw's default
Tool Search ("tools" mode) does not put their tools in the request's `tools`: they are cataloged as
`<server>__<tool>` behind `tool_search` / `tool_describe` / `tool_call`; `tool_search=False` offers every
schema directly instead (45 tools, ~80 kB, against 11 and ~10 kB). Both measured in docs/harnesses.md.

Start-up (docs/harnesses.md): OpenClaw turns on Node's on-disk compile cache itself, but under
`os.tmpdir()`, which is the sandbox's private /tmp, so every rollout compiled its ~7,000 modules from
scratch and wrote a 37 MB cache nobody read. `build_compile_cache()` (run once by scripts/setup.sh) fills
`<install>/openclaw-compile-cache` from one real scripted rollout; every later rollout reads it read-only
(the sandbox sees the install read-only; Node skips the write-back silently).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import HarnessContext
from clawgym_env.specs import ApiStyle
from harness_adapters.base import CliHarnessAdapter, HarnessInstall, LaunchPlan, ParsedRun, parse_json_document

COMPILE_CACHE = "openclaw-compile-cache"  # folder under the install root, built by build_compile_cache()

OPENCLAW_APIS = {
    ApiStyle.OPENAI_RESPONSES: "openai-responses",
    ApiStyle.OPENAI_CHAT: "openai-completions",
    ApiStyle.ANTHROPIC_MESSAGES: "anthropic-messages",
}


class OpenClawAdapter(CliHarnessAdapter):
    name = "OpenClaw"
    api_style = ApiStyle.OPENAI_RESPONSES
    binary = "openclaw"
    package = "openclaw"
    pinned_version = "2026.9.6"

    def __init__(
        self,
        *,
        api_style: str | ApiStyle = ApiStyle.OPENAI_RESPONSES,
        local_model_lean: bool = False,
        code_mode: str | None = "direct",
        context_window: int = 32_768,
        max_tokens: int = 4096,
        state_dir: str | None = None,
        compile_cache: bool | str | Path = True,
        tool_search: bool | str | None = None,
        **kw: Any,
    ) -> None:
        """compile_cache: True reads `<install>/openclaw-compile-cache` when it is there; False leaves OpenClaw's
        own (cold, per-sandbox) cache; a path reads (and, if writable in the sandbox, fills) that folder.
        tool_search: written as `tools.toolSearch` (False: direct schemas; "tools"/"directory"/"code": its modes);
        None leaves OpenClaw's default (structured "tools" mode)."""
        super().__init__(**kw)
        style = ApiStyle(api_style)
        if style not in OPENCLAW_APIS:
            raise ValueError(f"OpenClaw speaks {[s.value for s in OPENCLAW_APIS]}; got {style.value!r}")
        self.api_style = style
        self.local_model_lean = local_model_lean
        self.code_mode = code_mode
        self.context_window = context_window
        self.max_tokens = max_tokens
        self.state_dir = state_dir
        self.compile_cache = compile_cache
        self.tool_search = tool_search

    def compile_cache_dir(self) -> str | None:
        """The Node compile cache folder this adapter points OpenClaw at, or None for OpenClaw's default."""
        if self.compile_cache is True:
            built = self.install.root / COMPILE_CACHE
            return str(built) if built.is_dir() else None
        return str(self.compile_cache) if self.compile_cache else None

    def config(self, ctx: HarnessContext) -> dict[str, Any]:
        api = OPENCLAW_APIS[self.api_style]
        base = ctx.base_url.rstrip("/") + ("" if api == "anthropic-messages" else "/v1")
        config: dict[str, Any] = {
            "agents": {"defaults": {"model": {"primary": f"policy/{ctx.model_name}"}}},
            "models": {
                "mode": "replace",
                "providers": {
                    "policy": {
                        "baseUrl": base,
                        "apiKey": ctx.api_key,
                        "api": api,
                        "timeoutSeconds": max(30, int(ctx.timeout_s)),
                        "models": [
                            {
                                "id": ctx.model_name,
                                "name": ctx.model_name,
                                "reasoning": False,
                                "input": ["text"],
                                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                                "contextWindow": self.context_window,
                                "maxTokens": self.max_tokens,
                            }
                        ],
                    }
                },
            },
        }
        if self.tool_search is not None:
            mode = self.tool_search if isinstance(self.tool_search, bool) else {"mode": self.tool_search}
            config["tools"] = {"toolSearch": mode}
        if self.mcp_servers:
            config["mcp"] = {
                "servers": {
                    s.name: {"command": s.command, "args": list(s.args), **({"env": dict(s.env)} if s.env else {})}
                    for s in self.mcp_servers
                }
            }
        return config

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        config_path = f"{home}/openclaw.json"
        timeout = max(1, math.floor(self.run_timeout(ctx)) - 2)  # finish (and clean up) before our own kill
        argv = [
            "openclaw",
            "agent",
            "exec",
            "--config",
            config_path,
            "--cwd",
            ctx.sandbox.workspace_path,
            "--model",
            f"policy/{ctx.model_name}",
            "--timeout",
            str(timeout),
            "--json",
        ]
        if self.local_model_lean:
            argv.append("--local-model-lean")
        if self.code_mode:
            argv += ["--code-mode", self.code_mode]
        if self.state_dir:
            argv += ["--state-dir", self.state_dir]
        argv.append(ctx.task.instruction)
        env = {"OPENCLAW_NO_RESPAWN": "1"}
        cache = self.compile_cache_dir()
        if cache:
            # Node opens the cache at start from NODE_COMPILE_CACHE; the second variable stops OpenClaw's launcher
            # from respawning itself into `<cache>/openclaw/<version>/<install marker>` (a second Node start).
            env |= {"NODE_COMPILE_CACHE": cache, "OPENCLAW_PACKAGED_COMPILE_CACHE_RESPAWNED": "1"}
        return LaunchPlan(
            argv=argv,
            env=env,
            cwd=ctx.sandbox.workspace_path,
            files={config_path: json.dumps(self.config(ctx), indent=1)},
        )

    def parse(self, stdout: str, stderr: str, exit_code: int | None) -> ParsedRun:
        envelope = parse_json_document(stdout)
        if envelope is None:
            tail = (stderr.strip() or stdout.strip())[-400:]
            return ParsedRun(success=False, error=f"OpenClaw printed no JSON envelope: {tail}")
        ok = bool(envelope.get("ok")) and envelope.get("status") == "ok"
        final = envelope.get("final") if isinstance(envelope.get("final"), str) else ""
        turns = int(envelope.get("assistantTurns") or 0)
        error = None
        if not ok:
            err = envelope.get("error")
            message = err.get("message") if isinstance(err, dict) else err
            error = f"OpenClaw {envelope.get('status', 'error')}: {message or 'no message'}"
        return ParsedRun(
            success=ok and exit_code == 0, final_message=final or "", events=[envelope], turns=turns, error=error
        )


# ------------------------------------------------------------------------------------ compile cache build
class _CacheFillingAdapter(OpenClawAdapter):
    """Points NODE_COMPILE_CACHE into the (writable) workspace, so one run leaves its cache there."""

    def plan(self, ctx: HarnessContext, home: str) -> LaunchPlan:
        self.compile_cache = f"{ctx.sandbox.workspace_path}/{COMPILE_CACHE}"
        return super().plan(ctx, home)


async def build_compile_cache(install: HarnessInstall | None = None, *, force: bool = False) -> Path:
    """Fill `<install>/openclaw-compile-cache` from one real scripted rollout in the local sandbox.

    Built inside the sandbox, not on the host: Node keys the cache by uid (`v24.x-x64-<flags>-<uid>`), and the
    sandbox runs as uid 0 whatever the host user is; module paths are the same (the sandbox sees / read-only).
    The rollout writes a file with OpenClaw's `write` tool, then answers, so tool modules are cached too.
    """
    from clawgym_env.chat import ChatMLRenderer
    from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer
    from clawgym_env.interfaces import Policy
    from clawgym_env.rollout import run_rollout
    from clawgym_env.serving_stack import serving_stack
    from clawgym_env.specs import DEFAULT_MOUNT_PATH, EnvOptions, TaskSpec

    install = install or HarnessInstall.default()
    dest = install.root / COMPILE_CACHE
    if dest.is_dir() and not force:
        return dest
    staging = install.root / f".{COMPILE_CACHE}.building"
    shutil.rmtree(staging, ignore_errors=True)

    def keep_cache(workspace: Path) -> float:
        shutil.copytree(workspace / COMPILE_CACHE, staging)
        return 1.0 if (workspace / "cache.txt").is_file() else 0.0

    tokenizer = load_qwen_tokenizer()
    write = {"name": "write", "arguments": {"path": f"{DEFAULT_MOUNT_PATH}/cache.txt", "content": "ok"}}
    engine = ScriptedTestEngine(tokenizer, ["<tool_call>\n" + json.dumps(write) + "\n</tool_call>", "Done."])
    task = TaskSpec(
        id="openclaw-compile-cache", instruction="Write ok into cache.txt.", verifier=keep_cache, timeout_s=300
    )
    policy = Policy(engine=engine, renderer=ChatMLRenderer(tokenizer))
    async with serving_stack() as stack:
        result = await run_rollout(
            task=task,
            adapter=_CacheFillingAdapter(install_root=install.root),
            policy=policy,
            backend=stack.backend,
            proxy=stack.proxy,
            options=EnvOptions(max_calls=8),
        )
    if result.reward != 1.0 or not staging.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"OpenClaw compile cache build failed: {result.failure or result.harness_result}")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest


if __name__ == "__main__":
    if sys.argv[1:] != ["--build-compile-cache"]:
        sys.exit("usage: python -m harness_adapters.openclaw --build-compile-cache")
    built = asyncio.run(build_compile_cache(force=True))
    print(f"OpenClaw compile cache: {built} ({sum(1 for _ in built.rglob('*'))} entries)")
