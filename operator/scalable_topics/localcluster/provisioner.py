"""Volumes for PersistentVolumeClaims on the local cluster: :class:`ClaimProvisioner`.

A real cluster binds a claim to a PersistentVolume that a dynamic provisioner creates (or an
administrator made); until then the scheduler leaves every Pod that uses the claim Pending. The
local cluster has no storage system: our kubelet backs a claim with a directory of the data
directory (``volumes/<namespace>/<claim>``, ``podspec.PodLayout.claim_dir``). This provisioner
does the API side of it, as the ``local-path`` provisioners of kind and k3s do: for each claim
without a volume it creates a ``hostPath`` PersistentVolume of that directory, pre-bound to the
claim (``spec.claimRef``) with the claim's size, access modes and class, and the real
controller-manager's PersistentVolume controller binds them. When a claim is deleted its volume
object goes too; the directory is kept (the reclaim policy is ``Retain``), so a claim made again
under the same name (a StatefulSet's, after a scale down and up) finds its data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import aiohttp

from ..core.jsontypes import JsonObj
from .podspec import PodLayout
from .restclient import PVCS, ApiError, Informer, Resource, RestClient

log = logging.getLogger(__name__)

PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", namespaced=False)
PROVISIONER = "scalable-topics.io/local-claims"
"""Value of the ``pv.kubernetes.io/provisioned-by`` annotation on the volumes it creates."""
DEFAULT_SIZE = "1Gi"


def volume_name(claim: JsonObj) -> str:
    """``pvc-<claim uid>``, as dynamic provisioners name their volumes."""
    return f"pvc-{claim['metadata']['uid']}"


def volume_for(claim: JsonObj, layout: PodLayout, node_name: str) -> JsonObj:
    """The PersistentVolume backing ``claim``: its directory, on ``node_name`` only."""
    meta, spec = claim["metadata"], claim.get("spec") or {}
    namespace, name = meta.get("namespace", "default"), meta["name"]
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage") or DEFAULT_SIZE
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(claim),
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": spec.get("storageClassName") or "",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": name,
                "uid": meta["uid"],
            },
            "hostPath": {"path": str(layout.claim_dir(namespace, name)), "type": ""},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node_name],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


class ClaimProvisioner:
    """Creates a volume for every unbound claim, deletes it with its claim (see the module).

    ``client`` must be allowed to watch claims and create and delete PersistentVolumes in the
    whole cluster (the local cluster gives it the admin credentials, as a control plane
    component). ``created``/``deleted`` count the volumes it created and deleted.
    """

    def __init__(
        self, client: RestClient, data_dir: Path, node_name: str, retry_delay: float = 1.0
    ) -> None:
        self.client = client
        self.layout = PodLayout(Path(data_dir))
        self.node_name = node_name
        self.retry_delay = retry_delay
        self.claims = Informer(client, PVCS)
        self.claims.add_handler(self._on_claim)
        self.created = 0
        self.deleted = 0
        self._queue: asyncio.Queue[tuple[str, JsonObj]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None

    def _on_claim(self, etype: str, claim: JsonObj) -> None:
        self._queue.put_nowait((etype, claim))

    async def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="claim-provisioner")
            self.claims.start()
            await asyncio.wait_for(self.claims.synced.wait(), timeout=60)

    async def stop(self) -> None:
        await self.claims.stop()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    async def _work(self) -> None:
        while True:
            etype, claim = await self._queue.get()
            while True:
                try:
                    await self._sync(etype, claim)
                    break
                except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                    log.warning(
                        "claim %s/%s: %s; retrying",
                        claim["metadata"].get("namespace"),
                        claim["metadata"].get("name"),
                        exc,
                    )
                    await asyncio.sleep(self.retry_delay)

    async def _sync(self, etype: str, claim: JsonObj) -> None:
        meta, spec = claim["metadata"], claim.get("spec") or {}
        name = volume_name(claim)
        if etype == "DELETED":
            volume = await self.client.get_or_none(PERSISTENT_VOLUMES, None, name)
            if volume is not None and _ours(volume):
                with contextlib.suppress(ApiError):
                    await self.client.delete(PERSISTENT_VOLUMES, None, name)
                    self.deleted += 1
            return
        if spec.get("volumeName") or meta.get("deletionTimestamp"):
            return
        if await self.client.get_or_none(PERSISTENT_VOLUMES, None, name) is not None:
            return
        self.layout.claim_dir(meta.get("namespace", "default"), meta["name"]).mkdir(
            parents=True, exist_ok=True
        )
        try:
            await self.client.create(
                PERSISTENT_VOLUMES, None, volume_for(claim, self.layout, self.node_name)
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
            return
        self.created += 1


def _ours(volume: JsonObj) -> bool:
    annotations = (volume.get("metadata") or {}).get("annotations") or {}
    return annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
