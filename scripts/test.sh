#!/usr/bin/env bash
# Run the test suite (fast default tier); sets itself up first. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -m slow` for the slow tier or `bash scripts/test.sh tests/proxy`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
