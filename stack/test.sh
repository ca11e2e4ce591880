#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks style and types, then runs pytest
# against the real local stack (started by the test fixtures when not already up).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
venv=${DBQ_CACHE:-$HOME/.cache/dbq}/venv
cd "$repo"
src=(operator tests); [[ -d bench ]] && src+=(bench)
printf '\n== ruff\n';  "$venv/bin/ruff" check "${src[@]}" && "$venv/bin/ruff" format --check "${src[@]}"
printf '\n== mypy\n';  "$venv/bin/mypy"
printf '\n== pytest\n'
exec "$venv/bin/python" -m pytest -ra --durations=25 "$@"  # the slowest 25, where CI time goes
