"""The retention rule (commitlog/retentionpolicy.py, docs/ARCHITECTURE.md §6.4): the table of its
cases, and properties over random logs — it never deletes the active segment, nor a byte at or
above any floor, and deletes only an oldest-first prefix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.commitlog.retentionpolicy import Decision, RetentionRules, SegmentInfo, decide

SEG = 100
NOW = 1_000_000


def _segs(ages_ms: list[int], last_size: int = 40) -> list[SegmentInfo]:
    """Full segments of SEG bytes (the last one `last_size`), each written `age` ms before NOW."""
    out = []
    for i, age in enumerate(ages_ms):
        size = last_size if i == len(ages_ms) - 1 else SEG
        out.append(SegmentInfo(i * SEG, i * SEG + size, NOW - age))
    return out


CASES = [
    # (name, ages, rules, floors, expected decision)
    ("rules off", [900, 800, 0], RetentionRules(), {}, Decision(0, 0, "not-expired")),
    ("age: the old ones go", [900, 800, 10, 0], RetentionRules(retention_ms=500), {}, Decision(2, 200, "not-expired")),
    ("age: never the active segment", [900, 900, 900], RetentionRules(retention_ms=500), {}, Decision(2, 200, "active")),
    ("age: exactly at the limit stays", [500, 0], RetentionRules(retention_ms=500), {}, Decision(0, 0, "not-expired")),
    ("a young segment keeps older ones after it", [900, 10, 900, 0], RetentionRules(retention_ms=500), {}, Decision(1, 100, "not-expired")),
    ("size: down to the limit", [0, 0, 0, 0], RetentionRules(retention_bytes=150), {}, Decision(2, 200, "not-expired")),
    ("size: never the active segment", [0, 0, 0, 0], RetentionRules(retention_bytes=30), {}, Decision(3, 300, "active")),
    ("size: under the limit keeps all", [0, 0, 0], RetentionRules(retention_bytes=1000), {}, Decision(0, 0, "not-expired")),
    ("size: stops once under", [0, 0, 0, 0], RetentionRules(retention_bytes=250), {}, Decision(1, 100, "not-expired")),
    ("a floor inside a segment keeps it", [900, 900, 900, 0], RetentionRules(retention_ms=1), {"confirm": 150}, Decision(1, 100, "confirm")),
    ("a floor at a segment's end lets it go", [900, 900, 900, 0], RetentionRules(retention_ms=1), {"slaves": 200}, Decision(2, 200, "slaves")),
    ("the lowest floor names the hold", [900, 900, 900, 0], RetentionRules(retention_ms=1), {"confirm": 350, "groups": 120, "metadata": 250}, Decision(1, 100, "groups")),
    ("a None floor is no floor", [900, 900, 0], RetentionRules(retention_ms=1), {"groups": None}, Decision(2, 200, "active")),
    ("a floor at zero keeps everything", [900, 900, 0], RetentionRules(retention_ms=1), {"master-min": 0}, Decision(0, 0, "master-min")),
]  # fmt: skip


@pytest.mark.parametrize(("name", "ages", "rules", "floors", "want"), CASES, ids=[c[0] for c in CASES])
def test_rule_table(
    name: str, ages: list[int], rules: RetentionRules, floors: dict[str, int | None], want: Decision
) -> None:
    assert decide(_segs(ages), NOW, rules, floors) == want


def test_no_segments() -> None:
    assert decide([], NOW, RetentionRules(retention_ms=1), {}) == Decision(0, 0, "")


@st.composite
def _logs(draw: st.DrawFn) -> tuple[list[SegmentInfo], RetentionRules, dict[str, int | None]]:
    n = draw(st.integers(1, 12))
    first = draw(st.integers(0, 5)) * SEG
    ages = draw(st.lists(st.integers(0, 2000), min_size=n, max_size=n))
    segs = [SegmentInfo(first + i * SEG, first + (i + 1) * SEG, NOW - a) for i, a in enumerate(ages)]
    last = segs[-1]
    segs[-1] = SegmentInfo(last.base, last.base + draw(st.integers(0, SEG)), last.newest_ms)
    rules = RetentionRules(draw(st.integers(0, 2000)), draw(st.integers(0, (n + 1) * SEG)))
    names = ["confirm", "slaves", "groups", "metadata", "recovery"]
    floors = {
        name: draw(st.none() | st.integers(first, segs[-1].end + SEG))
        for name in draw(st.lists(st.sampled_from(names), unique=True))
    }
    return segs, rules, floors


@given(_logs())
def test_never_deletes_at_or_above_a_floor_nor_the_active_segment(
    case: tuple[list[SegmentInfo], RetentionRules, dict[str, int | None]],
) -> None:
    segs, rules, floors = case
    d = decide(segs, NOW, rules, floors)
    assert 0 <= d.count < len(segs)  # the active (last) segment always stays
    assert d.new_min == segs[d.count].base
    for seg in segs[: d.count]:
        for floor in floors.values():
            assert floor is None or seg.end <= floor
        expired_by_age = rules.retention_ms > 0 and NOW - seg.newest_ms > rules.retention_ms
        assert expired_by_age or rules.retention_bytes > 0
    if rules.retention_bytes and not rules.retention_ms:
        # the size rule deletes only while the log is over the limit
        kept = sum(s.size for s in segs[d.count :])
        gone_last = segs[d.count - 1].size if d.count else 0
        assert d.count == 0 or kept + gone_last > rules.retention_bytes


@given(_logs())
def test_deletes_the_whole_expired_prefix_when_no_floor_holds(
    case: tuple[list[SegmentInfo], RetentionRules, dict[str, int | None]],
) -> None:
    segs, rules, _ = case
    d = decide(segs, NOW, RetentionRules(retention_ms=1), {})
    old = [NOW - s.newest_ms > 1 for s in segs[:-1]]
    expected = next((i for i, o in enumerate(old) if not o), len(old))
    assert d.count == expected
