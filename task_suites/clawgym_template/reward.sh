#!/bin/bash
# ClawGym reward script: runs the checker from the workspace; last stdout line = reward.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -I reward/check.py  # -I: nothing the agent left can shadow an import
