"""Which inference engine the main job runs its rollouts on, and in which precision it updates, chosen from
what this machine supports.

The fastest engine for a 0.5B policy on a CPU depends on the CPU. With AVX-512, vLLM runs the float32
checkpoint in bfloat16 through oneDNN and decodes faster than the transformers engine (docs/engines.md,
"Where it stands"). On an AVX2-only CPU vLLM's bfloat16 linear layers fall back to plain torch ("Failed to
create oneDNN linear") and decode slower than the transformers engine, but vLLM in float32 decodes faster than
either: side by side on the same replayed main-job rollouts on an AVX2-only AMD EPYC (`benchmarks.engine_bench
--compare-engines --vllm-dtype bfloat16 float32 --omp-bind 0-1`, docs/engines.md). So vLLM runs everywhere it is
installed, in bfloat16 with AVX-512 and in float32 without. A GPU gets vLLM with its own dtype choice. On a
2-core machine vLLM's own binding runs the model on one core (it keeps the other for its scheduler); there the
main job gives vLLM's threads both cores and evaluates 16 held-out rollouts at once, which side by side
evaluated faster than vLLM's binding with 8 (`benchmarks.eval_concurrency --concurrency 8 16 --omp-bind auto
0-1`: the README's benchmark table, with AVX-512, where at 8 at once the binding made no difference
detectable; and on the AVX2-only EPYC in float32, results log). A user's `engine=...` override always wins; the
run's summary says what was picked and why (`report.json`, "engine").

The main job's update (the trainer's forward and backward) runs under bfloat16 autocast on a CPU with AMX,
where it was faster than in float32 (`benchmarks.autocast_bench`) and, over 3 seeds, the main job's recipe
learned with no difference from float32 detectable (`benchmarks.async_training --bf16`, the generated table
in docs/trainers.md), and on one with AVX512_BF16 but no AMX, where it was also faster side by side (an AMD
EPYC: results log; learning there rests on the same bfloat16 arithmetic, not on runs of its own); elsewhere
in float32 (bfloat16 not measured faster; a GPU run keeps the config's choice). A user's `optim.autocast=...` wins. The experiments' recipes (`benchmarks.transfer_matrix`)
stay in float32, as their stored arms trained.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from pydantic import BaseModel


class EngineChoice(BaseModel):
    """The engine and dtype picked, the reason, and the CPU facts it was picked from."""

    kind: str  # an engine config group: transformers | vllm | vllm_server | remote
    dtype: str
    reason: str
    cpu_omp_bind: str | None = None  # vLLM on CPU: the cores its threads run on (None: vLLM's own binding)
    eval_concurrency: int | None = None  # held-out rollouts at once, where the binding changes what is fastest
    cpu: str = "unknown"
    avx512: bool = False
    gpu: bool = False

    def overrides(self) -> list[str]:
        """Hydra overrides that select this engine (nothing for the config's default, the transformers engine)."""
        if self.kind == "transformers":
            return []
        out = ["engine=vllm", f"+engine.options.dtype={self.dtype}"]
        if self.cpu_omp_bind:
            out.append(f"+engine.options.cpu_omp_bind={self.cpu_omp_bind}")
        if self.eval_concurrency:
            out.append(f"eval.concurrency={self.eval_concurrency}")
        return out


def cpu_facts(cpuinfo: str | None = None) -> tuple[str, set[str]]:
    """The CPU's model name and its feature flags, from /proc/cpuinfo (or the text given)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    name, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "unknown":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, flags


def cpu_summary(cpuinfo: str | None = None) -> str:
    """The CPU's model and the flags that change what is fast here (AVX2, AVX-512, AVX-512 bf16, AMX): how
    stored figures name the machine they came from (machines of one kind differ in these)."""
    name, flags = cpu_facts(cpuinfo)
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({', '.join(shown) or 'no AVX2'}, {os.cpu_count()} cores)"


def choose_engine(
    cpuinfo: str | None = None,
    *,
    vllm_installed: bool | None = None,
    gpu: bool | None = None,
    cores: int | None = None,
) -> EngineChoice:
    """The main job's engine for this machine (arguments override what is detected, for tests)."""
    if vllm_installed is None:
        vllm_installed = importlib.util.find_spec("vllm") is not None
    if gpu is None:
        import torch

        gpu = bool(torch.cuda.is_available())
    name, flags = cpu_facts(cpuinfo)
    avx512 = "avx512f" in flags
    facts = {"cpu": name, "avx512": avx512, "gpu": gpu}
    if not vllm_installed:
        return EngineChoice(kind="transformers", dtype="float32", reason="vLLM is not installed", **facts)
    if gpu:
        return EngineChoice(kind="vllm", dtype="auto", reason="a GPU: vLLM with its own dtype", **facts)
    if avx512:
        dtype = "bfloat16"
        reason = "AVX-512: vLLM's oneDNN bfloat16 kernels decode faster than the transformers engine (docs/engines.md)"
    else:
        dtype = "float32"
        reason = (
            "no AVX-512: vLLM's bfloat16 falls back to plain torch linear layers, slower than the transformers "
            "engine, but vLLM in float32 decoded faster than both side by side (docs/engines.md)"
        )
    if (cores or os.cpu_count() or 1) > 2:  # the binding was measured on 2 cores only
        return EngineChoice(kind="vllm", dtype=dtype, reason=reason, **facts)
    return EngineChoice(
        kind="vllm",
        dtype=dtype,
        cpu_omp_bind="0-1",
        eval_concurrency=16,
        reason=reason + "; on 2 cores its threads on both and 16 held-out rollouts at once evaluated faster "
        "side by side than its own binding (one core) with 8 (benchmarks.eval_concurrency)",
        **facts,
    )


class UpdateChoice(BaseModel):
    """The trainer's update precision (`optim.autocast`) picked for this machine, and why."""

    autocast: str | None  # "bfloat16" or None (float32 throughout)
    reason: str

    def overrides(self) -> list[str]:
        return [f"optim.autocast={self.autocast or 'null'}"]


def choose_update(cpuinfo: str | None = None, *, gpu: bool | None = None) -> UpdateChoice:
    """The main job's update precision for this machine (arguments override what is detected, for tests)."""
    if gpu is None:
        import torch

        gpu = bool(torch.cuda.is_available())
    if gpu:
        return UpdateChoice(autocast=None, reason="a GPU: the config's precision")
    flags = cpu_facts(cpuinfo)[1]
    if "amx_bf16" in flags:
        return UpdateChoice(
            autocast="bfloat16",
            reason="AMX: updates under bfloat16 autocast were faster, with no difference in learning detectable "
            "(docs/trainers.md)",
        )
    if "avx512_bf16" in flags:
        return UpdateChoice(
            autocast="bfloat16",
            reason="AVX512_BF16: updates under bfloat16 autocast were 1.59x faster side by side (results log); "
            "the same bfloat16 arithmetic as on AMX, where learning showed no difference (docs/trainers.md)",
        )
    return UpdateChoice(
        autocast=None, reason="no AMX or AVX512_BF16: float32 (bfloat16 autocast not measured faster here)"
    )
