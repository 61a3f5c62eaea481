"""Signed membership calls and the heartbeat rule, as pure functions (tidelog.clusterauth, liveness)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.procs import free_port
from tidelog.clusterauth import CALL_WINDOW_MS, ReplayCache, check_call, sign_call
from tidelog.controller.liveness import heartbeat_problem
from tidelog.errors import ConfigError, UnauthenticatedError

SECRET = "s3cret"
NOW = 1_800_000_000_000

calls = st.tuples(
    st.sampled_from(["Heartbeat", "RegisterBroker", "ElectMaster"]),
    st.binary(max_size=64),
    st.text(min_size=1, max_size=20),
    st.integers(-1, 2**40),
)


@given(calls)
def test_a_signed_call_verifies_once_for_its_own_fields(call) -> None:  # type: ignore[no-untyped-def]
    method, request, broker_set, broker_id = call
    token = sign_call(SECRET, method, request, broker_set, broker_id, NOW)
    seen = ReplayCache()
    ident = check_call(SECRET, token, method, request, NOW + 1000, seen)
    assert (ident.broker_set, ident.broker_id) == (broker_set, broker_id)
    with pytest.raises(UnauthenticatedError, match="replay"):
        check_call(SECRET, token, method, request, NOW + 1000, seen)


@given(calls, calls)
def test_a_token_is_worthless_for_another_call_or_secret(a, b) -> None:  # type: ignore[no-untyped-def]
    token = sign_call(SECRET, a[0], a[1], a[2], a[3], NOW)
    with pytest.raises(UnauthenticatedError):
        check_call("another", token, a[0], a[1], NOW, ReplayCache())
    if (a[0], a[1]) != (b[0], b[1]):
        with pytest.raises(UnauthenticatedError):
            check_call(SECRET, token, b[0], b[1], NOW, ReplayCache())


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "v1",
        "v2:00:1:2:00:00",
        "v1:zz:1:2:00:00",
        "x" * 1000,
        "v1:61:1:2:" + "00" * 16 + ":" + "00" * 32,
    ],
)
def test_malformed_or_forged_tokens_are_refused(token) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnauthenticatedError):
        check_call(SECRET, token, "Heartbeat", b"", NOW, ReplayCache())


@pytest.mark.parametrize("skew", [-CALL_WINDOW_MS - 1, CALL_WINDOW_MS + 1])
def test_stale_or_future_tokens_are_refused(skew: int) -> None:
    token = sign_call(SECRET, "Heartbeat", b"", "a", 1, NOW + skew)
    with pytest.raises(UnauthenticatedError, match="clock"):
        check_call(SECRET, token, "Heartbeat", b"", NOW, ReplayCache())


def test_the_replay_cache_forgets_old_nonces_and_stays_bounded() -> None:
    cache = ReplayCache(window_ms=1000, limit=10)
    for i in range(50):
        assert cache.add(i.to_bytes(16, "big"), NOW + i)
    assert len(cache._seen) <= 10
    assert cache.add((49).to_bytes(16, "big"), NOW + 60) is False


@pytest.mark.parametrize(
    ("set_epoch", "epoch", "max_offset", "confirm", "problem"),
    [
        (3, 3, 100, 100, None),
        (3, -1, 0, -1, None),  # a new broker: no epoch yet, confirm not reported
        (3, 2, 100, 50, None),  # a slave that has not seen the latest epoch
        (3, 4, 100, 100, "beyond"),  # an epoch the controller never assigned
        (3, 2**62, 0, 0, "beyond"),
        (3, -2, 0, 0, "not an epoch"),
        (3, 1, -1, -1, "negative"),
        (3, 1, 10, 11, "confirm offset"),
        (3, 1, 10, -2, "confirm offset"),
        (3, 1, 2**53 - 1, 2**53 - 1, None),
        (3, 1, 2**53, 0, "2^53"),
        (3, 1, 2**63 - 1, 0, "2^53"),
    ],
)
def test_heartbeat_claims(
    set_epoch: int, epoch: int, max_offset: int, confirm: int, problem: str | None
) -> None:
    got = heartbeat_problem(set_epoch, epoch, max_offset, confirm)
    assert (got is None) if problem is None else (got is not None and problem in got)


def test_operators_find_the_secret_from_a_file_the_environment_or_the_cluster_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidelog.clusterauth import SECRET_ENV, find_secret
    from tidelog.errors import InsecurePermissionsError

    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert find_secret(None, str(tmp_path)) is None  # nothing anywhere
    (tmp_path / "controller.yaml").write_text("secret: from-the-cluster\nnodes: []\n")
    assert find_secret(None, str(tmp_path)) == "from-the-cluster"  # what `tide cluster up` wrote
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert find_secret(None, str(tmp_path)) == "from-env"
    f = tmp_path / "secret"
    f.write_text("from-file\n")
    f.chmod(0o644)
    with pytest.raises(InsecurePermissionsError, match="chmod 600"):
        find_secret(str(f), str(tmp_path))  # a secret other accounts can read
    f.chmod(0o600)
    assert find_secret(str(f), str(tmp_path)) == "from-file"
    f.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        find_secret(str(f), None)
    with pytest.raises(ConfigError, match="cannot read"):
        find_secret(str(tmp_path / "missing"), None)


def test_the_examples_placeholder_secret_stops_a_controller_and_a_broker(tmp_path: Path) -> None:
    import yaml

    from tidelog.clusterauth import PLACEHOLDER_SECRETS
    from tidelog.controller.config import load
    from tidelog.controller.node import ControllerNode

    placeholder = next(iter(PLACEHOLDER_SECRETS))
    # the example in deploy/ carries it: starting from the example unchanged must fail
    assert placeholder in (Path(__file__).resolve().parents[2] / "deploy" / "controller-1.yaml").read_text()
    doc = {
        "data_dir": str(tmp_path / "c"),
        "secret": placeholder,
        "nodes": [{"id": "c1", "raft": "127.0.0.1:1", "grpc": "127.0.0.1:2"}],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="placeholder"):
        ControllerNode(load(tmp_path / "c.yaml"))
    broker = {
        "broker_set": "b",
        "data_dir": str(tmp_path / "b"),
        "controllers": "127.0.0.1:1",
        "listen": f"127.0.0.1:{free_port()}",
        "ha_listen": f"127.0.0.1:{free_port()}",
        "secret": placeholder,
    }
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(broker))
    env = {k: v for k, v in os.environ.items() if k != "TIDE_CLUSTER_SECRET"}
    out = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "broker", "--config", str(tmp_path / "b.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0 and "placeholder" in out.stderr, out.stderr[-2000:]


def test_a_full_replay_cache_never_forgets_a_replayable_nonce() -> None:
    # 10 calls fill the cache within one window; the 11th forces out the first, which is still
    # inside the clock window: replaying it must fail, and so must anything signed as early.
    cache = ReplayCache(window_ms=1000, limit=10)
    nonces = [i.to_bytes(16, "big") for i in range(11)]
    for i, n in enumerate(nonces):
        assert cache.add(n, NOW + i, NOW + i)
    assert nonces[0] not in cache._seen
    assert not cache.admits(NOW) and cache.admits(NOW + 1)
    assert cache.add(nonces[0], NOW + 20, NOW) is False
    assert cache.add(b"\xff" * 16, NOW + 20, NOW + 20)  # a fresh call still passes


def test_a_replay_after_a_flood_is_refused_end_to_end() -> None:
    seen = ReplayCache(limit=5)
    first = sign_call(SECRET, "Heartbeat", b"x", "a", 1, NOW)
    check_call(SECRET, first, "Heartbeat", b"x", NOW, seen)
    for i in range(5):  # a burst of valid calls signed later pushes `first` out
        check_call(
            SECRET,
            sign_call(SECRET, "Heartbeat", b"x", "a", 1, NOW + 1 + i),
            "Heartbeat",
            b"x",
            NOW + 1 + i,
            seen,
        )
    with pytest.raises(UnauthenticatedError, match="sign the call again"):
        check_call(SECRET, first, "Heartbeat", b"x", NOW + 10, seen)
