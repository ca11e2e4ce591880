#!/usr/bin/env bash
# The operator as users run it: the single-node cluster, the operator image built here and
# imported into its containerd, `helm install` of charts/dbq-operator, and the example queue Ready
# through the operator's pod (which reaches PostgreSQL at the node's address, 10.244.0.1, as the
# node itself does: the CLI, a local Spark job and the pod share the Secret).
# `dbq dev down` stops the cluster and with it the pod; the release stays in the API server.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
cache=${DBQ_CACHE:-$HOME/.cache/dbq}
state=${DBQ_STATE:-/var/tmp/dbq-$(id -u)}
export PATH=$cache/venv/bin:$cache/bin:$PATH KUBECONFIG=$state/kubeconfig
started=$(date +%s)
dbq dev up kube postgres cluster
bash "$repo/stack/image.sh"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml")
dbq dev import-image "localhost/dbq-operator:$version"
helm upgrade --install dbq-operator "$repo/charts/dbq-operator" --namespace dbq-system --create-namespace --wait --timeout 5m \
  --set image.repository=localhost/dbq-operator --set image.tag="$version" --set image.pullPolicy=Never
kubectl create namespace shop --dry-run=client -o yaml | kubectl apply -f -
password=$(cat "$state/postgres/operator-password")  # the operator's login, not the superuser
kubectl -n shop create secret generic orders-db \
  --from-literal=url="postgresql://dbq_operator:${password}@10.244.0.1:${DBQ_PG_PORT:-15432}/postgres" \
  --from-file=ca=<(dbq dev ca) \
  --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$repo/manifests/examples/queue-postgres.yaml"
kubectl -n shop wait --for=condition=Ready queue/orders --timeout=180s
kubectl -n dbq-system get pods -o wide
kubectl get queues -A
echo "ready in $(( $(date +%s) - started )) s"
cat <<EOT

The operator runs as a pod (helm release dbq-operator in dbq-system) and shop/orders is Ready. Try next:
  export KUBECONFIG=$KUBECONFIG PATH=$cache/venv/bin:$cache/bin:\$PATH
  dbq push orders -n shop hello && dbq pop orders -n shop   # from the node, through the same Secret
  kubectl -n dbq-system get lease dbq-operator                              # which of the two pods leads
  kubectl -n dbq-system logs -l app.kubernetes.io/name=dbq-operator --prefix
  kubectl -n dbq-system delete pod \$(kubectl -n dbq-system get lease dbq-operator -o jsonpath='{.spec.holderIdentity}')
                                                                           # the standby takes over
  helm -n dbq-system uninstall dbq-operator                                        # the Queues stay
EOT
