"""The Daytona backend: one ephemeral remote sandbox per rollout, through the `daytona` SDK (`AsyncDaytona`).

The SDK is imported lazily (`pip install 'clawgym[daytona]'`). Credentials come from DAYTONA_API_KEY (and
DAYTONA_API_URL / DAYTONA_TARGET) or the `api_key`/`api_url`/`target` options. Each sandbox is created from a
snapshot or an image, ephemeral (deleted when it stops) with a TTL as a backstop, and its network is blocked
except for the serving proxy's public host (ProxyEndpoint.public_url), which the harness reaches at
`proxy_base_url` (the per-rollout route with its secret key is appended by the environment).

Daytona's `process.exec` runs a shell string and returns one output stream, so `exec` wraps the command:
stderr goes to a file that is appended, base64-encoded, after a random marker; stdin is uploaded first.
Each stream is cut inside the sandbox to `SandboxLimits.max_output_bytes` (its head and tail halves, the
dropped bytes counted in the ExecResult), so a command's output never reaches the host unbounded.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import posixpath
import shlex
import tarfile
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from clawgym_env.interfaces import (
    ExecResult,
    OutputCap,
    ProxyEndpoint,
    SandboxLimits,
    SandboxUnavailable,
    dropped_marker,
)
from clawgym_env.sandbox.workspace import materialize_workspace

if TYPE_CHECKING:
    from clawgym_env.specs import TaskSpec

SCRATCH = "/tmp/.clawgym"
DEFAULT_SNAPSHOT = None  # Daytona's default python snapshot


def _import_sdk() -> Any:
    try:
        import daytona
    except ImportError as exc:
        raise SandboxUnavailable(
            "the Daytona backend needs the daytona SDK: `pip install 'clawgym[daytona]'` (or `pip install daytona`)"
        ) from exc
    return daytona


class DaytonaSandboxBackend:
    """Creates Daytona sandboxes. Options: `api_key`, `api_url`, `target`, `snapshot` or `image`, `env`, `labels`,
    `limits`, `allow_domains` (extra hosts the sandbox may reach besides the proxy)."""

    name = "daytona"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        snapshot: str | None = DEFAULT_SNAPSHOT,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        allow_domains: Sequence[str] = (),
        create_timeout_s: float = 120.0,
    ) -> None:
        if snapshot and image:
            raise ValueError("give either a Daytona snapshot or an image, not both")
        sdk = _import_sdk()
        self._sdk = sdk
        config = (
            sdk.DaytonaConfig(api_key=api_key, api_url=api_url, target=target)
            if (api_key or api_url or target)
            else None
        )
        try:
            self._client = sdk.AsyncDaytona(config)
        except sdk.DaytonaError as exc:
            raise SandboxUnavailable(
                f"Daytona is not configured: {exc} (set DAYTONA_API_KEY, see docs/sandbox.md)"
            ) from exc
        self.snapshot = snapshot
        self.image = image
        self.env = dict(env or {})
        self.labels = {"clawgym": "1", **dict(labels or {})}
        self.limits = limits if isinstance(limits, SandboxLimits) else SandboxLimits(**(limits or {}))
        self.allow_domains = list(allow_domains)
        self.create_timeout_s = create_timeout_s
        self._sandboxes: set[DaytonaSandbox] = set()

    def _params(self, task: TaskSpec, proxy: ProxyEndpoint | None, limits: SandboxLimits) -> Any:
        sdk = self._sdk
        common: dict[str, Any] = {
            "env_vars": self.env or None,
            "labels": {**self.labels, "clawgym-task": task.id[:60]},
            "ephemeral": True,
            "auto_stop_interval": max(1, math.ceil(limits.wall_time_s / 60)),
            **network_policy(proxy, self.allow_domains),
        }
        if self.image:
            resources = sdk.Resources(
                memory=max(1, math.ceil(limits.memory_mb / 1024)), disk=max(1, math.ceil(limits.workspace_mb / 1024))
            )
            return sdk.CreateSandboxFromImageParams(image=self.image, resources=resources, **common)
        return sdk.CreateSandboxFromSnapshotParams(snapshot=self.snapshot, **common)

    async def create(
        self,
        task: TaskSpec,
        *,
        proxy: ProxyEndpoint | None = None,
        limits: SandboxLimits | None = None,
    ) -> DaytonaSandbox:
        if proxy is not None and not proxy.public_url:
            raise ValueError(
                "a remote Daytona sandbox reaches the serving proxy only at a public URL: set ProxyEndpoint.public_url "
                "(for example an https tunnel to the proxy), see docs/sandbox.md"
            )
        limits = limits or self.limits
        with tempfile.TemporaryDirectory(
            prefix="clawgym-seed-"
        ) as seed_dir:  # validate + seed before paying for a sandbox
            await asyncio.to_thread(materialize_workspace, task.workspace, Path(seed_dir))
            archive = _tar_folder(Path(seed_dir))
        remote = await self._client.create(self._params(task, proxy, limits), timeout=self.create_timeout_s)
        sandbox = DaytonaSandbox(self, remote, task.mount_path, limits, proxy.public_url if proxy else None)
        self._sandboxes.add(sandbox)
        try:
            await sandbox._seed(archive)
        except BaseException:
            await asyncio.shield(sandbox.destroy())
            raise
        return sandbox

    async def aclose(self) -> None:
        await asyncio.gather(*(s.destroy() for s in list(self._sandboxes)), return_exceptions=True)
        await self._client.close()

    async def __aenter__(self) -> DaytonaSandboxBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def network_policy(proxy: ProxyEndpoint | None, allow_domains: Sequence[str] = ()) -> dict[str, Any]:
    """Block everything, except the proxy's public host (and any extra domains the caller allows)."""
    hosts = list(allow_domains)
    if proxy is not None and proxy.public_url:
        host = urlparse(proxy.public_url).hostname
        if not host:
            raise ValueError(f"ProxyEndpoint.public_url {proxy.public_url!r} has no host name")
        hosts.append(host)
    if not hosts:
        return {"network_block_all": True}
    ips = [h for h in hosts if _is_ip(h)]
    domains = [h for h in hosts if not _is_ip(h)]
    policy: dict[str, Any] = {"network_block_all": False}
    if ips:
        policy["network_allow_list"] = ",".join(f"{ip}/32" for ip in ips)
    if domains:
        policy["domain_allow_list"] = ",".join(domains)
    return policy


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class DaytonaSandbox:
    """One remote Daytona sandbox (see the module docstring for how exec is wrapped)."""

    def __init__(
        self,
        backend: DaytonaSandboxBackend,
        remote: Any,
        mount_path: str,
        limits: SandboxLimits,
        proxy_base_url: str | None,
    ) -> None:
        self.id = remote.id
        self.workspace_path = mount_path
        self.proxy_base_url = proxy_base_url
        self.limits = limits
        self._backend = backend
        self._remote = remote
        self._deadline = time.monotonic() + limits.wall_time_s
        self._destroyed = False

    async def _seed(self, archive: bytes) -> None:
        path = f"{SCRATCH}/seed.tar.gz"
        await self._remote.fs.upload_file(archive, path)
        ws = shlex.quote(self.workspace_path)
        result = await self._shell(f"mkdir -p {ws} && tar -xzf {path} -C {ws} && rm -f {path}", timeout_s=120)
        if result.exit_code != 0:
            raise RuntimeError(
                f"seeding the workspace of Daytona sandbox {self.id} failed: {result.stderr or result.stdout}"
            )

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self._check_alive()
        shell = command if isinstance(command, str) else shlex.join(str(p) for p in command)
        wall_left = self._deadline - time.monotonic()
        budget = min(timeout_s, wall_left) if timeout_s is not None else wall_left
        if budget <= 0:
            return ExecResult(exit_code=137, timed_out=True, killed_reason="wall_time")
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = f"{SCRATCH}/stdin-{uuid.uuid4().hex[:8]}"
            await self._remote.fs.upload_file(stdin, stdin_path)
        result = await self._shell(
            shell,
            cwd=posixpath.join(self.workspace_path, cwd) if cwd else self.workspace_path,
            env=env,
            timeout_s=budget,
            stdin_path=stdin_path,
        )
        if result.killed_reason == "timeout" and (timeout_s is None or timeout_s > wall_left):
            result.killed_reason = "wall_time"
        return result

    async def _shell(
        self,
        shell: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 600,
        stdin_path: str = "/dev/null",
    ) -> ExecResult:
        token = uuid.uuid4().hex
        marker, middle = f"__CLAWGYM_{token}__", f"__CLAWGYM_MID_{token}__"
        err = f"{SCRATCH}/stderr-{token}"
        cleanup = stdin_path if stdin_path != "/dev/null" else ""
        seconds = max(1, math.ceil(timeout_s))
        cap = self.limits.max_output_bytes
        tail = cap // 2
        head = cap - tail
        # stdout streams through `head`, then `tail` (which keeps only the last bytes): only `cap` bytes of it
        # come back, with its full size (counted by dd), and the exit code, on fd 3 (no file a leftover process
        # could rewrite); stderr's file is cut the same way. Neither the toolbox's reply nor the host ever holds
        # more than about `cap` bytes of a command's output.
        wrapped = (
            f"mkdir -p {SCRATCH}; exec 4>&1; "
            f"st=$( {{ {{ timeout -s KILL {seconds} sh -c {shlex.quote(shell)} < {stdin_path} 2> {err} 3>&- 4>&-; "
            f'echo "code=$?" >&3; }} | LC_ALL=C dd bs=65536 2>&3 | '
            f"{{ head -c {head}; printf '%s' {middle}; tail -c {tail}; }} >&4; }} 3>&1 ); "
            f"n=$(printf '%s\\n' \"$st\" | sed -n 's/^\\([0-9][0-9]*\\) byte.*/\\1/p'); "
            f"code=$(printf '%s\\n' \"$st\" | sed -n 's/^code=//p'); e=$(wc -c < {err}); "
            f'printf \'%s%s %s \' {marker} "${{n:-0}}" "${{e:-0}}"; '
            f'if [ "${{e:-0}}" -gt {cap} ]; then head -c {head} {err}; tail -c {tail} {err}; else cat {err}; fi '
            f"| base64 | tr -d '\\n'; rm -f {err} {cleanup}; exit \"${{code:-1}}\""
        )
        started = time.monotonic()
        response = await self._remote.process.exec(
            f"sh -c {shlex.quote(wrapped)}",
            cwd=cwd,
            env={**self._backend.env, **dict(env or {})} or None,
            timeout=seconds + 10,
        )
        duration = time.monotonic() - started
        stdout, stderr, dropped_out, dropped_err = _split_output(response.result or "", marker, middle, cap)
        code = int(response.exit_code if response.exit_code is not None else -1)
        reason = "timeout" if code == 137 and duration >= seconds - 0.5 else None
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            duration_s=duration,
            timed_out=reason is not None,
            killed_reason=reason,
            stdout_dropped_bytes=dropped_out,
            stderr_dropped_bytes=dropped_err,
        )

    def _inside(self, path: str) -> str:
        inside = posixpath.normpath(posixpath.join(self.workspace_path, path))
        for allowed in (self.workspace_path, "/tmp"):
            if inside == allowed or inside.startswith(allowed + "/"):
                return inside
        raise PermissionError(f"path {path!r} is outside the sandbox's workspace ({self.workspace_path}) and /tmp")

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        return bytes(await self._remote.fs.download_file(self._inside(path)))

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._check_alive()
        await self._remote.fs.upload_file(data.encode() if isinstance(data, str) else bytes(data), self._inside(path))

    async def list_files(self, path: str | None = None) -> list[str]:
        self._check_alive()
        target = shlex.quote(self._inside(path or self.workspace_path))
        result = await self._shell(f"find {target} -mindepth 1 -not -type d -printf '%P\\n'", timeout_s=60)
        if result.exit_code != 0:
            raise FileNotFoundError(f"cannot list {path} in Daytona sandbox {self.id}: {result.stderr.strip()}")
        return sorted(line for line in result.stdout.splitlines() if line)

    async def download_workspace(self, dest: Path) -> Path:
        self._check_alive()
        archive = f"{SCRATCH}/workspace.tar.gz"
        result = await self._shell(
            f"mkdir -p {SCRATCH} && tar -czf {archive} -C {shlex.quote(self.workspace_path)} .", timeout_s=300
        )
        if result.exit_code != 0:
            raise RuntimeError(f"packing the workspace of Daytona sandbox {self.id} failed: {result.stderr}")
        data = await self._remote.fs.download_file(archive)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:gz") as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, '..' and links leaving dest
        return dest

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._backend._sandboxes.discard(self)
        await self._backend._client.delete(self._remote)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise RuntimeError(f"Daytona sandbox {self.id} was destroyed")

    async def __aenter__(self) -> DaytonaSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.destroy())


def _split_output(output: str, marker: str, middle: str, cap: int) -> tuple[str, str, int, int]:
    """(stdout, stderr, bytes dropped from each) from what `_shell`'s wrapper printed: stdout's head, `middle`,
    its tail, then `marker`, the two streams' full sizes, and stderr (head and tail where over `cap`) in
    base64. What came back is held to about `cap` per stream here too, whatever the toolbox sent."""
    body, found, trailer = output.rpartition(marker)
    if not found:  # the wrapper did not finish (the toolbox gave up): what came is stdout
        stdout, dropped = _capped(output.encode(errors="replace"), cap)
        return stdout, "", dropped, 0
    try:
        out_size, err_size, encoded = trailer.split(" ", 2)
        sizes = (int(out_size), int(err_size))
        err = base64.b64decode(encoded)
    except ValueError:
        sizes, err = (0, 0), b""
    head, _, tail = body.partition(middle)
    out = head.encode(errors="replace")
    if sizes[0] > cap:  # the middle of stdout was drained and dropped inside
        out += dropped_marker(sizes[0] - cap)
    out += tail.encode(errors="replace")
    if sizes[1] > cap:
        err = err[: cap - cap // 2] + dropped_marker(sizes[1] - cap) + err[cap - cap // 2 :]
    stdout, more_out = _capped(out, cap + 200)
    stderr, more_err = _capped(err, cap + 200)
    return stdout, stderr, max(0, sizes[0] - cap) + more_out, max(0, sizes[1] - cap) + more_err


def _capped(data: bytes, cap: int) -> tuple[str, int]:
    """`data` held to `cap` bytes (head and tail, a marker between), as text; bytes dropped."""
    kept = OutputCap(cap)
    kept.add(data)
    text, dropped = kept.result()
    return text.decode(errors="replace"), dropped


def _tar_folder(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()
