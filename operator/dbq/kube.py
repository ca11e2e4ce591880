"""Every Kubernetes API call dbq makes outside kopf's own watching: credentials, the current
namespace, a Queue resource and its Secret, and the one status write that cannot wait for the
end of a kopf handler (a Queue's first conditions).

Errors come back in dbq's family: a missing object is None (for Secrets) or `QueueNotFound`
(for Queues), any other refusal `KubernetesUnavailable`, with the namespace and name looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from dbq.api.models import GROUP, PLURAL, VERSION
from dbq.errors import KubernetesUnavailable, QueueNotFound

API_CONNECTIONS = 32


def load_config() -> None:
    """In-cluster credentials when running in a pod, else the user's kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


def current_namespace() -> str:
    """The namespace of the kubeconfig's current context (or the pod's), else "default"."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        pass
    try:
        _, context = config.list_kube_config_contexts()
        return str(context.get("context", {}).get("namespace") or "default")
    except config.ConfigException:
        return "default"


def _failed(e: ApiException, what: str, verb: str = "read") -> KubernetesUnavailable:
    return KubernetesUnavailable(f"cannot {verb} {what}: HTTP {e.status} {e.reason or ''}".rstrip())


class Kube:
    """The API calls, on one API client (the default configuration's when none is given)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        if api_client is None:
            load_config()
            configuration = client.Configuration.get_default_copy()
            # Handlers and ticks call from many threads: a connection each, none thrown away.
            configuration.connection_pool_maxsize = API_CONNECTIONS
            api_client = client.ApiClient(configuration)
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def for_kubeconfig(cls, path: str = "") -> Kube:
        """With the credentials of the kubeconfig at `path`; with the default ones when empty."""
        return cls(config.new_client_from_config(config_file=path) if path else None)

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret's base64 `data`, or None when it does not exist."""
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _failed(e, f"Secret {namespace}/{name}") from None
        return dict(secret.data or {})

    def write_secret(
        self, namespace: str, name: str, string_data: dict[str, str], owner: Mapping[str, Any]
    ) -> None:
        """Create the Secret, or replace its data, owned by `owner` (one of dbq's resources: the
        garbage collector deletes the Secret with it)."""
        meta = owner["metadata"]
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "dbq"},
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "stringData": string_data,
        }
        try:
            try:
                self.core.create_namespaced_secret(namespace, body)  # type: ignore[arg-type]  # a dict serialises as the V1Secret
            except ApiException as e:
                if e.status != 409:
                    raise
                self.core.patch_namespaced_secret(name, namespace, {"stringData": string_data})
        except ApiException as e:
            raise _failed(e, f"Secret {namespace}/{name}", verb="write") from None

    def get_queue(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.find(PLURAL, namespace, name)
        if found is None:
            raise QueueNotFound(
                f"no Queue {name} in namespace {namespace}: `kubectl get queues -A` lists them;"
                " pass -n NAMESPACE, or --url to name the database"
            )
        return found

    def list_queues(
        self, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[dict[str, Any]]:
        """The Queues of one namespace, or of every namespace these credentials may list."""
        return self.list_resources(PLURAL, namespace, label_selector, field_selector)

    def list_resources(self, plural: str, namespace: str | None = None, label_selector: str = "",
                       field_selector: str = "") -> list[dict[str, Any]]:  # fmt: skip
        """dbq's resources of one kind (`plural`: queues, topics, subscriptions), of one namespace
        or of every namespace these credentials may list; none when the kind's CRD is not
        installed (a cluster that has only Queues). `field_selector` may name metadata.name and
        the CRD's selectableFields."""
        try:
            if namespace:
                found = self.custom.list_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    label_selector=label_selector,
                    field_selector=field_selector,
                )
            else:
                found = self.custom.list_cluster_custom_object(
                    GROUP, VERSION, plural, label_selector=label_selector, field_selector=field_selector
                )
        except ApiException as e:
            if e.status == 404:
                return []
            where = f"namespace {namespace}" if namespace else "every namespace"
            raise _failed(e, f"the {plural} of {where}") from None
        return list(cast(dict[str, Any], found)["items"])

    def patch_queue_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A JSON merge patch of the Queue's status subresource."""
        self.patch_status(PLURAL, namespace, name, status)

    def find(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One of dbq's resources (`plural`: queues, topics, subscriptions), or None when it does
        not exist."""
        return self.find_object(f"{GROUP}/{VERSION}", plural, namespace, name)

    def patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A JSON merge patch of the status subresource of one of dbq's resources; a resource
        deleted meanwhile is left alone."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, {"status": status}
            )
        except ApiException as e:
            if e.status == 404:
                return
            raise _failed(e, f"the status of {plural} {namespace}/{name}", verb="write") from None

    # --- objects of other groups: what a QueueConsumer writes and reads (KEDA's, the workload) ---
    def read_workload(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """A Deployment or StatefulSet, or None when it does not exist."""
        apps = client.AppsV1Api(self.api_client)
        read = apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_stateful_set
        try:
            found = read(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _failed(e, f"{kind} {namespace}/{name}") from None
        return cast(dict[str, Any], self.api_client.sanitize_for_serialization(found))

    def read_hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = client.AutoscalingV2Api(self.api_client).read_namespaced_horizontal_pod_autoscaler(
                name, namespace
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise _failed(e, f"HorizontalPodAutoscaler {namespace}/{name}") from None
        return cast(dict[str, Any], self.api_client.sanitize_for_serialization(found))

    def count_active_jobs(self, namespace: str, label_selector: str) -> int:
        """The Jobs with these labels that run now."""
        try:
            jobs = client.BatchV1Api(self.api_client).list_namespaced_job(
                namespace, label_selector=label_selector
            )
        except ApiException as e:
            raise _failed(e, f"the Jobs {label_selector} of namespace {namespace}") from None
        return sum(1 for job in jobs.items if job.status is not None and (job.status.active or 0) > 0)

    def list_objects(self, api_version: str, plural: str, namespace: str) -> list[dict[str, Any]] | None:
        """The objects of a custom kind in one namespace; None when the cluster does not serve the kind."""
        group, version = api_version.split("/")
        try:
            found = self.custom.list_namespaced_custom_object(group, version, namespace, plural)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _failed(e, f"the {plural}.{group} of namespace {namespace}") from None
        return list(cast(dict[str, Any], found)["items"])

    def find_object(self, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A custom object, or None when it is not there (or the cluster does not serve its kind)."""
        group, version = api_version.split("/")
        try:
            found = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise _failed(e, f"{plural}.{group} {namespace}/{name}") from None
        return cast(dict[str, Any], found)

    def write_object(self, plural: str, body: dict[str, Any]) -> str:
        """Create a custom object, or merge its labels, owners and spec into the one there:
        "created", "changed" or "unchanged" (the one there already holds every field given); or
        "foreign", changing nothing, when the one there is not owned by the body's owner."""
        group, version = body["apiVersion"].split("/")
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            try:
                found = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
            except ApiException as e:
                if e.status != 404:
                    raise
                self.custom.create_namespaced_custom_object(group, version, namespace, plural, body)
                return "created"
            existing = cast(dict[str, Any], found)
            owners = {ref["uid"] for ref in meta.get("ownerReferences") or []}
            theirs = {ref.get("uid") for ref in existing.get("metadata", {}).get("ownerReferences") or []}
            if owners and not owners & theirs:
                return "foreign"
            wanted = {"metadata": {"labels": meta.get("labels"), "ownerReferences": meta.get("ownerReferences")},
                      "spec": body["spec"]}  # fmt: skip
            if _holds(existing, wanted):
                return "unchanged"
            # A merge patch replaces lists whole (triggers, queues): the spec given is the spec kept.
            self.custom.patch_namespaced_custom_object(group, version, namespace, plural, name, wanted)
            return "changed"
        except ApiException as e:
            raise _failed(e, f"{plural}.{group} {namespace}/{name}", verb="write") from None

    def delete_object(self, api_version: str, plural: str, namespace: str, name: str) -> bool:
        """Delete a custom object; False when it was not there."""
        group, version = api_version.split("/")
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise _failed(e, f"{plural}.{group} {namespace}/{name}", verb="delete") from None
        return True


def _holds(existing: Any, wanted: Any) -> bool:
    """Whether `existing` has every field of `wanted` with its value (lists element by element);
    what the API server added (defaults, status) does not count."""
    if isinstance(wanted, dict):
        return isinstance(existing, dict) and all(_holds(existing.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(existing, list) and len(existing) == len(wanted)
                and all(_holds(e, w) for e, w in zip(existing, wanted, strict=True)))  # fmt: skip
    return bool(existing == wanted)
