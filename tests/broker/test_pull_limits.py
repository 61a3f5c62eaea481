"""The Pull limits: what a request asks for is clamped to the broker's maximum, and the maximum
itself is refused at start-up when a reply could not fit in a gRPC message."""

from __future__ import annotations

import pytest

from tidelog.broker.config import MAX_PULL_BYTES_LIMIT, from_mapping
from tidelog.broker.service import DEFAULT_PULL_BYTES, DEFAULT_PULL_MESSAGES, pull_limits
from tidelog.errors import ConfigError

LIMITS = dict(max_pull_messages=10_000, max_pull_bytes=16 << 20)


@pytest.mark.parametrize(
    ("asked", "got"),
    [
        ((0, 0), (DEFAULT_PULL_MESSAGES, DEFAULT_PULL_BYTES)),
        ((5, 1000), (5, 1000)),
        ((2**31 - 1, 2**62), (10_000, 16 << 20)),
        ((10_001, (16 << 20) + 1), (10_000, 16 << 20)),
    ],
)
def test_limits_are_clamped_not_refused(asked: tuple[int, int], got: tuple[int, int]) -> None:
    assert pull_limits(*asked, **LIMITS) == got


def test_max_pull_bytes_must_fit_in_a_grpc_message() -> None:
    base = {"broker_set": "a", "data_dir": "/tmp/x", "controllers": "127.0.0.1:1"}
    assert (
        from_mapping({**base, "max_pull_bytes": MAX_PULL_BYTES_LIMIT}).max_pull_bytes == MAX_PULL_BYTES_LIMIT
    )
    for bad in (MAX_PULL_BYTES_LIMIT + 1, 0, -1):
        with pytest.raises(ConfigError) as err:
            from_mapping({**base, "max_pull_bytes": bad})
        assert err.value.details["key"] == "max_pull_bytes"
    with pytest.raises(ConfigError):
        from_mapping({**base, "max_pull_messages": 0})
