"""`dbq run`'s process settings that need no cluster."""

from __future__ import annotations

import os
import subprocess
import sys


def test_glibc_takes_the_malloc_arena_limit_unless_the_environment_sets_one():
    """In a process of its own: the limit is process-wide and set once."""
    check = "from dbq.cli.operator import limit_malloc_arenas; print(limit_malloc_arenas())"
    env_free = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"})  # fmt: skip
    assert env_free.stdout.strip() == "True"
    preset = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True,
                            env={**os.environ, "MALLOC_ARENA_MAX": "4"})  # fmt: skip
    assert preset.stdout.strip() == "False"
