"""The Spark source's pure decisions (tidelog.spark.plan): tables for the rules, Hypothesis for the
properties that must hold for every input (ranges cover exactly, budgets never overshoot, offsets
never move backwards, offset maps survive Spark's JSON checkpoint)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.errors import InvalidArgumentError, OffsetBelowRetentionError
from tidelog.spark import plan
from tidelog.spark.plan import EARLIEST, LATEST, OffsetSpec, QueueState, Range, ReadOptions

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
qids = st.tuples(names, names, st.integers(0, 64))
offset_maps = st.dictionaries(qids, st.integers(0, 2**62), max_size=12)


# --- offsets as JSON ------------------------------------------------------------------------


@given(offset_maps)
def test_offsets_survive_the_json_checkpoint(offsets: dict) -> None:
    text = json.dumps(plan.offsets_to_json(offsets))
    assert plan.offsets_from_json(json.loads(text)) == offsets
    assert plan.offsets_from_json(text) == offsets


def test_offset_json_names_queues_by_broker_set_and_id() -> None:
    offsets = {("orders", "broker-a", 0): 42, ("orders", "broker-b", 3): 7, ("t:x", "a", 1): 0}
    assert plan.offsets_to_json(offsets) == {"orders": {"broker-a:0": 42, "broker-b:3": 7}, "t:x": {"a:1": 0}}


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        "[1, 2]",
        '{"t": 5}',
        '{"t": {"broker-a": 1}}',
        '{"t": {"broker-a:x": 1}}',
        '{"t": {":0": 1}}',
        '{"t": {"broker-a:0": -1}}',
        '{"t": {"broker-a:0": true}}',
        '{"t": {"broker-a:0": 1.5}}',
        '{"": {"a:0": 1}}',
    ],
)
def test_bad_offset_json_is_an_invalid_argument(bad: str) -> None:
    with pytest.raises(InvalidArgumentError):
        plan.offsets_from_json(bad)


def test_kafka_special_offsets_only_in_options() -> None:
    text = '{"t": {"a:0": -2, "a:1": -1, "a:2": 9}}'
    assert plan.offsets_from_json(text, allow_special=True) == {
        ("t", "a", 0): EARLIEST,
        ("t", "a", 1): LATEST,
        ("t", "a", 2): 9,
    }
    with pytest.raises(InvalidArgumentError):
        plan.offsets_from_json(text)
    with pytest.raises(InvalidArgumentError):
        plan.offsets_from_json('{"t": {"a:0": -3}}', allow_special=True)


# --- options --------------------------------------------------------------------------------


def test_defaults_follow_kafka_batch_reads_all_stream_starts_at_the_end() -> None:
    batch = ReadOptions.parse({"controllers": "h:1", "topic": "t"}, streaming=False)
    assert (batch.starting, batch.ending) == (OffsetSpec(EARLIEST), OffsetSpec(LATEST))
    assert (batch.include_headers, batch.fail_on_data_loss, batch.max_offsets_per_trigger) == (
        False,
        True,
        None,
    )
    stream = ReadOptions.parse({"controllers": "h:1", "topic": "t"}, streaming=True)
    assert stream.starting == OffsetSpec(LATEST)


def test_option_names_are_case_insensitive_and_values_strings() -> None:
    o = ReadOptions.parse(
        {
            "Controllers": "h:1,h:2",
            "TOPICS": "a, b",
            "startingOffsets": "earliest",
            "maxoffsetspertrigger": "500",
            "includeHeaders": "TRUE",
            "FailOnDataLoss": "false",
            "maxOffsetsPerPartition": "10",
        },
        streaming=True,
    )
    assert o.topics == ("a", "b") and o.controllers == "h:1,h:2"
    assert (
        o.max_offsets_per_trigger,
        o.include_headers,
        o.fail_on_data_loss,
        o.max_offsets_per_partition,
    ) == (500, True, False, 10)


def test_controllers_come_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plan.CONTROLLERS_ENV, "10.0.0.1:9701")
    assert ReadOptions.parse({"topic": "t"}, streaming=False).controllers == "10.0.0.1:9701"
    monkeypatch.delenv(plan.CONTROLLERS_ENV)
    with pytest.raises(InvalidArgumentError, match="controllers"):
        ReadOptions.parse({"topic": "t"}, streaming=False)


@pytest.mark.parametrize(
    "options,streaming,match",
    [
        ({}, False, "topic"),
        ({"topic": "a", "topics": "b"}, False, "not both"),
        ({"topic": "a,b"}, False, "one topic"),
        ({"topics": "a,a"}, False, "twice"),
        ({"topic": "a", "endingOffsets": "latest"}, True, "batch reads only"),
        ({"topic": "a", "maxOffsetsPerTrigger": "5"}, False, "streaming reads only"),
        ({"topic": "a", "maxOffsetsPerTrigger": "0"}, True, ">= 1"),
        ({"topic": "a", "maxOffsetsPerTrigger": "lots"}, True, "integer"),
        ({"topic": "a", "includeHeaders": "maybe"}, False, "true or false"),
        ({"topic": "a", "endingOffsets": "earliest"}, False, "reads nothing"),
        ({"topic": "a", "startingOffsets": '{"b": {"x:0": 1}}'}, False, "not read"),
        ({"topic": "a", "readTimeout": "-1"}, False, "positive"),
    ],
)
def test_bad_options_are_invalid_arguments(options: dict, streaming: bool, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        ReadOptions.parse({"controllers": "h:1", **options}, streaming=streaming)


def test_schema_has_headers_only_when_asked() -> None:
    assert plan.schema_ddl(False) == (
        "topic string, broker_set string, queue int, offset bigint, key string, "
        "tags string, body binary, timestamp timestamp"
    )
    assert plan.schema_ddl(True).endswith(", headers map<string,string>")


# --- batch planning -------------------------------------------------------------------------

A0, A1 = ("t", "a", 0), ("t", "a", 1)
STATES = [QueueState("t", "a", 0, min=0, confirmed=100), QueueState("t", "a", 1, min=20, confirmed=50)]


def ranges(starting: OffsetSpec, ending: OffsetSpec, fail: bool = True) -> dict:
    return {
        r.qid: (r.start, r.end) for r in plan.resolve_ranges(STATES, starting, ending, fail_on_data_loss=fail)
    }


def test_earliest_to_latest_is_min_to_confirmed() -> None:
    assert ranges(OffsetSpec(EARLIEST), OffsetSpec(LATEST)) == {A0: (0, 100), A1: (20, 50)}
    assert ranges(OffsetSpec(LATEST), OffsetSpec(LATEST)) == {A0: (100, 100), A1: (50, 50)}


def test_explicit_offsets_per_queue_others_take_the_default() -> None:
    assert ranges(OffsetSpec(EARLIEST, {A0: 10}), OffsetSpec(LATEST, {A0: 30})) == {
        A0: (10, 30),
        A1: (20, 50),
    }
    assert ranges(OffsetSpec(EARLIEST, {A1: LATEST}), OffsetSpec(LATEST, {A0: EARLIEST})) == {
        A0: (0, 0),
        A1: (50, 50),
    }


def test_an_end_past_the_confirmed_offset_is_clamped_to_it() -> None:
    assert ranges(OffsetSpec(EARLIEST), OffsetSpec(LATEST, {A0: 10_000}))[A0] == (0, 100)


def test_a_start_after_the_end_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="after the end"):
        ranges(OffsetSpec(EARLIEST, {A0: 60}), OffsetSpec(LATEST, {A0: 50}))


def test_queues_the_topic_lacks_are_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="do not have"):
        ranges(OffsetSpec(EARLIEST, {("t", "a", 7): 1}), OffsetSpec(LATEST))


def test_fail_on_data_loss_a_start_below_retention_fails_by_default() -> None:
    with pytest.raises(OffsetBelowRetentionError) as info:
        ranges(OffsetSpec(EARLIEST, {A1: 5}), OffsetSpec(LATEST))
    assert "failOnDataLoss=false" in str(info.value)


def test_fail_on_data_loss_false_skips_ahead_to_the_minimum() -> None:
    assert ranges(OffsetSpec(EARLIEST, {A1: 5}), OffsetSpec(LATEST), fail=False)[A1] == (20, 50)
    # Retention passed the end as well: nothing is left to read.
    assert ranges(OffsetSpec(EARLIEST, {A1: 5}), OffsetSpec(LATEST, {A1: 10}), fail=False)[A1] == (10, 10)


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000))
def test_check_start_never_reads_deleted_offsets_nor_past_the_end(
    start: int, min_offset: int, extra: int
) -> None:
    end = start + extra
    got = plan.check_start(start, min_offset, end, fail_on_data_loss=False, where="q")
    assert start <= got <= end
    assert got == start or got == min(min_offset, end)
    assert got >= min_offset or got == end
    if start < min_offset:
        with pytest.raises(OffsetBelowRetentionError):
            plan.check_start(start, min_offset, end, fail_on_data_loss=True, where="q")
    else:
        assert plan.check_start(start, min_offset, end, fail_on_data_loss=True, where="q") == start


@given(st.integers(0, 10**12), st.integers(0, 5000), st.integers(1, 700))
def test_split_ranges_cover_exactly_without_overlap(start: int, length: int, max_size: int) -> None:
    pieces = plan.split_range(start, start + length, max_size)
    assert [p for a, b in pieces for p in range(a, b)] == list(range(start, start + length))
    assert all(0 < b - a <= max_size for a, b in pieces)
    assert len(pieces) == -(-length // max_size)  # the fewest pieces
    if pieces:
        sizes = [b - a for a, b in pieces]
        assert max(sizes) - min(sizes) <= 1


def test_split_ranges_drop_empty_queues_and_keep_the_queue() -> None:
    got = plan.split_ranges([Range("t", "a", 0, 10, 10), Range("t", "a", 1, 0, 5, earliest=True)], 2)
    assert got == [
        Range("t", "a", 1, 0, 2, True),
        Range("t", "a", 1, 2, 4, True),
        Range("t", "a", 1, 4, 5, True),
    ]


# --- streaming ------------------------------------------------------------------------------


def test_next_offsets_never_move_back_and_new_queues_start_at_their_minimum() -> None:
    start = {A0: 80, ("t", "a", 9): 3}
    current, latest = plan.next_offsets(
        start, [QueueState("t", "a", 0, 0, 70), QueueState("t", "a", 1, 20, 50)]
    )
    # A lagging replica reported 70 for queue 0: the query stays at 80. Queue 9 was not reported: kept.
    assert current == {A0: 80, A1: 20, ("t", "a", 9): 3}
    assert latest == {A0: 80, A1: 50, ("t", "a", 9): 3}


starts_and_latest = st.dictionaries(
    qids, st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=10
)


@given(starts_and_latest, st.one_of(st.none(), st.integers(0, 10**6), st.integers(0, 2**63)))
def test_budget_takes_exactly_the_limit_never_overshooting_a_queue(pairs: dict, limit: int | None) -> None:
    start = {q: s for q, (s, _) in pairs.items()}
    latest = {q: s + lag for q, (s, lag) in pairs.items()}
    ends = plan.budget(start, latest, limit)
    assert set(ends) == set(latest)
    assert all(start[q] <= ends[q] <= latest[q] for q in ends)
    backlog = sum(latest[q] - start[q] for q in latest)
    assert sum(ends[q] - start[q] for q in ends) == (backlog if limit is None else min(limit, backlog))
    assert plan.budget(start, latest, limit) == ends  # deterministic


def test_budget_shares_follow_the_backlog() -> None:
    start = {A0: 0, A1: 0, ("t", "a", 2): 0}
    assert plan.budget(start, {A0: 300, A1: 100, ("t", "a", 2): 0}, 40) == {A0: 30, A1: 10, ("t", "a", 2): 0}
    # One offset over three equal queues still moves one of them.
    assert sum(plan.budget(start, {A0: 5, A1: 5, ("t", "a", 2): 5}, 1).values()) == 1


def test_budget_never_moves_a_queue_backwards() -> None:
    assert plan.budget({A0: 10}, {A0: 4}, None) == {A0: 10}


def test_stream_ranges_read_new_queues_from_their_earliest() -> None:
    got = plan.stream_ranges({A0: 5, A1: 7}, {A0: 9, A1: 7, ("t", "b", 0): 4})
    assert got == [Range("t", "a", 0, 5, 9), Range("t", "b", 0, 0, 4, earliest=True)]


def test_credentials_options_reach_the_client_and_go_together() -> None:
    from tidelog.spark.plan import Connection, ReadOptions

    opts = ReadOptions.parse(
        {"controllers": "h:1", "topic": "t", "caFile": "ca.pem", "accessKey": "AK1234", "secretKey": "sk"},
        streaming=False,
    )
    assert opts.connection.client_options() == {
        "ca_file": "ca.pem",
        "access_key": "AK1234",
        "secret_key": "sk",
    }
    assert ReadOptions.parse({"controllers": "h:1", "topic": "t"}, streaming=False).connection == Connection()
    with pytest.raises(InvalidArgumentError, match="go together"):
        ReadOptions.parse({"controllers": "h:1", "topic": "t", "accessKey": "AK1234"}, streaming=False)
