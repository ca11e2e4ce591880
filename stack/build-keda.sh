#!/usr/bin/env bash
# Builds KEDA's operator, metrics adapter and admission webhooks from the Go module
# github.com/kedacore/keda/v2 into $DBQ_CACHE/bin (once per version) and copies its CRDs into
# $DBQ_CACHE/keda-crds-<version>. The version is the newest this machine's Go proxy serves and its
# Go builds. `go install ...@version` is refused (its go.mod has a replace directive): the
# binaries are built from a writable copy of the module's download.
set -euo pipefail
KEDA_VERSION=${KEDA_VERSION:-v2.21.0}
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
bin=$cache/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"

src=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
missing=()
for cmd in operator adapter webhooks; do
  [[ -x $bin/keda-$cmd-$KEDA_VERSION ]] || missing+=("$cmd")
done
if (( ${#missing[@]} )); then
  echo "keda: building ${missing[*]} $KEDA_VERSION"
  began=$SECONDS
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r "$src/." "$work"
  chmod -R u+w "$work"
  for cmd in "${missing[@]}"; do
    (cd "$work" && go build -trimpath -ldflags "-s -w" -o "$bin/keda-$cmd-$KEDA_VERSION.tmp" "./cmd/$cmd")
    mv "$bin/keda-$cmd-$KEDA_VERSION.tmp" "$bin/keda-$cmd-$KEDA_VERSION"
  done
  echo "keda: built in $((SECONDS - began)) s"
else
  echo "keda: cached $bin/keda-*-$KEDA_VERSION"
fi

crds=$cache/keda-crds-$KEDA_VERSION
if [[ ! -d $crds ]]; then
  mkdir -p "$crds.tmp"
  cp "$src"/config/crd/bases/*.yaml "$crds.tmp/"
  chmod -R u+w "$crds.tmp"; mv "$crds.tmp" "$crds"
fi
echo "keda CRDs in $crds"
webhooks=$cache/keda-webhooks-$KEDA_VERSION.yaml  # KEDA's ValidatingWebhookConfiguration
[[ -f $webhooks ]] || { cp "$src/config/webhooks/validation_webhooks.yaml" "$webhooks.tmp"; chmod u+w "$webhooks.tmp"; mv "$webhooks.tmp" "$webhooks"; }
