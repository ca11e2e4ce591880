"""The Argo CD health check (manifests/argocd/health.lua) run by a real Lua 5.1 interpreter, the
language version of the gopher-lua Argo CD embeds, on the cases of its health_test.yaml; and the
kustomize Component that merges it into argocd-cm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent.parent / "manifests" / "argocd"
CASES = yaml.safe_load((HERE / "health_test.yaml").read_text())["tests"]


def lua_value(value: Any) -> str:
    """A Lua table constructor for a JSON-like value (strings through JSON's escapes, which
    Lua 5.1 reads the same for the ASCII text of the cases)."""
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"[{json.dumps(k)}] = {lua_value(v)}" for k, v in value.items() if v is not None)
            + "}"
        )
    if isinstance(value, list):
        return "{" + ", ".join(lua_value(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    assert isinstance(value, str) and value.isascii(), value
    return json.dumps(value)


def health(obj: dict[str, Any]) -> dict[str, str]:
    lua = shutil.which("lua5.1")
    assert lua, "lua5.1 is missing: stack/bootstrap.sh installs it from Debian"
    script = (
        f"obj = {lua_value(obj)}\n"
        f"local function check()\n{(HERE / 'health.lua').read_text()}\nend\n"
        "local hs = check()\nio.write(hs.status, '\\n', hs.message or '')\n"
    )
    done = subprocess.run([lua, "-"], input=script, capture_output=True, text=True, check=True)
    status, message = done.stdout.split("\n", 1)
    return {"status": status, "message": message}


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_health_of_each_case(case):
    obj = yaml.safe_load((HERE / case["inputPath"]).read_text())
    assert health(obj) == case["healthStatus"]


def test_every_status_argo_cd_knows_is_covered():
    assert {c["healthStatus"]["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_the_component_merges_the_check_into_argocd_cm(tmp_path):
    (tmp_path / "argocd-cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: argocd-cm}\n"
        "data: {url: 'https://argocd.example.com'}\n"
    )
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: argocd\nresources: [argocd-cm.yaml]\ncomponents: [{os.path.relpath(HERE, tmp_path)}]\n"
    )
    built = subprocess.run(["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    merged = yaml.safe_load(built)
    assert merged["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    data = merged["data"]
    assert data["url"] == "https://argocd.example.com"
    assert data["resource.customizations.health.dbq.dev_Queue"] == (HERE / "health.lua").read_text()
