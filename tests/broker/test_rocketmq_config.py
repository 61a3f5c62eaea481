"""The RocketMQ endpoint's keys in the broker configuration (deploy/CONFIG.md): the access keys (a
list of {access_key, secret_key}) and the groups' retry policy, checked up front, each problem a
ConfigError naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.broker.config import from_mapping
from tidelog.errors import ConfigError

BASE = {"broker_set": "a", "data_dir": "data", "controllers": "127.0.0.1:1", "secret": "s"}


def test_no_access_keys_by_default_and_a_one_minute_clock_bound() -> None:
    cfg = from_mapping(BASE)
    assert cfg.rocketmq_access_keys == ()
    assert cfg.rocketmq_auth_max_skew_s == 60


def test_access_keys_are_taken_in_order() -> None:
    keys = [{"access_key": "app-1", "secret_key": "x"}, {"access_key": "app.2", "secret_key": "y z"}]
    cfg = from_mapping({**BASE, "rocketmq_access_keys": keys, "rocketmq_auth_max_skew_s": 0})
    assert cfg.rocketmq_access_keys == (("app-1", "x"), ("app.2", "y z"))
    assert cfg.rocketmq_auth_max_skew_s == 0


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("ak:sk", "rocketmq_access_keys"),
        ([["ak", "sk"]], "rocketmq_access_keys[0]"),
        ([{"access_key": "ak"}], "rocketmq_access_keys[0]"),
        ([{"access_key": "ak", "secret_key": "sk", "role": "admin"}], "rocketmq_access_keys[0]"),
        ([{"access_key": "", "secret_key": "sk"}], "rocketmq_access_keys[0].access_key"),
        ([{"access_key": "a, b", "secret_key": "sk"}], "rocketmq_access_keys[0].access_key"),
        ([{"access_key": "ak", "secret_key": ""}], "rocketmq_access_keys[0].secret_key"),
        ([{"access_key": "ak", "secret_key": 12}], "rocketmq_access_keys[0].secret_key"),
        (
            [{"access_key": "ak", "secret_key": "1"}, {"access_key": "ak", "secret_key": "2"}],
            "rocketmq_access_keys[1]",
        ),
    ],
)
def test_malformed_access_keys_are_refused_naming_the_key(value: Any, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, "rocketmq_access_keys": value})
    assert err.value.details.get("key") == key


def test_a_negative_clock_bound_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, "rocketmq_auth_max_skew_s": -1})
    assert err.value.details.get("key") == "rocketmq_auth_max_skew_s"


def test_delay_and_transaction_bounds_default_to_rocketmqs() -> None:
    cfg = from_mapping(BASE)
    assert cfg.rocketmq_max_delay_ms == 40 * 24 * 3600 * 1000
    assert (cfg.rocketmq_tx_check_interval_ms, cfg.rocketmq_tx_max_checks) == (30_000, 15)


@pytest.mark.parametrize(
    "key", ["rocketmq_max_delay_ms", "rocketmq_tx_check_interval_ms", "rocketmq_tx_max_checks"]
)
def test_delay_and_transaction_bounds_are_positive(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, key: 0})
    assert err.value.details["key"] == key


def test_the_retry_policy_is_rocketmqs_by_default_and_can_be_shortened() -> None:
    cfg = from_mapping(BASE)
    assert cfg.rocketmq_max_delivery_attempts == 16
    assert cfg.rocketmq_retry_backoff_s[:4] == (1, 5, 10, 30) and cfg.rocketmq_retry_backoff_s[-1] == 7200
    cfg = from_mapping({**BASE, "rocketmq_max_delivery_attempts": 3, "rocketmq_retry_backoff_s": [1, 2]})
    assert (cfg.rocketmq_max_delivery_attempts, cfg.rocketmq_retry_backoff_s) == (3, (1, 2))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rocketmq_max_delivery_attempts", 0),
        ("rocketmq_max_delivery_attempts", 1001),
        ("rocketmq_max_delivery_attempts", "3"),
        ("rocketmq_retry_backoff_s", []),
        ("rocketmq_retry_backoff_s", [1, 0]),
        ("rocketmq_retry_backoff_s", [0.5]),
        ("rocketmq_retry_backoff_s", [12 * 3600 + 1]),
        ("rocketmq_retry_backoff_s", "1,2"),
    ],
)
def test_a_malformed_retry_policy_is_refused_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, key: value})
    assert err.value.details.get("key") == key


def test_tide_broker_overrides_a_config_that_lists_access_keys(tmp_path: Any, monkeypatch: Any) -> None:
    """`tide broker --config F --data-dir D ...` puts the overrides over the file's keys before they
    are parsed (it used to re-parse the parsed config, whose access keys no longer read as a list
    of mappings: CONFIG_INVALID)."""
    import yaml
    from click.testing import CliRunner

    from tidelog.broker import server
    from tidelog.cli import broker as broker_cli

    keys = [{"access_key": "app-1", "secret_key": "x"}]
    path = tmp_path / "broker.yaml"
    path.write_text(yaml.safe_dump({**BASE, "rocketmq_access_keys": keys}))
    path.chmod(0o600)
    started: list[Any] = []
    monkeypatch.setattr(server, "run", started.append)  # the config it would run with; no broker
    out = CliRunner().invoke(
        broker_cli.broker,
        ["--config", str(path), "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:7001"],
    )
    assert out.exit_code == 0, out.output
    (cfg,) = started
    assert cfg.rocketmq_access_keys == (("app-1", "x"),)
    assert str(cfg.data_dir) == str(tmp_path / "d") and cfg.listen == "127.0.0.1:7001"


def test_the_push_consumers_invisible_time_is_a_setting_bounded_by_twelve_hours() -> None:
    assert from_mapping(BASE).rocketmq_invisible_ms == 30_000
    assert from_mapping({**BASE, "rocketmq_invisible_ms": 2_000}).rocketmq_invisible_ms == 2_000
    for bad in (0, 12 * 3600 * 1000 + 1):
        with pytest.raises(ConfigError) as err:
            from_mapping({**BASE, "rocketmq_invisible_ms": bad})
        assert err.value.details["key"] == "rocketmq_invisible_ms"
