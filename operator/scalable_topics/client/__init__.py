"""The Python client SDK of Scalable Topics (see docs/client.md).

High level (asyncio): :class:`ScalableTopicProducer`, :class:`StreamConsumer`,
:class:`CheckpointConsumer`, :class:`QueueConsumer`; blocking: :class:`SyncProducer`,
:class:`SyncConsumer`. The low-level per-segment client is :mod:`scalable_topics.client.segment`.
"""

from .consumers import (
    CheckpointConsumer,
    ConsumerClosedError,
    ConsumerError,
    QueueConsumer,
    StreamConsumer,
)
from .dag import DagWatcher, TopicNotFoundError
from .model import Checkpoint, Message, MessageId
from .producer import ProducerClosedError, ScalableTopicProducer
from .segment import AccessDeniedError, SegmentCorruptedError, TLSVerificationError
from .sync import SyncConsumer, SyncProducer

__all__ = [
    "AccessDeniedError",
    "Checkpoint",
    "CheckpointConsumer",
    "ConsumerClosedError",
    "ConsumerError",
    "DagWatcher",
    "Message",
    "MessageId",
    "ProducerClosedError",
    "QueueConsumer",
    "ScalableTopicProducer",
    "SegmentCorruptedError",
    "StreamConsumer",
    "SyncConsumer",
    "SyncProducer",
    "TLSVerificationError",
    "TopicNotFoundError",
]
