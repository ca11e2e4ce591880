#!/usr/bin/env bash
# Builds Flux's source-controller, kustomize-controller and helm-controller from their Go modules
# into $DBQ_CACHE/bin, each once per version, and copies their CRDs into
# $DBQ_CACHE/flux-crds-<versions>. The versions are those of one Flux release (2.9.5), the newest
# whose modules this machine's Go proxy serves and its Go can build.
#
# `go install <controller>@<version>` is refused: each controller's go.mod replaces its own api
# module with ./api, a directory the module's download does not hold. So each is built from a
# writable copy of its download with that replace dropped (its require names the same version).
# source-controller also needs github.com/fluxcd/pkg/artifact pinned to v0.18.0: the v0.18.3 it
# requires is not served here (v0.18.0 to v0.18.2 differ in go.mod and go.sum only).
set -euo pipefail
SOURCE_CONTROLLER_VERSION=${SOURCE_CONTROLLER_VERSION:-v1.9.5}
KUSTOMIZE_CONTROLLER_VERSION=${KUSTOMIZE_CONTROLLER_VERSION:-v1.9.5}
HELM_CONTROLLER_VERSION=${HELM_CONTROLLER_VERSION:-v1.6.4}
ARTIFACT_PIN=${ARTIFACT_PIN:-v0.18.0}
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
bin=$cache/bin
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"

module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# build NAME VERSION [go mod edit ARGS...]: the controller github.com/fluxcd/NAME at VERSION.
build() {
  local name=$1 version=$2; shift 2
  local out=$bin/$name-$version
  if [[ -x $out ]]; then echo "$name: cached $out"; else
    echo "$name: building $version"
    local began=$SECONDS src work
    src=$(module_dir "github.com/fluxcd/$name@$version")
    work=$(mktemp -d)
    cp -r "$src/." "$work"
    chmod -R u+w "$work"
    (
      cd "$work"
      go mod edit -dropreplace "github.com/fluxcd/$name/api" "$@"
      go build -trimpath -ldflags "-s -w" -o "$out.tmp" .
    )
    rm -rf "$work"
    mv "$out.tmp" "$out"
    echo "$name: built in $((SECONDS - began)) s"
  fi
  ln -sf "$out" "$bin/$name"
}

build source-controller "$SOURCE_CONTROLLER_VERSION" \
  -replace "github.com/fluxcd/pkg/artifact=github.com/fluxcd/pkg/artifact@$ARTIFACT_PIN"
build kustomize-controller "$KUSTOMIZE_CONTROLLER_VERSION"
build helm-controller "$HELM_CONTROLLER_VERSION"

crds=$cache/flux-crds-$SOURCE_CONTROLLER_VERSION-$KUSTOMIZE_CONTROLLER_VERSION-$HELM_CONTROLLER_VERSION
if [[ ! -d $crds ]]; then
  mkdir -p "$crds.tmp"
  for module in "source-controller@$SOURCE_CONTROLLER_VERSION" "kustomize-controller@$KUSTOMIZE_CONTROLLER_VERSION" \
                "helm-controller@$HELM_CONTROLLER_VERSION"; do
    cp "$(module_dir "github.com/fluxcd/$module")"/config/crd/bases/*.yaml "$crds.tmp/"
  done
  chmod -R u+w "$crds.tmp"; mv "$crds.tmp" "$crds"
fi
ln -sfn "$crds" "$cache/flux-crds"
echo "flux CRDs: $crds"
