"""A serving proxy and a sandbox backend on one run directory, started and stopped together.

Rollouts composed by hand (`run_rollout` in health checks, tests, benchmarks) need the same two parts the
`Runtime` owns: a started `ServingProxy` writing to a run directory, and a sandbox backend whose sandboxes
cannot see that directory (it holds every rollout's recorded calls). This is that set-up, in one place.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym_env.interfaces import SandboxBackend


def backend_hiding_run_dir(name: str, options: Mapping[str, Any], run_dir: Path) -> SandboxBackend:
    """A sandbox backend whose sandboxes do not see `run_dir` (recorded calls, other rollouts' artifacts)."""
    from clawgym_env.sandbox import make_backend

    hidden = [*options.get("hidden_paths", []), str(run_dir)]
    return make_backend(name, **{**options, "hidden_paths": hidden})


@dataclass
class ServingStack:
    run_dir: Path
    proxy: Any  # clawgym_env.proxy.ServingProxy (imported lazily: FastAPI/uvicorn are heavy)
    backend: SandboxBackend


@contextlib.asynccontextmanager
async def serving_stack(
    run_dir: str | Path | None = None,
    *,
    backend: str = "local",
    backend_options: Mapping[str, Any] | None = None,
    **proxy_options: Any,
) -> AsyncIterator[ServingStack]:
    """Start a `ServingProxy` on `run_dir` and a sandbox backend hiding it; close both on exit.

    run_dir None: a fresh temporary folder, removed on exit. proxy_options go to `ServingProxy`
    (port, unix_socket, engine_timeout_s, keep_closed, ...); backend_options to the backend (root, pool_size...).
    """
    from clawgym_env.proxy import ServingProxy

    temporary = run_dir is None
    path = Path(tempfile.mkdtemp(prefix="clawgym-run-")) if run_dir is None else Path(run_dir)
    try:
        async with ServingProxy(path, **proxy_options) as proxy:
            sandboxes = backend_hiding_run_dir(backend, backend_options or {}, path)
            try:
                yield ServingStack(run_dir=path, proxy=proxy, backend=sandboxes)
            finally:
                await sandboxes.aclose()
    finally:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
