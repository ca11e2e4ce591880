#!/usr/bin/env bash
# Builds dbq's images on this machine, which reaches no image registry: a Debian bookworm base
# image made from Debian's packages by mmdebstrap (python3, python3-venv, apt), then a Dockerfile
# built by buildah against it (--build-arg BASE=...). Prints the image's name and size.
# Idempotent: the base is made once; an image is rebuilt only when its inputs (its Dockerfile,
# constraints.txt, pyproject.toml, operator/dbq, images/) changed.
#
#   bash stack/image.sh          the operator image (Dockerfile)
#   bash stack/image.sh spark    the Spark image of dbq's jobs (images/spark/Dockerfile)
#   bash stack/image.sh --lock   rewrite constraints.txt from a fresh resolution of pyproject.toml
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
mkdir -p "$cache"; exec 9>"$cache/image.lock"; flock 9  # one build at a time (tests run in parallel)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml")
base=localhost/dbq-base:bookworm
case ${1:-operator} in
  operator) image=localhost/dbq-operator:$version dockerfile=Dockerfile ;;
  spark) image=localhost/dbq-spark:$version dockerfile=images/spark/Dockerfile ;;
  --lock) ;;
  *) echo "usage: bash stack/image.sh [operator|spark|--lock]" >&2; exit 2 ;;
esac

if [[ ${1:-} == --lock ]]; then
  venv=$(mktemp -d)
  python3 -m venv "$venv" && "$venv/bin/pip" install -q "$repo[operator]"
  { echo "# The operator image's pinned dependencies (Dockerfile: pip install -c constraints.txt)."
    echo "# Regenerate with: bash stack/image.sh --lock"
    "$venv/bin/pip" freeze --exclude dbq-operator; } > "$repo/constraints.txt"
  rm -rf "$venv"; echo "wrote constraints.txt"; exit 0
fi

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  echo "image: making $base with mmdebstrap"
  work=$(mktemp -d "$cache/base.XXXX")
  # merged /usr by mmdebstrap's hook, not by the usrmerge package (which pulls in perl, ~50 MB)
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    bookworm "$work/rootfs.tar" http://deb.debian.org/debian > "$work/mmdebstrap.log" 2>&1 \
    || { tail -40 "$work/mmdebstrap.log"; exit 1; }
  ctr=$(buildah from scratch)
  tar -C "$(buildah mount "$ctr")" -xf "$work/rootfs.tar"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash --label org.opencontainers.image.description="Debian bookworm with python3, by mmdebstrap" "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
  rm -rf "$work"
fi

inputs=$(cd "$repo" && git ls-files -s "$dockerfile" .dockerignore constraints.txt pyproject.toml README.md operator/dbq \
  images | sha256sum | cut -c1-16)
if [[ $(buildah inspect --type image --format '{{index .ImageAnnotations "dev.dbq.inputs"}}' "$image" 2>/dev/null) == "$inputs" ]]; then
  echo "image: $image is up to date"
else
  echo "image: building $image from $dockerfile (BASE=$base)"
  source_url=$(git -C "$repo" remote get-url origin 2>/dev/null || true)
  # Build steps see the host's CA bundle and pip settings: where egress goes through a TLS proxy
  # with its own CA (as on this machine), pip inside the build trusts what pip outside trusts.
  trust=()
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do [[ -f $f ]] && trust+=(--volume "$f:$f:ro"); done
  buildah build --quiet --pull=false --network=host --layers=false "${trust[@]}" \
    --build-arg BASE="$base" --build-arg VERSION="$version" --build-arg SOURCE="$source_url" \
    --annotation dev.dbq.inputs="$inputs" -f "$repo/$dockerfile" -t "$image" "$repo" >/dev/null
  buildah rmi --prune >/dev/null 2>&1 || true
fi
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$image"
