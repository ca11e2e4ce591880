#!/usr/bin/env bash
# Builds the packaging tools from Go modules (no release download) into $DBQ_CACHE/bin, each
# once per version: helm, kubeconform, helm-unittest (`untt`, built inside its module because its
# replace directive blocks `go install`) and `kstatus` (stack/kstatus: the kstatus library Flux
# uses, as a command), and CoreDNS (the single-node cluster's DNS). Also unpacks the Prometheus Operator's CRDs from its Go module, so the
# chart's ServiceMonitor and PrometheusRule are checked against their real schemas.
set -euo pipefail
HELM_VERSION=${HELM_VERSION:-v3.22.0}
KUBECONFORM_VERSION=${KUBECONFORM_VERSION:-v0.8.0}
HELM_UNITTEST_VERSION=${HELM_UNITTEST_VERSION:-v1.1.2}
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
bin=$cache/bin
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# build NAME VERSION COMMAND...: run COMMAND (which writes $out) unless NAME-VERSION is there.
build() {
  local name=$1 version=$2; shift 2
  out=$bin/$name-$version
  if [[ -x $out ]]; then echo "$name: cached $out"; else
    echo "$name: building $version"
    "$@"
    mv "$out.tmp" "$out"
  fi
  ln -sf "$out" "$bin/$name"
}
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

install_to() {  # install_to PACKAGE@VERSION BINARY-NAME
  local gobin; gobin=$(mktemp -d)
  GOBIN=$gobin go install -trimpath -ldflags "-s -w" "$1"
  mv "$gobin/$2" "$out.tmp"; rm -rf "$gobin"
}
build_unittest() {
  local src; src=$(module_dir "github.com/helm-unittest/helm-unittest@$HELM_UNITTEST_VERSION")
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$out.tmp" ./cmd/helm-unittest)
}
build_kstatus() {
  (cd "$here/kstatus" && go build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
}

build helm "$HELM_VERSION" install_to "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" helm
build kubeconform "$KUBECONFORM_VERSION" install_to "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" kubeconform
build untt "$HELM_UNITTEST_VERSION" build_unittest
build coredns "$COREDNS_VERSION" install_to "github.com/coredns/coredns@$COREDNS_VERSION" coredns
build kstatus "$(cd "$here/kstatus" && sha256sum main.go go.mod go.sum | sha256sum | cut -c1-12)" build_kstatus  # by content, wherever the checkout is

crds=$cache/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION
if [[ ! -d $crds ]]; then
  src=$(module_dir "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
  mkdir -p "$crds.tmp"
  cp "$src"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml "$crds.tmp/"
  chmod -R u+w "$crds.tmp"; mv "$crds.tmp" "$crds"
fi
ln -sfn "$crds" "$cache/prometheus-operator-crds"
echo "prometheus-operator CRDs: $crds"
