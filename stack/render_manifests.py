"""The Helm chart is the one source of dbq's install manifests. This renders from it the plain
manifests kustomize users apply (`manifests/`), copies the CRD into the chart, writes the chart's
README from its values.yaml comments and the package version into Chart.yaml. It also generates
the push scaler's gRPC modules from their .proto (`operator/dbq/scaler/`).

    python stack/render_manifests.py          # write them
    python stack/render_manifests.py --check  # exit 1 naming each file that is stale

The tests run the check, and run the operator with the RBAC `render()` gives.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dbq.devstack.base import Paths

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "dbq-operator"
MANIFESTS = ROOT / "manifests"
NAMESPACE = "dbq-system"
HEADER = "# Rendered from charts/dbq-operator by stack/render_manifests.py: edit the chart, not this file.\n"
HELM_ONLY_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
BIN = Paths.from_env().cache / "bin"  # helm, kubeconform, untt, kstatus (stack/build-tools.sh)


def render(*args: str, show_only: tuple[str, ...] = (), plain: bool = True) -> list[dict[str, Any]]:
    """`helm template` of the chart as release dbq-operator in dbq-system; `plain` drops the
    labels that say Helm manages the objects."""
    command = [str(BIN / "helm"), "template", "dbq-operator", str(CHART), "--namespace", NAMESPACE, *args]
    for template in show_only:
        command += ["--show-only", f"templates/{template}"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    if plain:
        for doc in docs:
            labels = doc["metadata"].get("labels", {})
            for key in HELM_ONLY_LABELS:
                labels.pop(key, None)
    return docs


def package_version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no version"
    return match.group(1)


def chart_yaml(text: str, version: str) -> str:
    text = re.sub(r"^version: .*$", f"version: {version}", text, flags=re.M)
    return re.sub(r"^appVersion: .*$", f'appVersion: "{version}"', text, flags=re.M)


def dump(docs: list[dict[str, Any]]) -> str:
    return HEADER + yaml.safe_dump_all(docs, sort_keys=False, width=120)


CRD_KINDS = ("queue", "topic", "subscription", "queueuser", "queueconsumer")


SCALER = ROOT / "operator" / "dbq" / "scaler"


def scaler_modules() -> dict[Path, str]:
    """What grpcio-tools' protoc makes of dbq/scaler/externalscaler.proto, imported as
    `dbq.scaler.externalscaler_pb2` (the .proto's path under operator/ gives the import)."""
    import tempfile

    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        proto = "dbq/scaler/externalscaler.proto"
        if protoc.main(["protoc", f"-I{ROOT / 'operator'}", f"--python_out={out}", f"--grpc_python_out={out}",
                        f"--pyi_out={out}", proto]) != 0:  # fmt: skip
            raise RuntimeError(f"protoc failed on {proto}")
        return {SCALER / p.name: p.read_text() for p in sorted((Path(out) / "dbq" / "scaler").iterdir())}


def wanted() -> dict[Path, str]:
    """Each generated file and the text it should have. Chart.yaml first: the rest render from it."""
    monitoring = (
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
    )
    return {
        CHART / "Chart.yaml": chart_yaml((CHART / "Chart.yaml").read_text(), package_version()),
        **{
            CHART / "crds" / f"{kind}.yaml": (ROOT / "crds" / f"{kind}.yaml").read_text()
            for kind in CRD_KINDS
        },
        CHART / "README.md": chart_readme(),
        MANIFESTS / "base" / "operator.yaml": dump(
            render(
                show_only=(
                    "serviceaccount.yaml",
                    "deployment.yaml",
                    "pdb.yaml",
                    "service.yaml",
                    "scaler-service.yaml",
                )
            )
        ),
        MANIFESTS / "overlays" / "cluster-wide" / "rbac.yaml": dump(render(show_only=("rbac.yaml",))),
        MANIFESTS / "overlays" / "namespaced" / "rbac.yaml": dump(
            render("--set", "watchNamespaces={shop}", show_only=("rbac.yaml",))
        ),
        MANIFESTS / "overlays" / "with-monitoring" / "monitoring.yaml": dump(
            render(*monitoring, show_only=("servicemonitor.yaml", "prometheusrule.yaml"))
        ),
        **scaler_modules(),
    }


def values_table(text: str) -> str:
    """The Markdown table of every value documented with a `# --` comment in values.yaml."""
    values = yaml.safe_load(text)
    rows: list[str] = []
    path: list[str] = []
    note: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            note = [stripped[4:].strip()]
        elif stripped.startswith("#") and note:
            note.append(stripped[1:].strip())
        elif ":" in stripped and not stripped.startswith(("#", "-")):
            depth = (len(line) - len(line.lstrip())) // 2
            path[depth:] = [stripped.split(":", 1)[0]]
            if note:
                value: Any = values
                for key in path:
                    value = value[key]
                kind = {bool: "bool", int: "int", float: "number", str: "string", list: "list"}.get(
                    type(value), "object"
                )
                default = json.dumps(value, separators=(", ", ": "))
                rows.append(f"| `{'.'.join(path)}` | {kind} | `{default}` | {' '.join(note)} |")
            note = []
    return "| Key | Type | Default | Description |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def chart_readme() -> str:
    intro = (CHART / "README.md.gotmpl").read_text()
    return intro.replace("{{ values }}", values_table((CHART / "values.yaml").read_text()))


def stale() -> list[Path]:
    """The generated files whose text differs from what the chart renders now."""
    return [path for path, text in wanted().items() if not path.exists() or path.read_text() != text]


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        old = stale()
        for path in old:
            print(f"stale: {path.relative_to(ROOT)} (run python stack/render_manifests.py)")
        return 1 if old else 0
    chart = CHART / "Chart.yaml"  # first: the manifests carry its version
    chart.write_text(chart_yaml(chart.read_text(), package_version()))
    for path, text in wanted().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
