"""A replica is in sync once its watches delivered every object its own listing found, whether
the watch delivered it before or after the listing; an object deleted before any watch saw it
stops being waited for at the next listing (``controller.initialsync``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scalable_topics.controller.initialsync import InitialSync


def test_done_once_every_listed_object_came_through_a_watch() -> None:
    sync = InitialSync()
    sync.saw("a")
    sync.expect({"a", "b", "c"})
    assert not sync.done.is_set() and sync.pending == 2
    sync.saw("zz")  # created after the listing: not waited for
    sync.saw("b")
    assert not sync.done.is_set() and sync.pending == 1
    sync.saw("c")
    assert sync.done.is_set() and sync.pending == 0


def test_an_empty_cluster_is_in_sync_at_its_listing() -> None:
    sync = InitialSync()
    assert not sync.done.is_set() and not sync.listed
    sync.relisted(set())  # a first listing, whichever method gives it
    assert sync.done.is_set() and sync.listed


def test_an_object_deleted_before_any_watch_saw_it_is_dropped_by_the_next_listing() -> None:
    sync = InitialSync()
    sync.expect({"a", "gone"})
    sync.saw("a")
    assert not sync.done.is_set()
    sync.relisted({"a", "new"})
    assert sync.done.is_set()


@given(
    listed=st.sets(st.text(min_size=1, max_size=3), max_size=12),
    early=st.sets(st.text(min_size=1, max_size=3), max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_never_done_before_every_listed_object_was_seen(
    listed: set[str], early: set[str], order: object
) -> None:
    sync = InitialSync()
    for uid in sorted(early):
        sync.saw(uid)
    sync.expect(listed)
    rest = sorted(listed - early)
    order.shuffle(rest)  # type: ignore[attr-defined]
    for i, uid in enumerate(rest):
        assert not sync.done.is_set(), (rest[:i], listed)
        sync.saw(uid)
    assert sync.done.is_set()
