"""Every API request of the controller has a deadline: a connection that stops answering fails
its request (and the reconcile pass is retried) instead of holding the topic's lock forever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from kubernetes_asyncio import client as k8s

from scalable_topics.controller import kube as kube_module
from scalable_topics.controller.kube import KubeApi
from scalable_topics.core.resources import GROUP, TOPIC_PLURAL, VERSION


@pytest_asyncio.fixture
async def silent_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A TCP server that reads requests and never answers them."""
    received: list[bytes] = []
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        received.append(await reader.read(65536))
        await reader.read()  # until the client gives up and closes

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_request_to_a_silent_api_server_fails_at_the_deadline(
    silent_server: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = silent_server
    api = k8s.ApiClient(k8s.Configuration(host=url))
    try:
        kube = KubeApi(api, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await kube.get_topic("default", "orders")
        took = time.monotonic() - started
        assert 0.5 <= took < 5, took
        request_line = f"GET /apis/{GROUP}/{VERSION}/".encode()
        assert received and received[0].startswith(request_line), received
        # A second KubeApi on the same client does not wrap it again: the first deadline stays.
        KubeApi(api, timeout=60)
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await kube.get_topic("default", "orders")
        assert 0.5 <= time.monotonic() - started < 5
        # A request that names its own deadline keeps it.
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await kube.custom.get_namespaced_custom_object(
                GROUP, VERSION, "default", TOPIC_PLURAL, "x", _request_timeout=0.2
            )
        assert time.monotonic() - started < 0.5
        # A LIST (20,000 Segments at 10,000 topics) has the longer LIST_TIMEOUT.
        monkeypatch.setattr(kube_module, "LIST_TIMEOUT", 1.5)
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await kube.list_all_segments()
        assert 1.5 <= time.monotonic() - started < 5
    finally:
        await api.close()
