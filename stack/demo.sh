#!/usr/bin/env bash
# The main job on the local stack: bring it up and show how to reach it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
venv=${DBQ_CACHE:-$HOME/.cache/dbq}/venv
"$venv/bin/dbq" dev up
