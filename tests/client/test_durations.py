"""`--retention DURATION` on the command line (cli/durations.py): what it accepts, what it
refuses with a message naming the accepted forms, and the display form that reads back."""

from __future__ import annotations

import pytest

from tidelog.cli.durations import format_retention, parse_retention


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("default", 0),
        (" Default ", 0),
        ("500ms", 500),
        ("30s", 30_000),
        ("15m", 900_000),
        ("2h", 7_200_000),
        ("7d", 604_800_000),
        ("3S", 3000),
    ],
)
def test_accepted(text: str, ms: int) -> None:
    assert parse_retention(text) == ms


@pytest.mark.parametrize("text", ["", "5", "-1s", "1.5h", "1w", "s", "1h30m", "forever", "0s0"])
def test_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="30s, 15m, 2h, 7d"):
        parse_retention(text)


@pytest.mark.parametrize(
    ("ms", "shown"),
    [(0, "broker"), (500, "500ms"), (3000, "3s"), (90_000, "90s"), (7_200_000, "2h"), (86_400_000, "1d")],
)
def test_shown_in_the_largest_unit_that_divides_it(ms: int, shown: str) -> None:
    assert format_retention(ms) == shown
    assert ms == 0 or parse_retention(shown) == ms
