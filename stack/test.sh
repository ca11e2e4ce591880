#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks style and types, builds the docs, then runs pytest
# against the real local stack (started by the test fixtures when not already up).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
venv=${DBQ_CACHE:-$HOME/.cache/dbq}/venv
cd "$repo"
src=(operator tests docgen); [[ -d bench ]] && src+=(bench)
printf '\n== ruff\n';  "$venv/bin/ruff" check "${src[@]}" && "$venv/bin/ruff" format --check "${src[@]}"
printf '\n== mypy\n';  "$venv/bin/mypy"
printf '\n== docs (mkdocs build --strict: a broken link or a missing page fails)\n'
NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet --site-dir "${DBQ_CACHE:-$HOME/.cache/dbq}/site"
# Two workers, one module at a time each (tests/conftest.py); the slowest 25 printed, every test's
# time kept in $DBQ_CACHE/pytest-*.xml (JUnit). Arguments go to both runs (e.g. -k, -x).
times=${DBQ_CACHE:-$HOME/.cache/dbq}
printf '\n== pytest, two workers\n'
"$venv/bin/python" -m pytest -ra --durations=25 -n 2 --dist loadscope --no-loadscope-reorder -m "not serial" \
  --junitxml="$times/pytest-parallel.xml" "$@" || parallel=$?
printf '\n== pytest, the modules that stop a shared component, alone\n'
"$venv/bin/python" -m pytest -ra --durations=10 -m serial --junitxml="$times/pytest-serial.xml" "$@" || serial=$?
# pytest exits 5 when a selection (-k, a path) leaves one of the runs with no test
for rc in "${parallel:-0}" "${serial:-0}"; do [[ $rc == 0 || $rc == 5 ]] || exit "$rc"; done
