"""Connecting to the Kubernetes API (kubernetes_asyncio), for every edge that does.

In a pod: the ServiceAccount's in-cluster credentials. Elsewhere: the kubeconfig named, or
``$KUBECONFIG``, or ``~/.kube/config``. The operator, the brokers' load reporter and the CLI
all connect the same way, so they behave the same under the embedded control plane and in a
real cluster. A kubeconfig that is missing or not valid is a :class:`KubeconfigError` that says
which file and what is wrong with it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

DEFAULT_KUBECONFIG = "~/.kube/config"


class KubeconfigError(Exception):
    """No in-cluster credentials and no usable kubeconfig."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _any_file(kubeconfig: str) -> bool:
    """Does one of the files of ``kubeconfig`` (a ``KUBECONFIG``-style list) exist? The client
    library only logs a warning when none does, then fails with "Invalid kube-config file"."""
    return any(Path(p).expanduser().is_file() for p in kubeconfig.split(os.pathsep) if p)


async def configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    config = k8s.Configuration()
    if kubeconfig is None:
        try:
            k8s_config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
            return config
        except k8s_config.ConfigException:
            pass
        kubeconfig = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
        if not _any_file(kubeconfig):
            raise KubeconfigError(
                f"no kubeconfig: not running in a cluster and {kubeconfig} does not exist; "
                "pass --kubeconfig or set KUBECONFIG"
            )
    elif not _any_file(kubeconfig):
        raise KubeconfigError(
            f"kubeconfig {kubeconfig}: no such file; pass --kubeconfig or set KUBECONFIG"
        )
    try:
        await k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise KubeconfigError(f"kubeconfig {kubeconfig} is not valid YAML{where}") from None
    except (TypeError, AttributeError):
        raise KubeconfigError(
            f"kubeconfig {kubeconfig} is not a kubeconfig (a YAML mapping with clusters, "
            "contexts, users and current-context)"
        ) from None
    except (k8s_config.ConfigException, ValueError, KeyError, OSError) as exc:
        detail = _one_line(exc).removeprefix("Invalid kube-config file. ")
        raise KubeconfigError(f"kubeconfig {kubeconfig} is not valid: {detail}") from None
    return config


async def api_client(kubeconfig: str | None = None) -> k8s.ApiClient:
    return k8s.ApiClient(await configuration(kubeconfig))
