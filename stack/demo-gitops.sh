#!/usr/bin/env bash
# GitOps on the local stack: Flux (source- and kustomize-controller, `dbq dev up flux`) applies a
# git repository of Queues, and the operator (run here, as `make demo` does) brings them to
# Ready. The repository, served over smart HTTP on loopback, holds a namespace, a Secret (the
# local database's URL: a local demo; encrypt real ones, see docs/platform/flux.md) and two
# Queues, one the dead-letter keeper of the other. Prints the Kustomization at the commit and the
# Queues. The operator keeps running afterwards (`kill $(cat $DBQ_STATE/operator-gitops.pid)`).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
state=${DBQ_STATE:-/var/tmp/dbq-$(id -u)}
export PATH=$cache/venv/bin:$cache/bin:$PATH KUBECONFIG=$state/kubeconfig
namespace=shop-gitops
dbq dev up kube postgres flux
kubectl apply -k "$repo/crds"
kubectl wait --for=condition=Established crd/queues.dbq.dev crd/topics.dbq.dev crd/subscriptions.dbq.dev --timeout=60s
pidfile=$state/operator-gitops.pid
if ! { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
  nohup dbq run --namespace "$namespace" --liveness http://127.0.0.1:18090/healthz --metrics-port 19091 \
    > "$state/operator-gitops.log" 2>&1 &
  echo $! > "$pidfile"
  echo "operator started (pid $(cat "$pidfile"), log $state/operator-gitops.log)"
fi

# The repository: a bare one on Flux's git server, and a working copy to commit from.
url=$(python -c 'from dbq.devstack import Stack; print(Stack().flux.repository("demo-queues")[1])')
work=$state/flux/demo-queues-work
[[ -d $work ]] || git clone --quiet "$state/flux/git/demo-queues.git" "$work"
mkdir -p "$work/queues"
password=$(cat "$state/postgres/operator-password")  # the operator's login, not the superuser
cat > "$work/queues/namespace.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: $namespace}
EOF
cat > "$work/queues/orders-db.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata: {name: orders-db, namespace: $namespace}
stringData: {url: "postgresql://dbq_operator:${password}@127.0.0.1:${DBQ_PG_PORT:-15432}/postgres"}
EOF
for name in orders-dead orders; do
  dead=""; [[ $name == orders ]] && dead="  deadLetter: {queue: orders-dead, maxAttempts: 5}"
  cat > "$work/queues/$name.yaml" <<EOF
apiVersion: dbq.dev/v1alpha1
kind: Queue
metadata: {name: $name, namespace: $namespace}
spec:
  backend: postgres
  design: ring
  connection: {secretRef: {name: orders-db}, schema: gitops_demo}
  ring: {size: 1024}
$dead
EOF
done
cat > "$work/queues/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [namespace.yaml, orders-db.yaml, orders-dead.yaml, orders.yaml]
EOF
git -C "$work" add -A
git -C "$work" -c user.name="dbq demo" -c user.email=demo@dbq.invalid commit --quiet -m "queues for $namespace" || true
git -C "$work" push --quiet origin HEAD:main
commit=$(git -C "$work" rev-parse HEAD)

kubectl create namespace flux-system --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f - <<EOF
apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: demo-queues, namespace: flux-system}
spec: {url: "$url", ref: {branch: main}, interval: 1m}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: demo-queues, namespace: flux-system}
spec:
  sourceRef: {kind: GitRepository, name: demo-queues}
  path: ./queues
  prune: true
  wait: true
  timeout: 2m
  interval: 10m
  retryInterval: 10s
EOF
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kubectl -n flux-system annotate --overwrite gitrepository/demo-queues kustomization/demo-queues \
  "reconcile.fluxcd.io/requestedAt=$now" > /dev/null
kubectl -n flux-system wait kustomization/demo-queues --timeout=180s \
  --for=jsonpath="{.status.lastAppliedRevision}=main@sha1:$commit"
kubectl -n flux-system wait kustomization/demo-queues --for=condition=Ready --timeout=180s
kubectl -n flux-system get gitrepository,kustomization demo-queues
kubectl -n "$namespace" get dbq
cat <<EOT

Flux applied commit $commit of $url and both Queues are Ready. Try next:
  export KUBECONFIG=$KUBECONFIG PATH=$cache/venv/bin:$cache/bin:\$PATH
  cd $work && edit queues/orders.yaml && git commit -am change && git push origin HEAD:main
  kubectl -n flux-system annotate --overwrite kustomization/demo-queues reconcile.fluxcd.io/requestedAt="\$(date +%s)"
  kubectl -n flux-system get kustomization demo-queues -w
EOT
