"""Planning a read across a segmented log's ledgers: where a position falls in the list, and
which spans of which ledgers to read given the ledger ends known so far. Pure.

A CLOSED ledger is read to its last entry id, the last (open) ledger up to its LAC; a reader
never sees an entry a recovery could drop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tidelog.errors import IncorrectParameterError
from tidelog.ledger.metadata import is_int
from tidelog.ledger.seglog_record import Position, check_position

__all__ = ["LedgerEnd", "ReadPlan", "Span", "locate", "plan_read"]


class LedgerEnd(NamedTuple):
    """What a reader knows of a ledger's end: the last readable entry id (−1: none) and whether it is final."""

    last: int
    closed: bool


class Span(NamedTuple):
    ledger_id: int
    first: int
    last: int


class ReadPlan(NamedTuple):
    """What to read next: spans in log order, the position after them, and a ledger whose end is
    needed to plan further (None when the plan is complete)."""

    spans: tuple[Span, ...]
    next_position: Position
    need: int | None


def locate(ledgers: Sequence[int], position: Position) -> tuple[int, int]:
    """(index in `ledgers`, entry id) where reading from `position` starts.

    The first ledger whose id is ≥ the position's: at the position's entry if it is that ledger,
    at entry 0 of a later one (the position's ledger is gone from the list, e.g. trimmed).
    `(len(ledgers), 0)` when the position is after every ledger.
    """
    for index, lid in enumerate(ledgers):
        if lid == position.ledger_id:
            return index, position.entry_id
        if lid > position.ledger_id:
            return index, 0
    return len(ledgers), 0


def plan_read(
    ledgers: Sequence[int], ends: Mapping[int, LedgerEnd], start: Position, max_entries: int
) -> ReadPlan:
    """Plan reading up to `max_entries` entries from `start`, with the ledger ends known so far.

    Walks the list from `start`: a ledger with a known end gives the span [entry, min(end, ...)];
    a CLOSED ledger read to its end moves on to entry 0 of the next; an open one stops the walk
    (nothing past it is readable yet). A ledger whose end is not in `ends` stops the walk with
    `need` set to it: the caller learns its end and plans again. Pure.
    """
    if not is_int(max_entries) or max_entries < 1:
        raise IncorrectParameterError(f"max_entries must be a positive integer, got {max_entries!r}")
    start = check_position(start)
    index, entry = locate(ledgers, start)
    spans: list[Span] = []
    left = max_entries
    position = start
    while index < len(ledgers):
        lid = ledgers[index]
        position = Position(lid, entry)
        end = ends.get(lid)
        if end is None:
            return ReadPlan(tuple(spans), position, lid)
        if entry <= end.last:
            last = min(end.last, entry + left - 1)
            spans.append(Span(lid, entry, last))
            left -= last - entry + 1
            entry = last + 1
            position = Position(lid, entry)
        if left == 0 or not end.closed or entry <= end.last:
            break
        index, entry = index + 1, 0
    return ReadPlan(tuple(spans), position, None)
