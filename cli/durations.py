"""Durations on the command line: `--retention 30s|15m|2h|7d` to milliseconds and back."""

from __future__ import annotations

import re

import click

__all__ = ["format_retention", "parse_retention", "retention_option"]

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"(\d+)(ms|s|m|h|d)")


def parse_retention(text: str) -> int:
    """A retention in ms: `0` or `default` (the brokers' own retention_ms) is 0, else a whole
    number with a unit — 500ms, 30s, 15m, 2h, 7d. ValueError names what is accepted."""
    word = text.strip().lower()
    if word in ("0", "default"):
        return 0
    m = _PATTERN.fullmatch(word)
    if m is None:
        raise ValueError(
            f"{text!r} is not a retention: use a whole number with a unit (500ms, 30s, 15m, 2h, 7d), "
            "or 0 / default for the brokers' retention_ms"
        )
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def format_retention(ms: int) -> str:
    """`parse_retention`'s inverse for display: the largest unit that divides it ("broker" for 0)."""
    if ms == 0:
        return "broker"
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def retention_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """The click callback of a `--retention` option: its value in ms (None when not given)."""
    if value is None:
        return None
    try:
        return parse_retention(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
