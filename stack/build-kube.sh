#!/usr/bin/env bash
# Builds kube-apiserver and etcd, and for the single-node cluster (`dbq dev up cluster`) kubelet,
# kube-scheduler, kube-controller-manager and the pod sandbox's pause, from Go modules (no release
# download), and caches them under $DBQ_CACHE/bin. Idempotent: does nothing when all exist.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.33.13}
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
bin=$cache/bin
here=$(cd "$(dirname "$0")" && pwd)
commands=(kube-apiserver etcd kubelet kube-scheduler kube-controller-manager pause)
missing=()
for c in "${commands[@]}"; do [[ -x $bin/$c-$KUBE_VERSION ]] || missing+=("$c"); done
if ((${#missing[@]} == 0)); then
  echo "kube: cached ${commands[*]} ($KUBE_VERSION) in $bin"
  exit 0
fi
mkdir -p "$bin"
work=$cache/build/kube-$KUBE_VERSION
rm -rf "$work"; mkdir -p "$work"
cp -r "$here/kube/cmd" "$work/"
cd "$work"
staging=${KUBE_VERSION/#v1./v0.}
upstream_mod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
  echo "module dbq.dev/localkube"
  echo
  echo "go 1.24.0"
  echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo
  echo "replace ("
  # k8s.io/kubernetes points each staging module at its own tree; pin each to the published tag instead.
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$upstream_mod"
  echo ")"
} > go.mod
echo "kube: resolving modules for $KUBE_VERSION (staging $staging)"
go mod tidy >/dev/null
echo "kube: building ${missing[*]} (a few minutes the first time)"
# The version the components report (a node's kubelet version, `kubectl version`).
version="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitTreeState=clean"
for c in "${missing[@]}"; do
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $version" -o "$bin/$c-$KUBE_VERSION.tmp" "./cmd/$c"
  mv "$bin/$c-$KUBE_VERSION.tmp" "$bin/$c-$KUBE_VERSION"
done
echo "kube: built ${missing[*]} in $bin"
