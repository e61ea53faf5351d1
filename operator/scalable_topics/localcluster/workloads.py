"""Workload controllers of the embedded cluster (the controller-manager's job, simplified).

* Deployment → Pods named ``<deployment>-<5 chars>`` owned directly by the Deployment (no
  ReplicaSet objects in between). A template change replaces the pods (``Recreate`` waits for the
  old pods to be gone; ``RollingUpdate`` creates the new ones at once).
* StatefulSet → Pods ``<name>-0 … <name>-(n-1)`` with a ``persistentVolumeClaim`` volume per
  ``volumeClaimTemplates`` entry (claim ``<template>-<pod>``; the kubelet backs it with a directory
  that survives the pod). Template changes roll one pod at a time from the highest ordinal.
* Job → Pods until ``completions`` succeeded, failing after ``backoffLimit`` failures.
* CronJob → Jobs on its five-field schedule (:mod:`.cron`), with ``concurrencyPolicy``,
  ``suspend``, history limits and ``startingDeadlineSeconds``.

Every object created carries a controller owner reference so the API server's garbage collector
removes it with its owner. Each controller is level-triggered: one work queue, reconciles keyed by
object, fed by informers on the owners and their Pods/Jobs, plus a periodic resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from .cron import CronError, CronSchedule
from .restclient import (
    CRONJOBS,
    DEPLOYMENTS,
    JOBS,
    PODS,
    PVCS,
    STATEFULSETS,
    ApiError,
    Informer,
    Resource,
    RestClient,
    post_event,
)

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name
Clock = Callable[[], datetime]

_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_EXPECTATION_TTL = 30.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def fmt_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def random_suffix(length: int = 5) -> str:
    return "".join(random.choice(_SUFFIX_ALPHABET) for _ in range(length))


def template_hash(template: JsonObj) -> str:
    """Stable short hash of a pod template (the ``pod-template-hash`` label)."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return "".join(_SUFFIX_ALPHABET[int(digest[i : i + 2], 16) % 27] for i in range(0, 20, 2))


def owner_reference(owner: JsonObj, api_version: str, kind: str) -> JsonObj:
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: JsonObj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def controller_ref(obj: JsonObj) -> JsonObj | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def is_terminating(obj: JsonObj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def pod_phase(pod: JsonObj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_active(pod: JsonObj) -> bool:
    return not is_terminating(pod) and pod_phase(pod) not in ("Succeeded", "Failed")


def ready_since(pod: JsonObj) -> datetime | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime")) or utcnow()
    return None


def is_ready(pod: JsonObj) -> bool:
    return is_active(pod) and ready_since(pod) is not None


def is_available(pod: JsonObj, min_ready_seconds: int, now: datetime) -> bool:
    since = ready_since(pod)
    if not is_active(pod) or since is None:
        return False
    return min_ready_seconds <= 0 or since + timedelta(seconds=min_ready_seconds) <= now


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value)
    if text.endswith("%"):
        scaled = int(text[:-1]) * total / 100
        return int(-(-scaled // 1)) if round_up else int(scaled)
    return int(text)


def merge_condition(
    existing: list[JsonObj], ctype: str, status: bool, reason: str, message: str, now: datetime
) -> JsonObj:
    """A condition keeping its ``lastTransitionTime`` while its status does not change."""
    text = "True" if status else "False"
    previous = next((c for c in existing if c.get("type") == ctype), None)
    since = (
        previous.get("lastTransitionTime")
        if previous is not None and previous.get("status") == text
        else fmt_time(now)
    )
    return {
        "type": ctype,
        "status": text,
        "reason": reason,
        "message": message,
        "lastUpdateTime": since,
        "lastTransitionTime": since,
    }


class Expectations:
    """Pods a controller has created or deleted whose event has not been observed yet.

    Without it, a reconcile running before the informer has seen a create would create again
    (the controller-manager's ``ControllerExpectations``).
    """

    def __init__(self) -> None:
        self._creates: dict[str, dict[str, float]] = {}
        self._deletes: dict[str, dict[str, float]] = {}

    def expect_create(self, owner: str, name: str) -> None:
        self._creates.setdefault(owner, {})[name] = time.monotonic() + _EXPECTATION_TTL

    def expect_delete(self, owner: str, name: str) -> None:
        self._deletes.setdefault(owner, {})[name] = time.monotonic() + _EXPECTATION_TTL

    def pending_creates(self, owner: str, seen: set[str]) -> set[str]:
        now = time.monotonic()
        entries = self._creates.get(owner, {})
        for name in [n for n, deadline in entries.items() if n in seen or deadline < now]:
            del entries[name]
        return set(entries)

    def pending_deletes(self, owner: str, still_live: set[str]) -> set[str]:
        now = time.monotonic()
        entries = self._deletes.get(owner, {})
        for name in [n for n, deadline in entries.items() if n not in still_live or deadline < now]:
            del entries[name]
        return set(entries)

    def forget(self, owner: str) -> None:
        self._creates.pop(owner, None)
        self._deletes.pop(owner, None)


class ControllerManager:
    """Deployment, StatefulSet, Job and CronJob controllers sharing one work queue."""

    def __init__(
        self,
        client: RestClient,
        pods: Informer,
        *,
        clock: Clock | None = None,
        resync_seconds: float = 30.0,
        job_backoff_base: float = 10.0,
        job_backoff_cap: float = 360.0,
    ) -> None:
        self.client = client
        self.job_backoff_base = job_backoff_base
        self.job_backoff_cap = job_backoff_cap
        self.pods = pods
        self.clock: Clock = clock or utcnow
        self.resync_seconds = resync_seconds
        self.informers: dict[str, Informer] = {
            "Deployment": Informer(client, DEPLOYMENTS),
            "StatefulSet": Informer(client, STATEFULSETS),
            "Job": Informer(client, JOBS),
            "CronJob": Informer(client, CRONJOBS),
        }
        self.expectations = Expectations()
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._job_started: dict[str, datetime] = {}
        for kind, informer in self.informers.items():
            informer.add_handler(self._owner_handler(kind))
        self.informers["Job"].add_handler(self._dependent_handler)
        pods.add_handler(self._dependent_handler)

    # -- plumbing --------------------------------------------------------------------------

    def _owner_handler(self, kind: str) -> Callable[[str, JsonObj], None]:
        def handler(etype: str, obj: JsonObj) -> None:
            meta = obj.get("metadata") or {}
            if etype == "DELETED":
                self.expectations.forget(str(meta.get("uid")))
                self._job_started.pop(str(meta.get("uid")), None)
            self.enqueue((kind, str(meta.get("namespace", "")), str(meta.get("name", ""))))

        return handler

    def _dependent_handler(self, etype: str, obj: JsonObj) -> None:
        ref = controller_ref(obj)
        if ref is not None and ref.get("kind") in self.informers:
            ns = str((obj.get("metadata") or {}).get("namespace", ""))
            self.enqueue((str(ref["kind"]), ns, str(ref.get("name", ""))))

    def enqueue(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def enqueue_later(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.enqueue, key)

    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()
        self._tasks = [
            asyncio.create_task(self._worker(), name="controllers:worker"),
            asyncio.create_task(self._resync(), name="controllers:resync"),
            asyncio.create_task(self._cron_ticker(), name="controllers:cron"),
        ]

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers.values()))

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks), []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for informer in self.informers.values():
            await informer.stop()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            try:
                async with self._lock:
                    await self.reconcile(key)
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                log.info("reconcile %s failed: %s; retrying", key, exc)
                self.enqueue_later(key, 1.0)
            except Exception:
                log.exception("reconcile %s failed", key)
                self.enqueue_later(key, 5.0)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            for kind, informer in self.informers.items():
                for obj in informer.items():
                    meta = obj.get("metadata") or {}
                    self.enqueue((kind, str(meta.get("namespace", "")), str(meta.get("name", ""))))

    async def _cron_ticker(self) -> None:
        """Wake at every wall-clock minute boundary and run the CronJob scheduling pass."""
        while True:
            now = time.time()
            await asyncio.sleep(60.0 - now % 60.0 + 0.2)
            try:
                await self.sync_cronjobs()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cron tick failed")

    async def sync_cronjobs(self) -> None:
        """One scheduling pass over all CronJobs, against ``clock()``."""
        for obj in self.informers["CronJob"].items():
            meta = obj.get("metadata") or {}
            async with self._lock:
                await self.reconcile(("CronJob", str(meta.get("namespace", "")), str(meta["name"])))

    async def reconcile(self, key: Key) -> None:
        kind, ns, name = key
        obj = self.informers[kind].cache.get((ns, name))
        if obj is None or is_terminating(obj):
            return
        if kind == "Deployment":
            await self._reconcile_deployment(obj)
        elif kind == "StatefulSet":
            await self._reconcile_statefulset(obj)
        elif kind == "Job":
            await self._reconcile_job(obj)
        elif kind == "CronJob":
            await self._reconcile_cronjob(obj)

    # -- helpers ---------------------------------------------------------------------------

    def owned_pods(self, owner_uid: str, namespace: str) -> list[JsonObj]:
        return [
            p
            for p in self.pods.items()
            if controller_uid(p) == owner_uid
            and (p.get("metadata") or {}).get("namespace") == namespace
        ]

    def _live(self, owner_uid: str, pods: list[JsonObj]) -> list[JsonObj]:
        """Active pods minus those this controller just deleted."""
        names = {p["metadata"]["name"] for p in pods if is_active(p)}
        deleted = self.expectations.pending_deletes(owner_uid, names)
        return [p for p in pods if is_active(p) and p["metadata"]["name"] not in deleted]

    def _pending(self, owner_uid: str, pods: list[JsonObj]) -> set[str]:
        return self.expectations.pending_creates(owner_uid, {p["metadata"]["name"] for p in pods})

    async def _create_pod(self, owner_uid: str, namespace: str, pod: JsonObj) -> bool:
        try:
            await self.client.create(PODS, namespace, pod)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self.expectations.expect_create(owner_uid, pod["metadata"]["name"])
        return True

    async def _delete_pod(self, owner_uid: str, pod: JsonObj) -> None:
        meta = pod["metadata"]
        self.expectations.expect_delete(owner_uid, meta["name"])
        await self.client.delete(PODS, meta.get("namespace"), meta["name"], uid=meta.get("uid"))

    async def _patch_status(self, res: Resource, obj: JsonObj, status: JsonObj) -> None:
        current = obj.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        meta = obj["metadata"]
        try:
            await self.client.patch_status(res, meta.get("namespace"), meta["name"], status)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _event(self, obj: JsonObj, reason: str, message: str, warning: bool = False) -> None:
        task = asyncio.create_task(
            post_event(self.client, obj, reason, message, warning, "controller-manager")
        )
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    @staticmethod
    def _pod_from_template(
        template: JsonObj, name: str, namespace: str, owner: JsonObj, labels: dict[str, str]
    ) -> JsonObj:
        tmeta = template.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {**(tmeta.get("labels") or {}), **labels},
                "annotations": dict(tmeta.get("annotations") or {}),
                "ownerReferences": [owner],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }

    # -- Deployment ------------------------------------------------------------------------

    async def _reconcile_deployment(self, d: JsonObj) -> None:
        meta, spec = d["metadata"], d.get("spec") or {}
        ns, uid = meta.get("namespace", "default"), meta["uid"]
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        h = template_hash(template)
        strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
        pods = self.owned_pods(uid, ns)
        for p in pods:
            if not is_terminating(p) and pod_phase(p) in ("Succeeded", "Failed"):
                await self._delete_pod(uid, p)
        live = self._live(uid, pods)
        new = [p for p in live if (p["metadata"].get("labels") or {}).get("pod-template-hash") == h]
        old = [p for p in live if p not in new]
        for p in old:
            await self._delete_pod(uid, p)
        old_remaining = [
            p for p in pods if (p["metadata"].get("labels") or {}).get("pod-template-hash") != h
        ]
        pending = self._pending(uid, pods)
        if not (strategy == "Recreate" and old_remaining):
            missing = want - len(new) - len(pending)
            owner = owner_reference(d, "apps/v1", "Deployment")
            for _ in range(max(missing, 0)):
                pod = self._pod_from_template(
                    template,
                    f"{meta['name']}-{random_suffix()}",
                    ns,
                    owner,
                    {"pod-template-hash": h},
                )
                await self._create_pod(uid, ns, pod)
        if len(new) > want:
            # Scale down the least useful first: not ready, then the youngest.
            not_ready = [p for p in new if not is_ready(p)]
            ready = sorted(
                (p for p in new if is_ready(p)),
                key=lambda p: p["metadata"].get("creationTimestamp", ""),
                reverse=True,
            )
            victims = (not_ready + ready)[: len(new) - want]
            for p in victims:
                await self._delete_pod(uid, p)
            new = [p for p in new if p not in victims]
        now = self.clock()
        min_ready = int(spec.get("minReadySeconds", 0))
        active = self._live(uid, self.owned_pods(uid, ns))
        updated = [
            p for p in active if (p["metadata"].get("labels") or {}).get("pod-template-hash") == h
        ]
        ready_count = sum(1 for p in active if is_ready(p))
        available = sum(1 for p in active if is_available(p, min_ready, now))
        max_unavailable = 0
        if strategy == "RollingUpdate" and want > 0:
            rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
            max_unavailable = _int_or_percent(rolling.get("maxUnavailable", "25%"), want, False)
        existing = (d.get("status") or {}).get("conditions") or []
        complete = len(updated) == want and len(active) == want and available >= want
        conditions = [
            merge_condition(
                existing,
                "Available",
                available >= want - max_unavailable,
                "MinimumReplicasAvailable"
                if available >= want - max_unavailable
                else "MinimumReplicasUnavailable",
                "Deployment has minimum availability."
                if available >= want - max_unavailable
                else "Deployment does not have minimum availability.",
                now,
            ),
            merge_condition(
                existing,
                "Progressing",
                True,
                "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                f'Deployment "{meta["name"]}" has successfully progressed.'
                if complete
                else f'Deployment "{meta["name"]}" is progressing.',
                now,
            ),
        ]
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(active),
            "updatedReplicas": len(updated),
            "readyReplicas": ready_count,
            "availableReplicas": available,
            "unavailableReplicas": max(want - available, 0),
            "conditions": conditions,
        }
        await self._patch_status(DEPLOYMENTS, d, status)
        if min_ready and ready_count > available:
            self.enqueue_later(("Deployment", ns, meta["name"]), float(min_ready))

    # -- StatefulSet -----------------------------------------------------------------------

    async def _reconcile_statefulset(self, s: JsonObj) -> None:
        meta, spec = s["metadata"], s.get("spec") or {}
        ns, uid, name = meta.get("namespace", "default"), meta["uid"], meta["name"]
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        revision = f"{name}-{template_hash(template)}"
        claims = spec.get("volumeClaimTemplates") or []
        pods = self.owned_pods(uid, ns)
        by_ordinal: dict[int, JsonObj] = {}
        for p in pods:
            ordinal = _ordinal(name, p["metadata"]["name"])
            if ordinal is not None:
                by_ordinal[ordinal] = p
        pending = self._pending(uid, pods)
        owner = owner_reference(s, "apps/v1", "StatefulSet")
        for ordinal in range(want):
            pod_name = f"{name}-{ordinal}"
            existing = by_ordinal.get(ordinal)
            if existing is None:
                if pod_name in pending:
                    continue
                await self._ensure_claims(s, claims, pod_name)
                pod = self._statefulset_pod(s, template, pod_name, ordinal, revision, owner, claims)
                await self._create_pod(uid, ns, pod)
            elif not is_terminating(existing) and pod_phase(existing) in ("Succeeded", "Failed"):
                await self._delete_pod(uid, existing)
        for ordinal in sorted(by_ordinal, reverse=True):
            p = by_ordinal[ordinal]
            if ordinal >= want and not is_terminating(p):
                await self._delete_pod(uid, p)
        strategy = spec.get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            partition = int((strategy.get("rollingUpdate") or {}).get("partition", 0))
            current = [by_ordinal.get(i) for i in range(want)]
            if all(p is not None and is_ready(p) for p in current):
                outdated = [i for i in range(partition, want) if _revision(current[i]) != revision]
                if outdated:
                    victim = current[max(outdated)]
                    assert victim is not None
                    await self._delete_pod(uid, victim)
        pods = [p for p in self.owned_pods(uid, ns) if not is_terminating(p)]
        in_range = [p for p in pods if (_ordinal(name, p["metadata"]["name"]) or 0) < want]
        updated = [p for p in pods if _revision(p) == revision]
        revisions = [_revision(p) for p in pods if _revision(p) != revision]
        current_revision = revision if not revisions else max(set(revisions), key=revisions.count)
        min_ready = int(spec.get("minReadySeconds", 0))
        now = self.clock()
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": sum(1 for p in pods if is_ready(p)),
            "availableReplicas": sum(1 for p in in_range if is_available(p, min_ready, now)),
            "currentReplicas": sum(1 for p in pods if _revision(p) == current_revision),
            "updatedReplicas": len(updated),
            "currentRevision": current_revision,
            "updateRevision": revision,
            "collisionCount": 0,
        }
        await self._patch_status(STATEFULSETS, s, status)

    def _statefulset_pod(
        self,
        s: JsonObj,
        template: JsonObj,
        pod_name: str,
        ordinal: int,
        revision: str,
        owner: JsonObj,
        claims: list[JsonObj],
    ) -> JsonObj:
        meta, spec = s["metadata"], s.get("spec") or {}
        pod = self._pod_from_template(
            template,
            pod_name,
            meta.get("namespace", "default"),
            owner,
            {
                "statefulset.kubernetes.io/pod-name": pod_name,
                "controller-revision-hash": revision,
                "apps.kubernetes.io/pod-index": str(ordinal),
            },
        )
        pspec = pod["spec"]
        pspec.setdefault("hostname", pod_name)
        if spec.get("serviceName"):
            pspec.setdefault("subdomain", spec["serviceName"])
        claim_names = {(c.get("metadata") or {}).get("name") for c in claims}
        volumes = [v for v in pspec.get("volumes") or [] if v.get("name") not in claim_names]
        for c in claims:
            cname = c["metadata"]["name"]
            volumes.append(
                {"name": cname, "persistentVolumeClaim": {"claimName": f"{cname}-{pod_name}"}}
            )
        if volumes:
            pspec["volumes"] = volumes
        return pod

    async def _ensure_claims(self, s: JsonObj, claims: list[JsonObj], pod_name: str) -> None:
        """Create the pod's PersistentVolumeClaims (already Bound: the kubelet uses a directory)."""
        meta = s["metadata"]
        ns = meta.get("namespace", "default")
        retention = (s.get("spec") or {}).get("persistentVolumeClaimRetentionPolicy") or {}
        for c in claims:
            cmeta = c.get("metadata") or {}
            claim_name = f"{cmeta['name']}-{pod_name}"
            body: JsonObj = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim_name,
                    "namespace": ns,
                    "labels": {
                        **(cmeta.get("labels") or {}),
                        **((s.get("spec") or {}).get("selector") or {}).get("matchLabels", {}),
                    },
                },
                "spec": copy.deepcopy(c.get("spec") or {}),
            }
            if retention.get("whenDeleted") == "Delete":
                ref = owner_reference(s, "apps/v1", "StatefulSet")
                ref["controller"] = False
                body["metadata"]["ownerReferences"] = [ref]
            try:
                await self.client.create(PVCS, ns, body)
            except ApiError as exc:
                if exc.status == 409:
                    continue
                if exc.status in (404, 405, 422):
                    log.debug("PVC %s not created: %s", claim_name, exc)
                    continue
                raise
            with contextlib.suppress(ApiError):
                await self.client.patch_status(
                    PVCS,
                    ns,
                    claim_name,
                    {
                        "phase": "Bound",
                        "accessModes": (c.get("spec") or {}).get("accessModes", []),
                        "capacity": ((c.get("spec") or {}).get("resources") or {}).get(
                            "requests", {}
                        ),
                    },
                )

    # -- Job -------------------------------------------------------------------------------

    async def _reconcile_job(self, j: JsonObj) -> None:
        meta, spec = j["metadata"], j.get("spec") or {}
        ns, uid, name = meta.get("namespace", "default"), meta["uid"], meta["name"]
        status_now = j.get("status") or {}
        existing = status_now.get("conditions") or []
        pods = self.owned_pods(uid, ns)
        live = self._live(uid, pods)
        now = self.clock()
        finished = next(
            (
                c["type"]
                for c in existing
                if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            ),
            None,
        )
        succeeded = sum(1 for p in pods if pod_phase(p) == "Succeeded")
        restart_policy = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
        failed = sum(1 for p in pods if pod_phase(p) == "Failed")
        failures = failed
        if restart_policy == "OnFailure":
            failures += sum(
                int(cs.get("restartCount", 0))
                for p in pods
                for cs in (p.get("status") or {}).get("containerStatuses") or []
            )
        if finished is not None:
            for p in live:
                await self._delete_pod(uid, p)
            await self._job_ttl(j, now)
            return
        start_time = parse_time(status_now.get("startTime")) or self._job_started.setdefault(
            uid, now
        )
        completions_spec = spec.get("completions")
        completions = 1 if completions_spec is None else int(completions_spec)
        parallelism = int(spec.get("parallelism", 1))
        backoff_limit = int(spec.get("backoffLimit", 6))
        deadline = spec.get("activeDeadlineSeconds")
        conditions: list[JsonObj] = [c for c in existing if c.get("type") not in ("Suspended",)]
        extra: JsonObj = {}
        outcome: tuple[str, str, str] | None = None
        if failures > backoff_limit:
            outcome = (
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        elif deadline is not None and now >= start_time + timedelta(seconds=int(deadline)):
            outcome = (
                "Failed",
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
        elif succeeded >= completions or (completions_spec is None and succeeded > 0 and not live):
            outcome = ("Complete", "", "")
            extra["completionTime"] = fmt_time(now)
        if outcome is not None:
            ctype, reason, message = outcome
            for p in live:
                await self._delete_pod(uid, p)
            live = []
            conditions.append(merge_condition(existing, ctype, True, reason, message, now))
            self._event(
                j, "Completed" if ctype == "Complete" else reason, message or "Job completed"
            )
        elif spec.get("suspend"):
            for p in live:
                await self._delete_pod(uid, p)
            live = []
            conditions.append(
                merge_condition(existing, "Suspended", True, "JobSuspended", "Job suspended", now)
            )
        else:
            pending = self._pending(uid, pods)
            remaining = completions - succeeded if completions_spec is not None else parallelism
            if completions_spec is None and succeeded > 0:
                remaining = 0
            missing = min(parallelism, remaining) - len(live) - len(pending)
            wait = self.job_backoff_left(pods, failed, now)
            if missing > 0 and wait > 0:
                self.enqueue_later(("Job", ns, name), wait)
                missing = 0
            template = spec.get("template") or {}
            owner = owner_reference(j, "batch/v1", "Job")
            labels = {
                "batch.kubernetes.io/job-name": name,
                "job-name": name,
                "batch.kubernetes.io/controller-uid": uid,
                "controller-uid": uid,
            }
            for _ in range(max(missing, 0)):
                pod = self._pod_from_template(
                    template, f"{name}-{random_suffix()}", ns, owner, labels
                )
                await self._create_pod(uid, ns, pod)
        status: JsonObj = {
            "startTime": fmt_time(start_time),
            "active": len(live),
            "ready": sum(1 for p in live if is_ready(p)),
            "succeeded": succeeded,
            "failed": failed,
            **extra,
        }
        if conditions:
            status["conditions"] = conditions
        await self._patch_status(JOBS, j, status)

    def job_backoff_left(self, pods: list[JsonObj], failed: int, now: datetime) -> float:
        """Seconds until a failed Job pod may be replaced: ``base * 2**(failures - 1)``, capped
        (the Job controller's pod failure back-off), counted from the last failure."""
        if failed <= 0:
            return 0.0
        finished = [
            parse_time(cs["state"]["terminated"].get("finishedAt"))
            for p in pods
            if pod_phase(p) == "Failed"
            for cs in (p.get("status") or {}).get("containerStatuses") or []
            if (cs.get("state") or {}).get("terminated")
        ]
        last = max((t for t in finished if t is not None), default=None)
        if last is None:
            return 0.0
        delay = min(self.job_backoff_cap, self.job_backoff_base * 2 ** (failed - 1))
        return max(0.0, (last + timedelta(seconds=delay) - now).total_seconds())

    async def _job_ttl(self, j: JsonObj, now: datetime) -> None:
        ttl = (j.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        status = j.get("status") or {}
        finished_at = parse_time(status.get("completionTime")) or max(
            (
                parse_time(c.get("lastTransitionTime")) or now
                for c in status.get("conditions") or []
                if c.get("type") in ("Complete", "Failed")
            ),
            default=now,
        )
        meta = j["metadata"]
        if now >= finished_at + timedelta(seconds=int(ttl)):
            await self.client.delete(
                JOBS, meta.get("namespace"), meta["name"], propagation_policy="Background"
            )
        else:
            delay = (finished_at + timedelta(seconds=int(ttl)) - now).total_seconds()
            self.enqueue_later(("Job", meta.get("namespace", ""), meta["name"]), delay + 0.1)

    # -- CronJob ---------------------------------------------------------------------------

    async def _reconcile_cronjob(self, cj: JsonObj) -> None:
        meta, spec = cj["metadata"], cj.get("spec") or {}
        ns, uid, name = meta.get("namespace", "default"), meta["uid"], meta["name"]
        status_now = cj.get("status") or {}
        jobs = [
            j
            for j in self.informers["Job"].items()
            if controller_uid(j) == uid and j["metadata"].get("namespace") == ns
        ]
        active = [j for j in jobs if _job_finished(j) is None and not is_terminating(j)]
        finished = [j for j in jobs if _job_finished(j) is not None and not is_terminating(j)]
        await self._cleanup_history(spec, finished)
        status: JsonObj = {}
        successful = [j for j in finished if _job_finished(j) == "Complete"]
        if successful:
            last = max((j.get("status") or {}).get("completionTime") or "" for j in successful)
            if last:
                status["lastSuccessfulTime"] = last
        try:
            schedule = CronSchedule.parse(str(spec.get("schedule", "")), spec.get("timeZone"))
        except CronError as exc:
            self._event(cj, "UnparseableSchedule", str(exc), warning=True)
            return
        now = self.clock()
        if not spec.get("suspend"):
            earliest = parse_time(status_now.get("lastScheduleTime")) or parse_time(
                meta.get("creationTimestamp")
            )
            earliest = earliest or now
            scheduled, missed = schedule.last_between(earliest, now)
            if missed >= 100:
                self._event(cj, "TooManyMissedTimes", "too many missed start times", warning=True)
            deadline = spec.get("startingDeadlineSeconds")
            if scheduled is not None:
                too_late = (
                    deadline is not None and scheduled + timedelta(seconds=int(deadline)) < now
                )
                policy = spec.get("concurrencyPolicy", "Allow")
                already = any(j["metadata"]["name"] == _job_name(cj, scheduled) for j in jobs)
                if already:
                    # Our own earlier pass created it; the status write may not be visible yet.
                    status["lastScheduleTime"] = fmt_time(scheduled)
                elif too_late:
                    self._event(cj, "MissSchedule", f"Missed scheduled time {fmt_time(scheduled)}")
                elif policy == "Forbid" and active:
                    log.debug("cronjob %s/%s: skipping run, previous still active", ns, name)
                else:
                    if policy == "Replace":
                        for j in active:
                            await self.client.delete(
                                JOBS, ns, j["metadata"]["name"], propagation_policy="Background"
                            )
                        active = []
                    job = await self._create_scheduled_job(cj, scheduled)
                    if job is not None:
                        active.append(job)
                    status["lastScheduleTime"] = fmt_time(scheduled)
        status["active"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": j["metadata"]["name"],
                "namespace": ns,
                "uid": j["metadata"].get("uid"),
            }
            for j in active
        ]
        await self._patch_status(CRONJOBS, cj, status)

    async def _create_scheduled_job(self, cj: JsonObj, scheduled: datetime) -> JsonObj | None:
        meta, spec = cj["metadata"], cj.get("spec") or {}
        ns = meta.get("namespace", "default")
        template = spec.get("jobTemplate") or {}
        tmeta = template.get("metadata") or {}
        job_name = _job_name(cj, scheduled)
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name,
                "namespace": ns,
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": {
                    **(tmeta.get("annotations") or {}),
                    "batch.kubernetes.io/cronjob-scheduled-timestamp": scheduled.isoformat(),
                },
                "ownerReferences": [owner_reference(cj, "batch/v1", "CronJob")],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        try:
            created = await self.client.create(JOBS, ns, body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise
        self._event(cj, "SuccessfulCreate", f"Created job {job_name}")
        return created

    async def _cleanup_history(self, spec: JsonObj, finished: list[JsonObj]) -> None:
        limits = {
            "Complete": int(spec.get("successfulJobsHistoryLimit", 3)),
            "Failed": int(spec.get("failedJobsHistoryLimit", 1)),
        }
        for outcome, limit in limits.items():
            group = sorted(
                (j for j in finished if _job_finished(j) == outcome),
                key=lambda j: (
                    (j.get("status") or {}).get("startTime")
                    or j["metadata"].get("creationTimestamp", ""),
                    j["metadata"]["name"],
                ),
            )
            for j in group[: max(len(group) - limit, 0)]:
                meta = j["metadata"]
                await self.client.delete(
                    JOBS, meta.get("namespace"), meta["name"], propagation_policy="Background"
                )


def _ordinal(set_name: str, pod_name: str) -> int | None:
    prefix = f"{set_name}-"
    if not pod_name.startswith(prefix):
        return None
    tail = pod_name[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def _revision(pod: JsonObj | None) -> str | None:
    if pod is None:
        return None
    return (pod["metadata"].get("labels") or {}).get("controller-revision-hash")


def _job_name(cj: JsonObj, scheduled: datetime) -> str:
    """Deterministic Job name for a scheduled time (minutes since the epoch, like Kubernetes)."""
    return f"{cj['metadata']['name']}-{int(scheduled.timestamp() // 60)}"


def _job_finished(job: JsonObj) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None
