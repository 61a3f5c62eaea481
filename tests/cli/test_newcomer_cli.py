"""A newcomer's first hour (issue 40), row by row: each command run as a user runs it (a subprocess
of the installed `tide`), and the exact answer they see. One local cluster for the module."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from typing import Any

import pytest

from tests.client.conftest import REPO, TIDE, LocalCluster, tide, tide_env
from tests.procs import wait_until
from tidelog.cli.common import cell, iso_ms
from tidelog.client import Client, OutMessage
from tidelog.commitlog.batch import cut_batch, encode_batch
from tidelog.errors import MessageTooLargeError, TidelogError

#: a retry budget far beyond a test's own timeout: only an answer given at once returns in time
NO_GIVING_UP = {"TIDE_CONTROLLER_TIMEOUT": "3600"}
SIZE_HINT = (
    "(send smaller messages: a record is limited by the broker's max_message_bytes, and its key, "
    "tags and properties together by a fixed 32 KiB)"
)


def on(cluster: LocalCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return tide(*args, env={"TIDE_CONTROLLERS": cluster.controllers, **kw.pop("env", {})}, **kw)


def ok(cluster: LocalCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    out = on(cluster, *args, **kw)
    assert out.returncode == 0, f"tide {' '.join(args)} exited {out.returncode}:\n{out.stderr}"
    return out


def ok_json(cluster: LocalCluster, *args: str, **kw: Any) -> Any:
    return json.loads(ok(cluster, *args, "--json", **kw).stdout)


@pytest.fixture(scope="module")
def orders(cluster: LocalCluster) -> str:
    ok(cluster, "topic", "create", "orders", "--queues", "4")
    return "orders"


# --- row 1: a body no request could carry is refused before it is built ---------------------


def test_row1_an_oversize_body_is_refused_at_once_naming_the_limit() -> None:
    # nothing listens on port 1, and the command would try it for an hour: it must not ask
    out = tide(
        "produce",
        "orders",
        "--count",
        "1",
        "--size",
        "10000000000",
        env={"TIDE_CONTROLLERS": "127.0.0.1:1", **NO_GIVING_UP},
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stderr == (
        "error: MESSAGE_ILLEGAL: a message of 10000000000 bytes is over max_message_bytes (never more "
        f"than 67107770: what one request carries) {SIZE_HINT}\n"
    )


# --- row 8: one limit, named the same way ----------------------------------------------------


@pytest.mark.slow
def test_row8_both_size_refusals_name_max_message_bytes(cluster: LocalCluster, orders: str) -> None:
    five_mb = on(cluster, "produce", orders, "--count", "1", "--size", "5000000")
    assert five_mb.returncode == 1
    assert five_mb.stderr == (
        "error: MESSAGE_ILLEGAL: record 0 of the batch is 5000070 bytes, over "
        f"max_message_bytes=4194304 {SIZE_HINT}\n"
    )
    hundred_mb = on(cluster, "produce", orders, "--count", "1", "--size", "100000000")
    assert hundred_mb.returncode == 1
    assert "a message of 100000000 bytes is over max_message_bytes" in hundred_mb.stderr


def test_row8_the_client_cut_names_max_message_bytes_too() -> None:
    records = encode_batch(b"orders", 0, [OutMessage(b"x" * 2000)], 0)
    with pytest.raises(MessageTooLargeError) as err:
        cut_batch(records, 1, 1000, 10)
    assert err.value.message == (
        "record 0 of the batch is 2070 bytes, over max_message_bytes (never more than 1000: what one "
        "request carries)"
    )


# --- row 4: malformed addresses refused at once; a broker's port named as one ---------------


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1", "has no port"),
        ("notahost", "has no port"),
        ("127.0.0.1:abc", "has no valid port ('abc' is not a number from 1 to 65535)"),
        ("127.0.0.1:0", "has no valid port ('0' is not a number from 1 to 65535)"),
        (":9701", "has no host"),
    ],
)
def test_row4_a_malformed_controller_address_is_refused_at_once(address: str, problem: str) -> None:
    out = tide("topic", "list", "--controllers", address, env=NO_GIVING_UP, timeout=120)
    assert out.returncode == 1
    assert out.stderr == (
        f"error: INVALID_ARGUMENT: controller address {address!r} {problem} (write each as host:port, "
        "such as 127.0.0.1:9701, in --controllers or $TIDE_CONTROLLERS)\n"
    )


def test_row4_a_host_dns_does_not_know_is_refused_at_once() -> None:
    host = "notahost.invalid"  # RFC 6761: never a real name
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        if exc.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            pytest.skip(f"this machine's resolver does not answer for {host} ({exc}); nothing to refuse on")
    out = tide("topic", "list", "--controllers", f"{host}:9701", env=NO_GIVING_UP, timeout=120)
    assert (out.returncode, out.stderr) == (
        1,
        f"error: INVALID_ARGUMENT: no controller host resolves: DNS does not know {host} (check the names "
        "in --controllers or $TIDE_CONTROLLERS (`tide cluster up` prints them))\n",
    )


@pytest.mark.slow
def test_row4_a_brokers_port_answers_as_the_controllers_do(cluster: LocalCluster, orders: str) -> None:
    # brokers take the controllers' calls (they forward them): a broker's address works
    broker = next(p["address"] for p in cluster.up_doc["processes"] if p["kind"] == "broker")
    via_broker = tide("topic", "list", "--controllers", broker)
    assert via_broker.returncode == 0, via_broker.stderr
    assert via_broker.stdout == ok(cluster, "topic", "list").stdout


@pytest.mark.slow
def test_row4_a_port_that_is_no_controller_is_named(cluster: LocalCluster) -> None:
    status = ok_json(cluster, "cluster", "status")
    endpoint = next(
        m["rocketmq_endpoint"]
        for s in status["broker_sets"]
        for m in s["members"]
        if m.get("rocketmq_endpoint")
    )
    out = tide("topic", "list", "--controllers", endpoint, env=NO_GIVING_UP, timeout=120)
    assert (out.returncode, out.stderr) == (
        1,
        f"error: INVALID_ARGUMENT: {endpoint} is not a controller: it does not serve tidelog's controller "
        "calls (pass a controller's address in --controllers or $TIDE_CONTROLLERS)\n",
    )


# --- row 5: Ctrl-C during produce says how many were acknowledged ----------------------------


@pytest.mark.slow
def test_row5_ctrl_c_during_produce_counts_what_was_acknowledged(cluster: LocalCluster) -> None:
    ok(cluster, "topic", "create", "interrupted", "--queues", "1")
    proc = subprocess.Popen(
        [*TIDE, "produce", "interrupted", "--count", "5000000", "--batch", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env=tide_env({"TIDE_CONTROLLERS": cluster.controllers}),
    )
    try:
        # until some are stored: then Ctrl-C has something to count. Asked in this process: a
        # `tide topic describe` a poll cost a second of CPU each, taken from the producer measured.
        with Client(cluster.controllers) as client:

            def stored() -> int:
                try:
                    return int(client.admin().describe_topic("interrupted")[0]["max"])
                except TidelogError:  # the brokers learn a new topic at their next heartbeat
                    return 0

            wait_until(lambda: stored() >= 100, 60, what="100 messages stored")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    match = re.fullmatch(r"interrupted: (\d+) acknowledged\n", err)
    assert match, f"not one line of count: {err!r}"
    acknowledged = int(match.group(1))
    assert acknowledged >= 100
    assert acknowledged <= ok_json(cluster, "topic", "describe", "interrupted")[0]["max"]
    assert f"│ sent       │ {acknowledged}" in out


# --- row 6: the ids of what was sent ----------------------------------------------------------


@pytest.mark.slow
def test_row6_produce_names_first_and_last_id_per_queue_and_prints_every_id(cluster: LocalCluster) -> None:
    ok(cluster, "topic", "create", "ids", "--queues", "2")
    doc = ok_json(cluster, "produce", "ids", "--count", "6", "--batch", "2")
    assert doc["sent"] == 6 and doc["interrupted"] is False
    queues = doc["queues"]
    assert sum(q["messages"] for q in queues) == 6
    ids = ok(cluster, "produce", "ids", "--count", "3", "--ids").stdout.split()
    assert len(ids) == 3 and all(re.fullmatch(r"broker-a:[0-9a-f]+", i) for i in ids)
    # Each id reads back the message stored where the produce said. Looked up in this process (a
    # `tide` process each cost a second of CPU): `tide message get --id` has its own tests (row 9
    # here, tests/client/test_lookups_cluster.py).
    with Client(cluster.controllers) as client:
        for q in queues:
            first = client.get_message_by_id(q["first_id"])
            assert (first.queue, first.offset) == (q["queue"], q["first_offset"])
            last = client.get_message_by_id(q["last_id"])
            assert (last.queue, last.offset) == (q["queue"], q["last_offset"])
        bodies = [client.get_message_by_id(i).body.decode() for i in ids]
    assert [b.split()[0] for b in bodies] == ["0", "1", "2"]


# --- row 9: tables show formatted values -----------------------------------------------------


def test_row9_cells_are_formatted_not_python_reprs() -> None:
    assert cell("queues", {"broker-a": 4, "broker-b": 2}) == "broker-a: 4, broker-b: 2"
    assert cell("stopped", ["broker-a-0", "controller-1"]) == "broker-a-0, controller-1"
    assert cell("stopped", []) == "-" and cell("properties", {}) == "-"
    assert cell("alive", True) == "yes" and cell("x", None) == ""
    assert cell("store_ts", 1795850002044) == "2026-11-28T07:13:22.044Z" == iso_ms(1795850002044)


@pytest.mark.slow
def test_row9_tables_show_queues_and_times_formatted(cluster: LocalCluster, orders: str) -> None:
    listed = ok(cluster, "topic", "list").stdout
    assert re.search(r"│ orders +│ broker-a: 4 +│ rw +│ broker +│", listed), listed
    assert "{" not in listed
    (receipt,) = ok_json(cluster, "produce", orders, "--count", "1")["queues"]
    shown = ok(cluster, "message", "get", "--id", receipt["first_id"]).stdout
    stored = ok_json(cluster, "message", "get", "--id", receipt["first_id"])["store_ts"]
    assert re.search(rf"│ store_ts +│ {re.escape(iso_ms(stored))} +│", shown), shown
    assert re.search(r"│ properties +│ - +│", shown), shown


# --- row 10: an unknown group is the same answer everywhere ----------------------------------

UNKNOWN_GROUP = (
    "error: GROUP_NOT_FOUND: no consumer group 'nosuchgroup': no member, no committed offset (check the "
    "group's name; a group exists once one of its members has consumed (`tide consume --group NAME`) "
    "or committed an offset)\n"
)


@pytest.mark.slow
def test_row10_an_unknown_group_is_not_found_by_describe_as_by_delete(
    cluster: LocalCluster, orders: str
) -> None:
    for args in (
        ("group", "describe", "nosuchgroup", "--topic", orders),
        ("group", "describe", "nosuchgroup"),
        ("group", "delete", "nosuchgroup"),
        ("group", "reset-offsets", "nosuchgroup", "--topic", orders, "--to", "earliest"),
    ):
        out = on(cluster, *args)
        assert (out.returncode, out.stderr) == (1, UNKNOWN_GROUP), args


# --- row 11: each ledger entry's own length --------------------------------------------------


@pytest.mark.slow
def test_row11_ledger_read_shows_each_entrys_own_length(cluster: LocalCluster) -> None:
    written = ok_json(cluster, "ledger", "append", "--password", "pw", input="first\nsecond\n")
    table = ok(cluster, "ledger", "read", str(written["ledger_id"]), "--password", "pw").stdout
    assert re.search(r"│ 0 +│ 5 +│ first +│", table), table
    assert re.search(r"│ 1 +│ 6 +│ second +│", table), table
