"""A stream consumer in its own process, for tests that SIGKILL it: it prints every message it
takes as a JSON line (before acknowledging it), so the test records the deliveries.

    python -m tests.integration.keyshared_consumer_proc SERVICE_URL NS TOPIC SUB NAME
"""

from __future__ import annotations

import asyncio
import json
import sys

from scalable_topics.client import StreamConsumer


async def main(service_url: str, namespace: str, topic: str, subscription: str, name: str) -> None:
    consumer = StreamConsumer(service_url, namespace, topic, subscription, name, permits=64)
    await consumer.start()
    print(json.dumps({"started": True}), flush=True)
    async for message in consumer:
        line = {
            "key": message.key,
            "value": message.value.decode("latin-1"),
            "segment": message.segment_id,
            "position": message.position,
            "batchIndex": message.batch_index,
            "batchSize": message.batch_size,
        }
        print(json.dumps(line), flush=True)
        await asyncio.sleep(0.001)  # the work
        consumer.ack_nowait(message)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
