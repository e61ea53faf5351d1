"""A topic's subscription types, the broker's, and how they relate.

A topic's spec names a subscription ``Stream`` or ``Queue`` (:class:`SubscriptionType`, also
exported by :mod:`scalable_topics.core.resources`); the segment broker keeps, per
segment, a cursor of one of the dispatch types below. The controller creates a segment's
subscriptions from the spec and reads them back from broker stats (a rebuilt or split topic
inherits what its parents' brokers know), so both directions go through this module.
"""

from __future__ import annotations

import enum


class SubscriptionType(enum.StrEnum):
    """``Stream``: ordered, each active segment read by one consumer (sticky or round-robin).
    ``Queue``: shared, messages dispatched to any consumer with per-key order kept by entry
    buckets (PIP-486)."""

    STREAM = "Stream"
    QUEUE = "Queue"


class BrokerSubscriptionType(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    """One consumer at a time; a stream subscription of the SDK uses this type."""
    QUEUE = "Queue"
    """Several consumers share the segment, entries round-robin (Pulsar's Shared)."""
    KEY_SHARED = "KeyShared"
    """Several consumers; an entry goes to the consumer owning its hashB bucket (PIP-486)."""

    @classmethod
    def parse(cls, text: str) -> BrokerSubscriptionType:
        """A broker type from its name, any case, or from the spec's (``Stream``, ``Queue``) and
        the consumer kinds (``checkpoint``, ``shared``, ``key_shared``)."""
        norm = text.replace("-", "").replace("_", "").lower()
        aliases = {
            "exclusive": cls.EXCLUSIVE,
            "stream": cls.EXCLUSIVE,
            "checkpoint": cls.EXCLUSIVE,
            "queue": cls.QUEUE,
            "shared": cls.QUEUE,
            "keyshared": cls.KEY_SHARED,
        }
        try:
            return aliases[norm]
        except KeyError:
            raise ValueError(
                f"unknown subscription type {text!r} (Exclusive, Stream, Queue, KeyShared)"
            ) from None

    @classmethod
    def of(cls, kind: SubscriptionType) -> BrokerSubscriptionType:
        """The broker type a spec subscription gets."""
        return cls.EXCLUSIVE if kind is SubscriptionType.STREAM else cls.QUEUE

    @property
    def subscription_type(self) -> SubscriptionType:
        """The spec's type of a subscription the broker has (a key-shared one is a queue's)."""
        return SubscriptionType.STREAM if self is self.EXCLUSIVE else SubscriptionType.QUEUE
