"""HostDirSandboxTestDouble: a named test double of `interfaces.Sandbox` over a plain host folder.

Commands really run (subprocess, with a timeout), files really live on disk; only the isolation is
missing: the host folder stands for the workspace, and sandbox paths under `workspace_path` (also in
command strings and environment values) are mapped onto it. The real bubblewrap sandbox is tested
separately where available.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.interfaces import ExecResult
from clawgym_env.specs import DEFAULT_MOUNT_PATH


class HostDirSandboxTestDouble:
    def __init__(self, root: Path, workspace_path: str = DEFAULT_MOUNT_PATH) -> None:
        self.id = f"hostdir-{uuid.uuid4().hex[:8]}"
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.workspace_path = workspace_path
        self.proxy_base_url = None
        self.commands: list[Sequence[str] | str] = []

    def _map_text(self, text: str) -> str:
        return text.replace(self.workspace_path, str(self.root))

    def host_path(self, path: str | None) -> Path:
        if path is None:
            return self.root
        if path.startswith(self.workspace_path):
            rel = path[len(self.workspace_path) :].lstrip("/")
            return self.root / rel
        if os.path.isabs(path):
            raise PermissionError(f"{path} is outside the workspace {self.workspace_path} of this test double")
        return self.root / path

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self.commands.append(command)
        argv = (
            ["bash", "-c", self._map_text(command)]
            if isinstance(command, str)
            else [self._map_text(c) for c in command]
        )
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "LANG": "C.UTF-8"}
        full_env.update({k: self._map_text(v) for k, v in (env or {}).items()})
        loop = asyncio.get_running_loop()
        start = loop.time()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(self.host_path(cwd)),
            env=full_env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=timeout_s)
        except TimeoutError:
            os.killpg(proc.pid, 9)
            await proc.wait()
            return ExecResult(exit_code=-9, timed_out=True, killed_reason="timeout", duration_s=loop.time() - start)
        return ExecResult(
            exit_code=proc.returncode or 0,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=loop.time() - start,
        )

    async def read_file(self, path: str) -> bytes:
        return self.host_path(path).read_bytes()

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    async def list_files(self, path: str | None = None) -> list[str]:
        base = self.host_path(path)
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())

    async def download_workspace(self, dest: Path) -> Path:
        shutil.copytree(self.root, dest, dirs_exist_ok=True)
        return Path(dest)

    async def destroy(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
