"""Per-topic retention in one shared log (commitlog/topicretention.py, docs/ARCHITECTURE.md §6.4):
the table of what a topic's own retention asks — cut its queues when shorter than the broker's,
hold segments when longer — and properties: a cut never reaches a record younger than the
topic's retention, a hold keeps every segment that may hold one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.commitlog.retentionpolicy import SegmentInfo
from tidelog.commitlog.topicretention import TopicPlan, expired_end, plan, young_start

SEG = 100
NOW = 1_000_000


def _segs(ages_ms: list[int]) -> list[SegmentInfo]:
    """Segments of SEG bytes, the newest write of each `age` ms before NOW."""
    return [SegmentInfo(i * SEG, (i + 1) * SEG, NOW - age) for i, age in enumerate(ages_ms)]


CASES = [
    # (name, ages, broker retention, topics, limit, expected plan)
    ("no topic retention", [900, 0], 500, {"t": 0}, 10**9, TopicPlan()),
    ("equal to the broker's: nothing", [900, 0], 500, {"t": 500}, 10**9, TopicPlan()),
    ("shorter: cut past the old segments", [900, 800, 10, 0], 500, {"t": 100}, 10**9, TopicPlan({"t": 200})),
    ("shorter: exactly at the limit is kept", [900, 100, 0], 500, {"t": 100}, 10**9, TopicPlan({"t": 100})),
    ("shorter: a young segment stops the run", [900, 10, 900, 0], 500, {"t": 100}, 10**9, TopicPlan({"t": 100})),
    ("shorter: the active segment too, once old", [900, 800], 5000, {"t": 100}, 10**9, TopicPlan({"t": 200})),
    ("shorter: capped at the max offset read first", [900, 800], 5000, {"t": 100}, 150, TopicPlan({"t": 150})),
    ("shorter: nothing old yet", [50, 0], 500, {"t": 100}, 10**9, TopicPlan()),
    ("broker keeps forever: every one is shorter", [900, 0], 0, {"t": 100}, 10**9, TopicPlan({"t": 100})),
    ("longer: held from the oldest young segment", [900, 800, 300, 0], 100, {"t": 500}, 10**9, TopicPlan({}, {"t": 200})),
    ("longer: all older than it holds nothing", [900, 800], 100, {"t": 500}, 10**9, TopicPlan()),
    ("one each", [900, 300, 0], 500, {"a": 100, "b": 1000, "c": 0}, 10**9, TopicPlan({"a": 200}, {"b": 0})),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "ages", "broker", "topics", "limit", "want"), CASES, ids=[c[0] for c in CASES]
)
def test_plan_table(
    name: str, ages: list[int], broker: int, topics: dict[str, int], limit: int, want: TopicPlan
) -> None:
    assert plan(_segs(ages), NOW, broker, topics, limit) == want


def test_no_segments() -> None:
    assert expired_end([], NOW, 100, 10**9) == 0
    assert young_start([], NOW, 100) is None
    assert plan([], NOW, 500, {"t": 100, "u": 1000}, 0) == TopicPlan()


@given(
    st.lists(st.integers(0, 2000), min_size=1, max_size=10),
    st.integers(1, 2000),
    st.integers(0, 10 * SEG),
)
def test_a_cut_never_reaches_a_younger_record(ages: list[int], retention: int, limit: int) -> None:
    segs = _segs(ages)
    end = expired_end(segs, NOW, retention, limit)
    assert 0 <= end <= limit
    # every byte below the cut lies in a segment whose newest write is older than the retention
    assert all(NOW - s.newest_ms > retention for s in segs if s.base < end)


@given(st.lists(st.integers(0, 2000), min_size=1, max_size=10), st.integers(1, 2000))
def test_a_hold_keeps_every_segment_that_may_hold_a_young_record(ages: list[int], retention: int) -> None:
    segs = _segs(ages)
    start = young_start(segs, NOW, retention)
    young = [s for s in segs if NOW - s.newest_ms <= retention]
    if start is None:
        assert not young
    else:
        assert all(s.base >= start for s in young)
