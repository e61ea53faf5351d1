"""``stopic demo`` (``make run``) on a data directory an earlier run left behind: the demo topic
split (or merged) by that run is deleted with its segments and created again in its initial
shape, and a topic already in that shape is reused. Real control plane, operator, brokers and
kubectl (the server's release)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalable_topics.cli.demo import TOPIC, Demo
from scalable_topics.kubeapi import api_client

from .operator_harness import REPO, operator_stack

pytestmark = pytest.mark.integration


async def test_demo_starts_the_topic_afresh_after_an_earlier_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with operator_stack(tmp_path, operator_replicas=1, brokers=2) as stack:
        demo = Demo(
            stack.data_dir,
            phase_timeout=60,
            progress_every=0.5,
            kubeconfig=stack.cluster.kubeconfig,
        )
        # What LocalCluster links as DIR/bin/kubectl: the server's release.
        demo.kubectl_path = tmp_path / "bin" / "kubectl"
        demo.kubectl_path.parent.mkdir()
        demo.kubectl_path.symlink_to(stack.kube)
        api = await api_client(str(stack.cluster.kubeconfig))
        try:
            # What a previous run leaves: the example topic, split once.
            await stack.kubectl("apply", "-f", str(REPO / "manifests/examples/orders.yaml"))
            await stack.wait_ready(TOPIC, within=90)
            await stack.request(TOPIC, {"id": "earlier-run", "op": "split", "segments": [0]})
            earlier = await stack.wait_request(TOPIC, "earlier-run", within=90)
            assert earlier["status"]["epoch"] == 1
            assert sorted(await stack.segments(TOPIC)) == [0, 1, 2, 3]
            capsys.readouterr()

            await demo.fresh_topic(api)

            said = capsys.readouterr().out
            assert "left from an earlier run (epoch 1, 3 active segments)" in said, said
            fresh = await stack.topic(TOPIC)
            assert fresh is not None
            assert fresh["metadata"]["uid"] != earlier["metadata"]["uid"]
            assert fresh["status"]["epoch"] == 0 and fresh["status"]["activeSegments"] == 2
            segments = await stack.segments(TOPIC)
            assert sorted(segments) == [0, 1]
            assert {
                ref["uid"] for s in segments.values() for ref in s["metadata"]["ownerReferences"]
            } == {fresh["metadata"]["uid"]}

            # A topic in its initial shape is the demo's starting point as it is.
            await demo.fresh_topic(api)
            again = await stack.topic(TOPIC)
            assert again is not None and again["metadata"]["uid"] == fresh["metadata"]["uid"]
            assert "earlier run" not in capsys.readouterr().out
        finally:
            await api.close()
