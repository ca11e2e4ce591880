#!/usr/bin/env bash
# Installs everything dbq's local stack and tests need, idempotently; fast when already done.
#   Debian: PostgreSQL server, unixODBC, psqlODBC, Java 17, openssl, Lua 5.1 (Argo CD's health
#           check), mmdebstrap, buildah and runc (the operator image: stack/image.sh, test_image.py),
#           containerd, the CNI plugins and iptables (the single-node cluster: `dbq dev up cluster`),
#           Chromium and ChromeDriver (the docs site's browser check: tests/test_docs_site.py)
#   Python: a virtualenv at $DBQ_CACHE/venv with dbq (editable) and its dev extras
#   Go:     kube-apiserver, etcd, kubelet, kube-scheduler, kube-controller-manager and pause
#           built from Go modules                           (stack/build-kube.sh)
#           helm, kubeconform, helm-unittest, kstatus, CoreDNS (stack/build-tools.sh)
#           Flux's source-, kustomize- and helm-controller and their CRDs (stack/build-flux.sh)
#           KEDA's operator, metrics adapter and webhooks and their CRDs (stack/build-keda.sh)
#   Maven:  Cassandra jars from Maven Central               (stack/cassandra/pom.xml)
#   npm:    node-postgres for the row-contract worker       (tests/node/package-lock.json)
#   crates: PGMQ's Rust client, built into the facade's scenario (tests/rust/Cargo.lock)
# Prints where the virtualenv is; everything else is cached under $DBQ_CACHE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
export DBQ_CACHE=$cache
mkdir -p "$cache"
CASSANDRA_VERSION=${CASSANDRA_VERSION:-5.0.9}
step() { printf '\n== %s\n' "$*"; }

step "Debian packages"
need=()
for pkg in postgresql unixodbc odbc-postgresql tdsodbc openjdk-17-jre-headless openssl lua5.1 mmdebstrap buildah runc \
    containerd containernetworking-plugins iptables chromium chromium-driver; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
if ((${#need[@]})); then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
else
  echo "all present"
fi
# FreeTDS speaks SQL Server's protocol: the driver dbq uses for SQL Server when Microsoft's is absent.
odbcinst -q -d -n FreeTDS >/dev/null 2>&1 \
  || printf '[FreeTDS]\nDescription=FreeTDS ODBC driver for SQL Server\nDriver=libtdsodbc.so\n' | odbcinst -i -d -r >/dev/null
# dbq's stand-in for the pgmq extension (stack/postgres/pgmq.control): PGMQ's clients create it when
# they start. Copied into each installed PostgreSQL's extension directory when it differs.
for ext in /usr/share/postgresql/*/extension; do
  for f in pgmq.control pgmq--1.13.0.sql; do
    cmp -s "$here/postgres/$f" "$ext/$f" || $sudo install -m 644 "$here/postgres/$f" "$ext/$f"
  done
done

step "Python virtualenv"
venv=$cache/venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
stamp=$venv/.dbq-stamp
want="$(sha256sum "$repo/pyproject.toml" | cut -c1-16) $repo"
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -e "$repo[dev]"
  echo "$want" > "$stamp"
else
  echo "up to date ($venv)"
fi

step "kube-apiserver and etcd (Go modules)"
bash "$here/build-kube.sh"

step "helm, kubeconform, helm-unittest, kstatus, CoreDNS (Go modules)"
bash "$here/build-tools.sh"

step "Flux: source-, kustomize- and helm-controller (Go modules)"
bash "$here/build-flux.sh"

step "KEDA: operator, metrics adapter, webhooks (Go modules)"
bash "$here/build-keda.sh"

step "Cassandra $CASSANDRA_VERSION (Maven Central)"
lib=$cache/cassandra-$CASSANDRA_VERSION/lib
if [[ ! -f $lib/cassandra-all-$CASSANDRA_VERSION.jar ]]; then
  mvn -q -B -f "$here/cassandra/pom.xml" -Dcassandra.version="$CASSANDRA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib.tmp"
  rm -rf "$lib"; mv "$lib.tmp" "$lib"
fi
echo "jars in $lib ($(ls "$lib" | wc -l))"

step "node-postgres (npm): the row-contract worker's driver"
node_dir=$cache/node
want=$(sha256sum "$repo/tests/node/package-lock.json" | cut -c1-16)
if [[ ! -f $node_dir/.dbq-stamp || $(cat "$node_dir/.dbq-stamp") != "$want" ]]; then
  rm -rf "$node_dir"; mkdir -p "$node_dir"
  cp "$repo/tests/node/package.json" "$repo/tests/node/package-lock.json" "$node_dir/"
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" > "$node_dir/.dbq-stamp"
fi
echo "node modules in $node_dir/node_modules"

step "pgmq (crates.io): PGMQ's Rust client in the facade's scenario"
# cargo builds only what changed: a few minutes cold, seconds warm.
CARGO_TARGET_DIR=$cache/cargo-target cargo build --release --locked --quiet --manifest-path "$repo/tests/rust/Cargo.toml"
echo "scenario at $cache/cargo-target/release/pgmq-scenario"

step "done"
echo "virtualenv: $venv   (source $venv/bin/activate)"
