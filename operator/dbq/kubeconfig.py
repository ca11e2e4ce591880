"""Kubernetes credentials: in-cluster when running in a pod, else the user's kubeconfig."""

from __future__ import annotations

from kubernetes import config


def load() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
