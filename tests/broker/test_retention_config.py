"""The retention keys of the broker configuration (deploy/CONFIG.md): defaults, and a clear
ConfigError naming the key for each bad value."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.broker import config
from tidelog.errors import ConfigError

BASE = {"broker_set": "a", "data_dir": "/tmp/x", "controllers": "127.0.0.1:1", "secret": "s" * 32}


def _cfg(**keys: Any) -> config.BrokerConfig:
    return config.from_mapping({**BASE, **keys})


def test_defaults_keep_three_days_and_check_every_ten_seconds() -> None:
    cfg = _cfg()
    assert cfg.retention_ms == 72 * 3600 * 1000
    assert cfg.retention_bytes == 0
    assert cfg.retention_check_interval_ms == 10_000
    assert cfg.retention_respect_groups == ()
    assert cfg.retention_slave_hold_ms == 3600 * 1000


def test_values_are_taken() -> None:
    cfg = _cfg(
        retention_ms=0,
        retention_bytes=1 << 30,
        retention_check_interval_ms=500,
        retention_respect_groups=["g1", "g2"],
    )
    assert (cfg.retention_ms, cfg.retention_bytes, cfg.retention_check_interval_ms) == (0, 1 << 30, 500)
    assert cfg.retention_respect_groups == ("g1", "g2")


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("retention_ms", -1, "must not be negative"),
        ("retention_bytes", "1G", "must be an integer"),
        ("retention_check_interval_ms", 0, "must be positive"),
        ("retention_slave_hold_ms", -5, "must not be negative"),
        ("retention_respect_groups", "g1", "list of consumer-group names"),
        ("retention_respect_groups", ["g1", ""], "list of consumer-group names"),
        ("retention_respect_groups", [3], "list of consumer-group names"),
    ],
)
def test_bad_values_are_refused_naming_the_key(key: str, value: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        _cfg(**{key: value})
    assert info.value.details.get("key") == key or key in str(info.value)
