#!/usr/bin/env bash
# Builds kube-apiserver and etcd from Go modules (no release download) and
# caches them under $DBQ_CACHE/bin. Idempotent: does nothing when both exist.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.33.13}
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
bin=$cache/bin
here=$(cd "$(dirname "$0")" && pwd)
apiserver=$bin/kube-apiserver-$KUBE_VERSION
etcd=$bin/etcd-$KUBE_VERSION
if [[ -x $apiserver && -x $etcd ]]; then
  echo "kube: cached $apiserver $etcd"
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
echo "kube: building (a few minutes the first time)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$apiserver.tmp" ./cmd/kube-apiserver
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$etcd.tmp" ./cmd/etcd
mv "$apiserver.tmp" "$apiserver"; mv "$etcd.tmp" "$etcd"
echo "kube: built $apiserver $etcd"
