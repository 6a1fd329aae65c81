#!/usr/bin/env bash
# The prepared check for a lent GPU machine (the `device` tool): one call, under 10 minutes.
#
#   bash benchmarks/gpu_check.sh          # on the GPU machine, from the repository root; results in $OUT
#
# That machine starts bare and reaches no package registry, and at most 64 MiB travels with the working
# tree, so it cannot install torch or vLLM itself: the check uses the Python, torch and vLLM its image has,
# and says what is missing otherwise. With one GPU the NCCL weight broadcast cannot run there (NCCL refuses
# two ranks on one GPU; the trainer and the vLLM workers need GPUs of their own).
set -uo pipefail
OUT="${OUT:-/tmp/clawgym-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"
  "$PY" - <<'PY'
import importlib.util, sys
print("python", sys.version.split()[0])
for name in ("torch", "vllm", "transformers", "fastapi"):
    spec = importlib.util.find_spec(name)
    version = getattr(__import__(name), "__version__", "?") if spec else None
    print(f"{name}: {version or 'missing'}")
try:
    import torch
    print("cuda available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
except ImportError:
    pass
PY
} 2>&1 | tee "$OUT/environment.txt"

if ! "$PY" -c 'import torch, vllm, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "GPU check skipped: this image has no CUDA torch + vLLM, and the machine cannot install them" | tee -a "$OUT/environment.txt"
  exit 0
fi
"$PY" -m pip install -q --no-deps -e . 2>&1 | tail -2
timeout 300 "$PY" -m pytest -q -m vllm tests/engines 2>&1 | tee "$OUT/vllm_tests.txt" | tail -5
timeout 240 "$PY" -m benchmarks.engine_bench --compare-engines --model qwen2.5-coder-0.5b --concurrency 8 \
  2>&1 | tee "$OUT/engine_bench.txt" | tail -30
