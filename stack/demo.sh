#!/usr/bin/env bash
# The main job on the local stack: bring it up, install the CRD, run the operator, apply the
# example queues, and show them. The operator keeps running in the background afterwards
# (`dbq dev down` does not stop it; `kill $(cat $DBQ_STATE/operator.pid)` does).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/stack/bootstrap.sh"
venv=${DBQ_CACHE:-$HOME/.cache/dbq}/venv
state=${DBQ_STATE:-/var/tmp/dbq-$(id -u)}
export PATH=$venv/bin:$PATH KUBECONFIG=$state/kubeconfig
dbq dev up
kubectl apply -k "$repo/crds"
kubectl wait --for=condition=Established crd/queues.dbq.dev crd/topics.dbq.dev crd/subscriptions.dbq.dev \
  crd/queueusers.dbq.dev --timeout=60s
kubectl create namespace shop --dry-run=client -o yaml | kubectl apply -f -
# The example Secret, pointed at the local PostgreSQL as the operator's login, dbq_operator: no
# superuser, CREATE on the database and dbq's role helper, as a DBA gives them (its password
# never leaves the state dir). Applications get QueueUsers, never this Secret. `ca`: the stack
# CA's certificate, so that every connection is encrypted and the server verified.
password=$(cat "$state/postgres/operator-password")
kubectl -n shop create secret generic orders-db \
  --from-literal=url="postgresql://dbq_operator:${password}@127.0.0.1:${DBQ_PG_PORT:-15432}/postgres" \
  --from-file=ca=<(dbq dev ca) \
  --dry-run=client -o yaml | kubectl apply -f -
pidfile=$state/operator.pid
if ! { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }; then
  nohup dbq run --namespace shop --liveness http://127.0.0.1:18080/healthz --metrics-port 19090 \
    > "$state/operator.log" 2>&1 &
  echo $! > "$pidfile"
  echo "operator started (pid $(cat "$pidfile"), log $state/operator.log, metrics http://127.0.0.1:19090/)"
fi
kubectl apply -f "$repo/manifests/examples/queue-postgres.yaml"
kubectl apply -f "$repo/manifests/examples/queueuser.yaml"
kubectl -n shop wait --for=condition=Ready queue/orders --timeout=120s
kubectl -n shop wait --for=condition=Ready queueuser/orders-producer queueuser/orders-worker --timeout=120s
kubectl get queues,queueusers -A
cat <<EOT

The queue shop/orders is Ready. Try next (after the export):
  export KUBECONFIG=$KUBECONFIG PATH=$venv/bin:\$PATH
  dbq push orders -n shop --user orders-producer hello world   # as a login that may only send
  dbq pop orders -n shop --user orders-worker -c 10            # at-most-once, as the worker's login
  dbq stats orders -n shop --watch 5           # depth, totals and rates every 5 s (Ctrl-C stops)
  kubectl -n shop describe queue orders        # conditions, schedules in words, statistics
  kubectl -n shop get events --field-selector involvedObject.name=orders
  python -c 'from dbq.client import connect_resource; q = connect_resource("orders", "shop", user="orders-worker"); print(q.stats())'
The operator logs to $state/operator.log and serves metrics on http://127.0.0.1:19090/.
EOT
