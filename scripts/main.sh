#!/usr/bin/env bash
# The main job on the embedded defaults (CPU, local sandboxes, offline model); sets itself up first.
# Options go to `clawgym main`, e.g. `bash scripts/main.sh --mix` or `bash scripts/main.sh --whitebox`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --models
cd "$ROOT"
exec "$ROOT/.venv/bin/clawgym" main "$@"
