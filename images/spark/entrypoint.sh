#!/usr/bin/env bash
# Entrypoint of the dbq Spark image on Spark on Kubernetes. `spark-submit --deploy-mode cluster`
# starts the driver pod with `driver ARGS...`; the driver starts each executor pod with `executor`
# and tells it what it needs in SPARK_* variables. Any other command runs as given (spark-submit,
# dbq, python).
set -euo pipefail
case "${1:-}" in
  driver)
    shift
    # Inside its pod the driver runs the application in client mode, on the pod's address.
    exec "$SPARK_HOME/bin/spark-submit" --deploy-mode client \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?set by Spark from the pod address}" "$@"
    ;;
  executor)
    shift
    # The driver's JVM options for executors arrive numbered: SPARK_JAVA_OPT_0, _1, ...
    options=()
    for name in $(compgen -e | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n); do options+=("${!name}"); done
    exec java -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" "${options[@]}" \
      -cp "${SPARK_CONF_DIR:-$SPARK_HOME/conf}:$SPARK_HOME/jars/*" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" --podName "$SPARK_EXECUTOR_POD_NAME" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
