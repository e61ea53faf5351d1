"""``LocalCluster``: the local Kubernetes cluster of ``make run`` and ``stopic local up``.

The real control plane (:class:`~.controlplane.ControlPlane`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler of the pinned release), one node run by our kubelet
(:class:`~.nodekubelet.NodeKubelet`, node :data:`NODE_NAME`) and the claim provisioner
(:class:`~.provisioner.ClaimProvisioner`), all in one data directory and on loopback only.
See ``docs/localcluster.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from types import TracebackType

from .controlplane import ControlPlane, kube_binary
from .datadir import DataDirLock
from .nodekubelet import NodeKubelet
from .provisioner import ClaimProvisioner
from .restclient import client_from_kubeconfig

log = logging.getLogger(__name__)

NODE_NAME = "local"
KUBECONFIG_FILE = "kubeconfig"
KUBECTL = Path("bin") / "kubectl"
"""``DIR/bin/kubectl``: a link to the multi-call binary, so ``kubectl`` is the pinned release's
(the client that matches the server) once ``DIR/bin`` leads ``PATH``."""


class LocalCluster:
    """The real control plane with one node in ``data_dir``.

    ``async with LocalCluster(tmp_path) as cluster:`` returns once the API server is ready and
    (with ``kubelet=True``) the node ``local`` is registered and watching its Pods. It writes
    ``cluster.kubeconfig`` (``DIR/kubeconfig``: the cluster's admin, ``system:masters``) and
    ``DIR/bin/kubectl``; objects survive a restart on the same directory with their
    resourceVersions and UIDs. ``api_port`` fixes the API server's port (0: a free one).

    The control plane takes the directory's lock first (``datadir.DataDirLock``): ``start()``
    raises ``datadir.DataDirInUse``, having written nothing, while another one holds it, and
    ``stop()`` releases it last. ``stop_grace`` caps the grace period of the Pods the kubelet
    kills on ``stop()`` (``None``: the kubelet's default).
    """

    def __init__(
        self,
        data_dir: Path | str,
        api_port: int = 0,
        kubelet: bool = True,
        stop_grace: float | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.plane = ControlPlane(self.data_dir, api_port=api_port)
        self.want_kubelet = kubelet
        self.stop_grace = stop_grace
        self.kubelet: NodeKubelet | None = None
        self.provisioner: ClaimProvisioner | None = None
        self._started = False

    @property
    def lock(self) -> DataDirLock:
        """The data directory's lock (held by the control plane)."""
        return self.plane.lock

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` while running."""
        return self.plane.url

    @property
    def kubeconfig(self) -> Path:
        return self.data_dir / KUBECONFIG_FILE

    @property
    def kubectl(self) -> Path:
        """``DIR/bin/kubectl``, the pinned release's kubectl (written at start)."""
        return self.data_dir / KUBECTL

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the control plane's components and of the running Pods' containers."""
        pids = dict(self.plane.pids)
        if self.kubelet is not None:
            for worker in self.kubelet.agent.workers.values():
                for name, container in worker.containers.items():
                    pid = container.pid
                    if pid:
                        pids[f"{worker.namespace}/{worker.name}/{name}"] = pid
        return pids

    async def __aenter__(self) -> LocalCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        await self.plane.start()
        self._started = True
        try:
            await self._start_node()
        except BaseException:
            await self.stop()
            raise
        log.info("local cluster serving on %s (kubeconfig %s)", self.url, self.kubeconfig)

    async def _start_node(self) -> None:
        binary = await asyncio.to_thread(kube_binary)
        _write_private_copy(self.plane.kubeconfig, self.kubeconfig)
        _link(binary, self.kubectl)
        self.provisioner = ClaimProvisioner(
            client_from_kubeconfig(self.plane.kubeconfig), self.data_dir, NODE_NAME
        )
        await self.provisioner.start()
        if self.want_kubelet:
            knobs = {} if self.stop_grace is None else {"stop_grace": self.stop_grace}
            self.kubelet = NodeKubelet.for_control_plane(
                self.plane, self.data_dir, NODE_NAME, **knobs
            )
            await self.kubelet.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        try:
            if self.kubelet is not None:
                try:
                    await self.kubelet.stop()
                finally:
                    self.kubelet = None
            if self.provisioner is not None:
                try:
                    await self.provisioner.stop()
                    await self.provisioner.client.close()
                finally:
                    self.provisioner = None
        finally:
            await self.plane.stop()


def _write_private_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.touch(mode=0o600)
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)


def _link(binary: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(binary)
    tmp.replace(link)
