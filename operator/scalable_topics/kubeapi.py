"""Connecting to the Kubernetes API (kubernetes_asyncio), for every edge that does.

In a pod: the ServiceAccount's in-cluster credentials. Elsewhere: the kubeconfig named, or
``$KUBECONFIG``, or ``~/.kube/config``. The operator, the brokers' load reporter and the CLI
all connect the same way, so they behave the same under the embedded control plane and in a
real cluster.
"""

from __future__ import annotations

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config


class KubeconfigError(Exception):
    """No in-cluster credentials and no usable kubeconfig."""


async def configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    config = k8s.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
            return config
        except k8s_config.ConfigException:
            pass
    try:
        await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    except (k8s_config.ConfigException, FileNotFoundError, TypeError) as exc:
        raise KubeconfigError(
            f"no in-cluster credentials and no usable kubeconfig ({exc}); "
            "pass --kubeconfig or set KUBECONFIG"
        ) from None
    return config


async def api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    return k8s.ApiClient(await configuration(kubeconfig))
