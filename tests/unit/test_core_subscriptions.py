from __future__ import annotations

import pytest

from scalable_topics.core.resources import SubscriptionType
from scalable_topics.core.subscriptions import BrokerSubscriptionType


@pytest.mark.parametrize("kind", list(SubscriptionType))
def test_a_spec_subscription_reads_back_as_its_own_type(kind: SubscriptionType) -> None:
    assert BrokerSubscriptionType.of(kind).subscription_type is kind


def test_broker_types_map_to_the_spec_vocabulary() -> None:
    assert {t: t.subscription_type for t in BrokerSubscriptionType} == {
        BrokerSubscriptionType.EXCLUSIVE: SubscriptionType.STREAM,
        BrokerSubscriptionType.QUEUE: SubscriptionType.QUEUE,
        BrokerSubscriptionType.KEY_SHARED: SubscriptionType.QUEUE,
    }


def test_parse_takes_both_vocabularies_and_rejects_others() -> None:
    assert BrokerSubscriptionType.parse("Stream") is BrokerSubscriptionType.EXCLUSIVE
    assert BrokerSubscriptionType.parse("Queue") is BrokerSubscriptionType.QUEUE
    assert BrokerSubscriptionType.parse("key_shared") is BrokerSubscriptionType.KEY_SHARED
    with pytest.raises(ValueError, match="unknown subscription type 'Failover'"):
        BrokerSubscriptionType.parse("Failover")
