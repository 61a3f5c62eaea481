"""first_answer: the speculative-read rule (client/hedge.py), driven with fake replicas."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tidelog.client.hedge import AllFailed, first_answer, until_superseded
from tidelog.errors import TopicNotFoundError, UnavailableError
from tidelog.tasks import within

SILENT = None  # a replica that never answers


def run(replicas: dict[str, object], after_s: float = 0.05, give_up=lambda _e: False):
    asked: list[str] = []
    cancelled: list[str] = []

    async def attempt(name: str) -> str:
        asked.append(name)
        behaviour = replicas[name]
        try:
            if behaviour is SILENT:
                await asyncio.sleep(3600)
            delay, outcome = behaviour  # type: ignore[misc]
            await asyncio.sleep(delay)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def main():
        return await within(first_answer(list(replicas), attempt, after_s=after_s, give_up=give_up), 5)

    return asyncio.run(main()), asked, cancelled


def test_a_silent_first_replica_is_passed_over_and_cancelled() -> None:
    (who, what), asked, cancelled = run({"slave": SILENT, "master": (0, "data")})
    assert (who, what) == ("master", "data") and asked == ["slave", "master"] and cancelled == ["slave"]


def test_a_quick_answer_asks_nobody_else() -> None:
    (who, what), asked, _ = run({"slave": (0, "s"), "master": (0, "m")}, after_s=60)
    assert (who, what, asked) == ("slave", "s", ["slave"])


def test_a_failure_moves_on_at_once() -> None:
    (who, _), asked, _ = run({"a": (0, UnavailableError("down")), "b": (0, "ok")}, after_s=60)
    assert who == "b" and asked == ["a", "b"]


def test_a_slow_first_answer_still_wins_if_it_comes_first() -> None:
    (who, _), asked, cancelled = run({"a": (0.1, "late"), "b": SILENT}, after_s=0.05)
    assert who == "a" and asked == ["a", "b"] and cancelled == ["b"]


def test_all_failing_reports_every_error() -> None:
    with pytest.raises(AllFailed) as info:
        run({"a": (0, UnavailableError("x")), "b": (0, TopicNotFoundError("y"))})
    assert list(info.value.errors) == ["a", "b"]


def test_a_final_error_is_raised_at_once() -> None:
    with pytest.raises(ValueError):
        run(
            {"a": (0, ValueError("bad request")), "b": (0, "never asked")},
            give_up=lambda e: isinstance(e, ValueError),
        )


def test_no_candidates() -> None:
    with pytest.raises(AllFailed) as info:
        run({})
    assert info.value.errors == {}


def test_a_call_that_fails_as_its_caller_gives_up_is_not_reported_as_lost() -> None:
    """until_superseded: when the caller is cancelled just as its call ends with an error (a ledger
    writer fenced while its batch's answer arrives), the caller gets one of the two, and asyncio
    reports nothing as "Task exception was never retrieved"."""
    reported: list[dict[str, object]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        gate = asyncio.Event()

        async def call() -> None:
            await gate.wait()
            raise UnavailableError("fenced meanwhile")

        async def newer_epoch() -> int | None:
            return None

        outer = asyncio.ensure_future(until_superseded(call(), "broker-a", "127.0.0.1:1", 1, newer_epoch))
        await asyncio.sleep(0)  # the caller now waits for its call
        gate.set()
        await asyncio.sleep(0)  # the call ends with its error
        outer.cancel()
        with pytest.raises((asyncio.CancelledError, UnavailableError)):
            await outer
        del outer
        gc.collect()  # an unretrieved exception is reported when its task is collected

    asyncio.run(scenario())
    assert not [ctx for ctx in reported if "never retrieved" in str(ctx.get("message"))], reported


def test_a_call_answered_in_time_runs_in_its_callers_task() -> None:
    """until_superseded makes no task for a call answered within STALE_AFTER_S: the call runs in
    the caller's own task (one turn of the loop less per Produce request and ledger add)."""

    async def scenario() -> tuple[object, object, int]:
        seen: list[object] = []

        async def call() -> str:
            seen.append(asyncio.current_task())
            await asyncio.sleep(0)
            return "ok"

        async def newer_epoch() -> int | None:
            raise AssertionError("a quick call needs no lookup")

        before = len(asyncio.all_tasks())
        assert await until_superseded(call(), "broker-a", "127.0.0.1:1", 1, newer_epoch) == "ok"
        return seen[0], asyncio.current_task(), len(asyncio.all_tasks()) - before

    inner, caller, extra_tasks = asyncio.run(scenario())
    assert inner is caller
    assert extra_tasks == 0


def test_a_cancellation_from_the_caller_stays_a_cancellation_when_a_newer_master_appears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch abandons a silent call by cancelling the caller's task and answering UNAVAILABLE
    instead; a cancellation of that task by someone else at the same time must still arrive as a
    cancellation, not be swallowed into UNAVAILABLE."""
    from tidelog.client import hedge

    monkeypatch.setattr(hedge, "STALE_AFTER_S", 0.01)
    monkeypatch.setattr(hedge, "ROUTE_POLL_S", 0.01)

    async def scenario() -> None:
        outer: asyncio.Task[None] | None = None

        async def call() -> None:
            await asyncio.sleep(3600)

        async def newer_epoch() -> int | None:
            assert outer is not None
            outer.cancel()  # the caller's owner gives up just as the lookup names a newer master
            return 2

        outer = asyncio.ensure_future(until_superseded(call(), "broker-a", "127.0.0.1:1", 1, newer_epoch))
        with pytest.raises(asyncio.CancelledError):
            await within(outer, 5)

    asyncio.run(scenario())


# until_superseded, as a table: (how long the call takes and what it ends with, the epochs the
# controllers name at each lookup) → what the caller gets, and whether the call was cancelled.
SUPERSEDED_CASES = [
    # a quick answer: no lookup at all
    ("quick", (0.0, "ok"), [], "ok", False),
    # a quick failure is the caller's error as it is
    ("quick failure", (0.0, TopicNotFoundError("gone")), [], TopicNotFoundError, False),
    # slow, and the controllers still name this master: the call is kept and its answer wins
    ("slow, same master", (0.3, "ok"), [1, 1, 1, 1, 1, 1, 1, 1], "ok", False),
    # slow, and a lookup fails: still kept
    ("slow, lookups fail", (0.3, "ok"), [RuntimeError("no controller")] * 8, "ok", False),
    # silent, and a newer master appears: abandoned with UNAVAILABLE, the call cancelled
    ("silent, newer master", (None, None), [1, 2], UnavailableError, True),
]


@pytest.mark.parametrize(
    ("behaviour", "epochs", "expected", "cancelled"),
    [case[1:] for case in SUPERSEDED_CASES],
    ids=[case[0] for case in SUPERSEDED_CASES],
)
def test_until_superseded(monkeypatch: pytest.MonkeyPatch, behaviour, epochs, expected, cancelled) -> None:
    from tidelog.client import hedge

    monkeypatch.setattr(hedge, "STALE_AFTER_S", 0.05)
    monkeypatch.setattr(hedge, "ROUTE_POLL_S", 0.03)
    lookups: list[object] = []
    was_cancelled: list[bool] = []

    async def call() -> str:
        delay, outcome = behaviour
        try:
            await asyncio.sleep(3600 if delay is None else delay)
        except asyncio.CancelledError:
            was_cancelled.append(True)
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def newer_epoch() -> int | None:
        answer = epochs[min(len(lookups), len(epochs) - 1)]
        lookups.append(answer)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def main() -> str:
        return await within(until_superseded(call(), "broker-a", "127.0.0.1:1", 1, newer_epoch), 5)

    if isinstance(expected, type):
        with pytest.raises(expected):
            asyncio.run(main())
    else:
        assert asyncio.run(main()) == expected
    assert bool(was_cancelled) == cancelled
    assert bool(lookups) == bool(epochs)  # lookups only once the call is slow
