#!/bin/bash
# ClawGym reward script: runs the checker from the workspace; last stdout line = reward.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 reward/check.py
