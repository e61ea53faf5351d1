"""The kubelet's REST client and informer against the embedded API server."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.localcluster.restclient import (
    CONFIGMAPS,
    ApiError,
    Informer,
    RestClient,
    WatchExpired,
)

from .kubelet_harness import eventually

pytestmark = pytest.mark.integration

NS = "default"


async def test_crud_status_codes_and_stale_watch(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False, history_size=4) as cluster:
        client = RestClient(cluster.url, cluster.token)
        try:
            created = await client.create(
                CONFIGMAPS, NS, {"metadata": {"name": "a"}, "data": {"k": "1"}}
            )
            _, list_rv = await client.list(CONFIGMAPS, NS)
            patched = await client.patch(CONFIGMAPS, NS, "a", {"data": {"k": "2"}})
            assert patched["data"] == {"k": "2"}
            assert int(patched["metadata"]["resourceVersion"]) > int(
                created["metadata"]["resourceVersion"]
            )
            with pytest.raises(ApiError) as conflict:
                await client.create(CONFIGMAPS, NS, {"metadata": {"name": "a"}})
            assert conflict.value.status == 409 and conflict.value.reason == "AlreadyExists"
            assert await client.get_or_none(CONFIGMAPS, NS, "missing") is None
            assert await client.delete(CONFIGMAPS, NS, "missing") is None
            for i in range(10):
                await client.patch(CONFIGMAPS, NS, "a", {"data": {"k": str(i)}})
            with pytest.raises(WatchExpired):
                async for _ in client.watch(CONFIGMAPS, list_rv, timeout_seconds=5):
                    pass
        finally:
            await client.close()


async def test_informer_follows_changes_and_relists(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "c", kubelet=False) as cluster:
        client = RestClient(cluster.url, cluster.token)
        events: list[tuple[str, str]] = []
        informer = Informer(client, CONFIGMAPS)
        informer.add_handler(lambda t, o: events.append((t, o["metadata"]["name"])))
        try:
            await client.create(CONFIGMAPS, NS, {"metadata": {"name": "before"}})
            informer.start()
            await informer.synced.wait()
            assert (NS, "before") in informer.cache
            await client.create(CONFIGMAPS, NS, {"metadata": {"name": "during"}})

            async def seen_during() -> bool:
                return ("ADDED", "during") in events

            await eventually(seen_during, what="watch event")
            await informer.stop()
            await client.delete(CONFIGMAPS, NS, "before")
            await client.create(CONFIGMAPS, NS, {"metadata": {"name": "after"}})
            events.clear()
            informer.start()

            async def relisted() -> bool:
                return ("DELETED", "before") in events and (NS, "after") in informer.cache

            await eventually(relisted, what="relist diff")
            assert (NS, "before") not in informer.cache
        finally:
            await informer.stop()
            await client.close()
