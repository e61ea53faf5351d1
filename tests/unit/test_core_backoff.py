from __future__ import annotations

from scalable_topics.core.backoff import Backoff


def test_delay_doubles_up_to_the_cap() -> None:
    backoff = Backoff(base=1, cap=5, jitter=False)
    assert [backoff.delay_for(n) for n in range(0, 6)] == [0, 1, 2, 4, 5, 5]


def test_a_retry_loop_counts_failures_and_a_success_resets_them() -> None:
    backoff = Backoff(base=1, cap=8, jitter=False)
    assert [backoff.delay() for _ in range(3)] == [1, 2, 4]
    backoff.reset()
    assert backoff.delay() == 1


def test_jitter_stays_in_the_upper_half() -> None:
    backoff = Backoff(base=0.2, cap=0.8)
    for n in range(1, 8):
        value = min(0.8, 0.2 * 2 ** (n - 1))
        assert value / 2 <= backoff.delay() <= value
