"""A newcomer's paper cuts, each as it was seen: start-up failures that said "retry later" after
a config error's own hint, hints that pointed at the wrong limit, tables folded at 80 columns in
a pipe, gRPC's own log lines on a port in use, no word while an unreachable controller is
retried (and no way to shorten that wait), tracebacks on SIGTERM, no way to restart one process
of a local cluster, and a `tide consume` that read one message a poll after its first 500."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.client.conftest import LocalCluster, tide
from tests.client.test_progress import on_terminal
from tidelog import localcluster
from tidelog.cli.common import CONTROLLER_TIMEOUT_ENV, DEFAULT_CONTROLLER_TIMEOUT, controller_timeout
from tidelog.cli.data import poll_size
from tidelog.client import Client
from tidelog.commitlog.record import MAX_PROPERTIES_BYTES
from tidelog.errors import ConfigError, MessageTooLargeError, TidelogError, UnavailableError
from tidelog.localcluster.cluster import start_failure
from tidelog.wire import bind_problem


def test_a_config_error_at_start_up_stays_one_with_its_hint_once() -> None:
    line = "error: CONFIG_INVALID: b.yaml: flush must be one of sync, async (fix the configuration and start again)"
    err = start_failure("broker-a-0", line, "broker-a-0.log")
    assert isinstance(err, ConfigError)
    text = str(err)
    assert text.count("fix the configuration") == 1 and "retry later" not in text
    assert "broker-a-0 exited during start-up: b.yaml: flush must be one of sync, async" in text
    other = start_failure("broker-a-0", "Killed", "broker-a-0.log")
    assert isinstance(other, UnavailableError) and "see broker-a-0.log" in str(other)


def test_the_size_hint_names_both_limits() -> None:
    hint = MessageTooLargeError.hint
    assert "max_message_bytes" in hint and "32 KiB" in hint and "raise max_message_bytes" not in hint
    assert MAX_PROPERTIES_BYTES == 32 * 1024, "the hint names this limit"


def test_a_port_in_use_is_found_before_grpc_binds() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        assert bind_problem(address) == "Address already in use"
    assert bind_problem(address) is None, "free again once closed"
    assert bind_problem("127.0.0.1:notaport") is not None


def test_consume_without_a_limit_keeps_polling_full_batches() -> None:
    # it asked for 500 - (what it had read): after 500 messages, one message a poll, and half a
    # second of long poll on every empty queue in turn
    assert [poll_size(None, got) for got in (0, 499, 500, 3400)] == [500] * 4
    assert [poll_size(123, got) for got in (0, 100, 122)] == [123, 23, 1]
    assert poll_size(2000, 600) == 500


def test_the_controller_retry_budget_is_an_environment_knob() -> None:
    assert controller_timeout({}) == DEFAULT_CONTROLLER_TIMEOUT == 15.0
    assert controller_timeout({CONTROLLER_TIMEOUT_ENV: " 2.5 "}) == 2.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=CONTROLLER_TIMEOUT_ENV):
            controller_timeout({CONTROLLER_TIMEOUT_ENV: bad})


#: A short retry budget ($TIDE_CONTROLLER_TIMEOUT): what is told, and when, is the same as with 15 s.
SHORT_BUDGET = {CONTROLLER_TIMEOUT_ENV: "2"}


@pytest.mark.slow
def test_an_unreachable_controller_is_named_while_it_is_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    # the terminal and the pipe each wait out the retry budget: side by side, not one after the other
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        on_tty = pool.submit(
            on_terminal, "topic", "list", "--controllers", address, timeout=60, env=SHORT_BUDGET
        )
        piped = pool.submit(
            tide, "topic", "list", "--controllers", address, timeout=60, env=SHORT_BUDGET
        ).result()
        _, shown, code = on_tty.result()
    assert code == 1
    waiting, _, rest = shown.partition("\n")
    assert waiting.startswith("waiting: no controller answered yet") and address in waiting, shown
    budget = re.search(r"for up to (\d+) s", waiting)
    assert budget and int(budget.group(1)) <= 2, f"the budget of the environment is used: {waiting}"
    # nothing answers there: no controller quorum, a retryable wait
    assert rest.strip().startswith("error: CONTROLLER_UNAVAILABLE")
    assert piped.stderr.startswith("error: CONTROLLER_UNAVAILABLE"), "a pipe gets the one-line error only"


@pytest.mark.slow
def test_piped_tables_restart_and_a_quiet_sigterm(cluster_factory: Callable[..., LocalCluster]) -> None:
    c = cluster_factory(name="papercuts")
    # a piped table keeps its full width (an empty $COLUMNS: tide_env sets one otherwise)
    deadline = time.monotonic() + 30  # the slave joins the SyncStateSet once it has caught up
    while True:
        wide = tide("broker", "list", "--controllers", c.controllers, env={"COLUMNS": ""})
        assert wide.returncode == 0
        rows = [line for line in wide.stdout.splitlines() if "broker-a" in line]
        if all("slave (in sync)" in r or "master" in r for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(rows) == 2 and all("slave (in sync)" in r or "master" in r for r in rows), wide.stdout
    assert all(r.count("127.0.0.1:") == 1 for r in rows), "no address folded over two lines"

    with Client(c.controllers) as client:
        client.admin().create_topic("quiet", queues=2)
        master = next(
            r
            for r in json.loads(tide("broker", "list", "--controllers", c.controllers, "--json").stdout)
            if r["role"] == "master"
        )
        name = next(p["name"] for p in c.state()["processes"] if p.get("address") == master["address"])
        stop = threading.Event()

        def produce() -> None:
            p = client.producer()
            while not stop.is_set():
                with contextlib.suppress(TidelogError):
                    p.send("quiet", b"x" * 100)

        writer = threading.Thread(target=produce, daemon=True)
        writer.start()
        time.sleep(2)
        localcluster.kill(c.data_dir, name, signal.SIGTERM)
        time.sleep(3)
        stop.set()
        writer.join(timeout=60)
    log = Path(c.data_dir / f"{name}.log").read_text()
    assert "stopping" in log and "Traceback" not in log and "CancelledError" not in log, log[-3000:]

    restarted = json.loads(tide("cluster", "restart", name, "--data-dir", str(c.data_dir), "--json").stdout)
    assert restarted["name"] == name and not restarted["was_running"]
    assert c.pids()[name] == restarted["pid"] and localcluster.running(restarted["pid"])
    again = json.loads(tide("cluster", "restart", name, "--data-dir", str(c.data_dir), "--json").stdout)
    assert again["was_running"] and again["pid"] != restarted["pid"]
    unknown = tide("cluster", "restart", "nope", "--data-dir", str(c.data_dir))
    assert unknown.returncode == 1 and "no process named 'nope'" in unknown.stderr and name in unknown.stderr
