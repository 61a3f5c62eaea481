"""The pace of a client's group commits to one master (client/commitpace.py): properties over any
run of commits, answers and ticks, and the scenarios of its docstring as a table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.commitpace import Added, Answered, CommitPace, Send, Tick, Unit, WakeAt
from tidelog.errors import InvalidArgumentError
from tidelog.invariants import InvariantViolation

INTERVAL = 0.05
MAX = 10

# ("add", size) | ("answer",) | ("tick",), each after a pause of 0-120 ms
_events = st.lists(
    st.tuples(
        st.integers(0, 120),
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 14)),
            st.just(("answer",)),
            st.just(("tick",)),
        ),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_events)
def test_units_leave_whole_in_order_one_call_at_a_time_and_spaced_unless_a_full_call_waits(
    events: list[tuple[int, tuple]],
) -> None:
    pace = CommitPace(INTERVAL, MAX)
    now, serial = 0.0, 0
    sent: list[int] = []  # unit serials, in the order they left
    waiting: list[Unit] = []  # the model: what has not left yet
    out = False
    last: float | None = None
    for pause_ms, event in events:
        now += pause_ms / 1000
        if event[0] == "answer" and not out:
            continue  # the shell never reports an answer without a call out
        if event[0] == "add":
            unit = Unit(event[1], serial)
            serial += 1
            waiting.append(unit)
            actions = pace.step(Added(unit), now)
        elif event[0] == "answer":
            out = False
            actions = pace.step(Answered(), now)
        else:
            actions = pace.step(Tick(), now)
        assert len(actions) <= 1
        for action in actions:
            if isinstance(action, WakeAt):
                assert not out and waiting and last is not None
                assert action.at == last + INTERVAL > now  # the wait is the spacing, nothing more
                continue
            assert isinstance(action, Send) and not out  # never two calls out
            full = sum(u.size for u in waiting) >= MAX
            assert last is None or now - last >= INTERVAL - 1e-9 or full
            units = list(action.units)
            assert units == waiting[: len(units)]  # oldest first, whole
            total = sum(u.size for u in units)
            assert total <= MAX or len(units) == 1  # a unit over the limit goes alone
            rest = waiting[len(units) :]
            assert not rest or total + rest[0].size > MAX  # as much as fits
            sent.extend(u.token for u in units)
            del waiting[: len(units)]
            out, last = True, now
        # nothing is stranded: with no call out, whatever waits has left or has a wake-up coming
        if not out and waiting:
            assert actions and isinstance(actions[0], WakeAt)
    assert sent == list(range(len(sent)))


@pytest.mark.parametrize(
    ("name", "steps", "want"),
    [
        (
            "a lone commit on an idle pace leaves at once",
            [(0.0, Added(Unit(1, "a")))],
            [Send((Unit(1, "a"),))],
        ),
        (
            "a commit while a call is out waits for the answer and the spacing",
            [(0.0, Added(Unit(1, "a"))), (0.01, Added(Unit(2, "b"))), (0.02, Answered())],
            [WakeAt(0.05)],
        ),
        (
            "the wake-up sends every waiting unit in one call",
            [
                (0.0, Added(Unit(1, "a"))),
                (0.01, Added(Unit(2, "b"))),
                (0.02, Added(Unit(3, "c"))),
                (0.03, Answered()),
                (0.05, Tick()),
            ],
            [Send((Unit(2, "b"), Unit(3, "c")))],
        ),
        (
            "an answer after the spacing sends at once",
            [(0.0, Added(Unit(1, "a"))), (0.01, Added(Unit(1, "b"))), (0.2, Answered())],
            [Send((Unit(1, "b"),))],
        ),
        (
            "a full call waiting leaves on the answer, spacing or not",
            [
                (0.0, Added(Unit(1, "a"))),
                (0.001, Added(Unit(6, "b"))),
                (0.002, Added(Unit(4, "c"))),
                (0.003, Answered()),
            ],
            [Send((Unit(6, "b"), Unit(4, "c")))],
        ),
        (
            "a unit over the limit goes alone",
            [(0.0, Added(Unit(25, "big")))],
            [Send((Unit(25, "big"),))],
        ),
        (
            "an early tick does nothing new",
            [(0.0, Added(Unit(1, "a"))), (0.001, Answered()), (0.002, Added(Unit(1, "b"))), (0.003, Tick())],
            [WakeAt(0.05)],
        ),
    ],
)
def test_documented_scenarios(name: str, steps: list, want: list) -> None:
    pace = CommitPace(INTERVAL, MAX)
    actions: list = []
    for now, event in steps:
        actions = pace.step(event, now)
    assert actions == want, name


def test_an_answer_with_no_call_out_is_a_bug_that_stops() -> None:
    with pytest.raises(InvariantViolation):
        CommitPace(INTERVAL, MAX).step(Answered(), 0.0)


@pytest.mark.parametrize("interval", [-0.001, 61.0])
def test_the_interval_is_checked(interval: float) -> None:
    with pytest.raises(InvalidArgumentError):
        CommitPace(interval, MAX)
