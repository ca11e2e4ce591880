"""The install artifacts: the Helm chart (lint, helm-unittest suites), every rendering of it and
every kustomize overlay, each validated by kubeconform against offline schemas (Kubernetes', the
Queue CRD's and the Prometheus Operator's) and accepted by `kubectl apply --dry-run=server` on
the real local API server; the rendered manifests and the chart's README up to date."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from stack.render_manifests import BIN, CHART, CRD_KINDS, ROOT, stale

KUBE_SCHEMAS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.33.0-local-strict"
PROMETHEUS_CRDS = BIN.parent / "prometheus-operator-crds"
CHART_VALUES = {
    "cluster-wide": [],
    "namespaced": ["--set", "watchNamespaces={shop,billing}"],
    "monitoring": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true"],
    "no-rbac-existing-sa": ["--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                            "--set", "serviceAccount.name=ops"],
    "one-replica-no-election": ["--set", "replicas=1", "--set", "leaderElection.enabled=false"],
}  # fmt: skip
# The Kubernetes kinds the chart and the overlays hold, by their schema file names.
KINDS = ["namespace-v1", "serviceaccount-v1", "service-v1", "deployment-apps-v1", "role-rbac-v1",
         "rolebinding-rbac-v1", "clusterrole-rbac-v1", "clusterrolebinding-rbac-v1",
         "customresourcedefinition-apiextensions-v1", "poddisruptionbudget-policy-v1"]  # fmt: skip
OVERLAYS = [".", "overlays/cluster-wide", "overlays/namespaced", "overlays/with-monitoring"]


def run(*command: str, stdin: str | None = None) -> str:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def helm_template(*args: str) -> str:
    return run(str(BIN / "helm"), "template", "dbq-operator", str(CHART), "--namespace", "dbq-system",
               "--include-crds", *args)  # fmt: skip


def kustomize(overlay: str) -> str:
    return run("kubectl", "kustomize", str(ROOT / "manifests" / overlay))


@pytest.fixture(scope="module")
def schemas(tmp_path_factory) -> Path:
    """Offline JSON schemas for kubeconform: Kubernetes' from the kubernetes-validate wheel, made
    standalone (its references point into a shared definitions file), as {kind}{suffix}.json; and
    the CRDs' openAPIV3Schema as {group}/{kind}_{version}.json."""
    out = tmp_path_factory.mktemp("schemas")
    definitions = json.loads((KUBE_SCHEMAS / "_definitions.json").read_text())["$defs"]
    for kind in KINDS:
        text = (
            (KUBE_SCHEMAS / f"{kind}.json")
            .read_text()
            .replace('"/api/_definitions.json#/$defs/', '"#/$defs/')
        )
        schema = json.loads(text)
        schema["$defs"] = json.loads(
            json.dumps(definitions).replace('"/api/_definitions.json#/$defs/', '"#/$defs/')
        )
        (out / f"{kind}.json").write_text(json.dumps(schema))
    crds = [*(ROOT / "crds" / f"{kind}.yaml" for kind in CRD_KINDS), *sorted(PROMETHEUS_CRDS.glob("*.yaml"))]
    assert len(crds) == len(CRD_KINDS) + 2, (
        f"Prometheus Operator CRDs missing under {PROMETHEUS_CRDS}: run stack/build-tools.sh"
    )
    for path in crds:
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            target = (
                out / crd["spec"]["group"] / f"{crd['spec']['names']['kind'].lower()}_{version['name']}.json"
            )
            target.parent.mkdir(exist_ok=True)
            target.write_text(json.dumps(version["schema"]["openAPIV3Schema"]))
    return out


def kubeconform(manifests: str, schemas: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "kubeconform"), "-strict", "-summary", "-output", "json",
         "-schema-location", str(schemas) + "/{{ .ResourceKind }}{{ .KindSuffix }}.json",
         "-schema-location", str(schemas) + "/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"],
        input=manifests, capture_output=True, text=True,
    )  # fmt: skip


def valid(manifests: str, schemas: Path) -> int:
    """How many objects kubeconform validated; fails on any invalid, errored or skipped one."""
    done = kubeconform(manifests, schemas)
    summary = json.loads(done.stdout)["summary"]
    assert done.returncode == 0 and summary["invalid"] == summary["errors"] == summary["skipped"] == 0, (
        done.stdout
    )
    return int(summary["valid"])


def test_rendered_manifests_chart_readme_and_versions_are_up_to_date():
    assert stale() == [], "run python stack/render_manifests.py"
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == run("python3", "-c", "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])").strip()  # fmt: skip


def test_helm_lint_strict():
    assert "0 chart(s) failed" in run(str(BIN / "helm"), "lint", "--strict", str(CHART))


def test_helm_unittest_suites():
    out = run(str(BIN / "untt"), "--color=false", str(CHART))
    summary = next(line for line in out.splitlines() if line.startswith("Tests:"))
    assert "failed" not in summary and int(summary.split()[1]) >= 16, out


@pytest.mark.parametrize("mode", CHART_VALUES)
def test_chart_renderings_pass_kubeconform(mode, schemas):
    assert valid(helm_template(*CHART_VALUES[mode]), schemas) >= 3


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_overlays_build_and_pass_kubeconform(overlay, schemas):
    assert valid(kustomize(overlay), schemas) >= 7


@pytest.fixture(scope="module")
def api_server(kube) -> str:
    """The real local API server with the CRDs the manifests use and the namespaces they name."""
    for crd in [
        *(ROOT / "crds" / f"{kind}.yaml" for kind in CRD_KINDS),
        *sorted(PROMETHEUS_CRDS.glob("*.yaml")),
    ]:
        run("kubectl", "--kubeconfig", kube.kubeconfig, "apply", "--server-side", "-f", str(crd))
    run("kubectl", "--kubeconfig", kube.kubeconfig, "wait", "--for=condition=Established", "--timeout=60s",
        *(f"crd/{kind}s.dbq.dev" for kind in CRD_KINDS), "crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com")  # fmt: skip
    for ns in ("dbq-system", "shop", "billing"):
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        run("kubectl", "--kubeconfig", kube.kubeconfig, "apply", "-f", "-", stdin=json.dumps(namespace))
    return str(kube.kubeconfig)


def dry_run(kubeconfig: str, manifests: str) -> list[str]:
    out = run("kubectl", "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=manifests)
    return [line for line in out.splitlines() if line.endswith("(server dry run)")]


@pytest.mark.kube
@pytest.mark.parametrize("mode", CHART_VALUES)
def test_chart_renderings_are_accepted_by_the_api_server(mode, api_server):
    rendered = helm_template(*CHART_VALUES[mode])
    accepted = dry_run(api_server, rendered)
    assert len(accepted) == sum(1 for d in yaml.safe_load_all(rendered) if d)


@pytest.mark.kube
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_overlays_are_accepted_by_the_api_server(overlay, api_server):
    built = kustomize(overlay)
    assert len(dry_run(api_server, built)) == sum(1 for d in yaml.safe_load_all(built) if d)


@pytest.mark.parametrize(
    "broken",
    [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicaz": 1}},
        {"apiVersion": "dbq.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "x"}, "spec": {"ring": {"size": "big"}}},
        {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "x"}, "spec": {"groups": "no"}},
    ],
    ids=["kubernetes-kind", "queue", "prometheus-rule"],
)  # fmt: skip
def test_the_offline_schemas_refuse_a_broken_object(broken, schemas):
    """The validation above can fail: each schema source refuses an object that breaks it."""
    done = kubeconform(json.dumps(broken), schemas)
    assert done.returncode == 1 and json.loads(done.stdout)["summary"]["invalid"] == 1, done.stdout
