"""A broker that listens on a wildcard or behind NAT registers the address others can reach."""

from __future__ import annotations

import pytest

from tidelog.broker.config import from_mapping
from tidelog.errors import ConfigError

BASE = {"broker_set": "broker-a", "data_dir": "/tmp/x", "controllers": "127.0.0.1:1", "secret": "s"}


def test_the_listen_address_is_advertised_unless_another_is_given() -> None:
    cfg = from_mapping({**BASE, "listen": "10.0.0.5:7200", "ha_listen": "10.0.0.5:7201"})
    assert (cfg.advertised, cfg.ha_advertised) == ("10.0.0.5:7200", "10.0.0.5:7201")
    cfg = from_mapping(
        {
            **BASE,
            "listen": "0.0.0.0:7200",
            "ha_listen": "0.0.0.0:7201",
            "advertise_address": "broker-a-0.dc-a:7200",
            "ha_advertise_address": "10.0.0.5:7201",
        }
    )
    assert (cfg.advertised, cfg.ha_advertised) == ("broker-a-0.dc-a:7200", "10.0.0.5:7201")


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"listen": "0.0.0.0:7200"}, "advertise_address"),
        ({"ha_listen": "0.0.0.0:7201"}, "ha_advertise_address"),
        ({"advertise_address": "0.0.0.0:7200"}, "advertise_address"),
        ({"advertise_address": "no-port"}, "advertise_address"),
    ],
)
def test_an_address_nobody_can_reach_is_refused(doc: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_mapping({**BASE, **doc})
    assert err.value.details.get("key") == key
