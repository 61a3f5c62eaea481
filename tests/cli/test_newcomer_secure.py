"""A newcomer on the secure topology (issue 40, rows 2, 3 and 12): the README's "as alice"
example, what a plain-text command is told, and refusals that read as sentences. One cluster of
deploy/secure.yaml for the module, every command a subprocess of the installed `tide`."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.client.conftest import REPO, LocalCluster, start_cluster, stop_cluster, tide

pytestmark = pytest.mark.slow

NO_GIVING_UP = {"TIDE_CONTROLLER_TIMEOUT": "3600"}
DENIED_HINT = "(ask an administrator for the permission the message names (`tide acl grant`))"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = start_cluster(tmp_path_factory.mktemp("secure"), REPO / "deploy" / "secure.yaml")
    try:
        yield c
    finally:
        stop_cluster(c)


def as_admin(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    creds = c.up_doc["credentials"]
    env = {
        "TIDE_CONTROLLERS": c.controllers,
        "TIDE_CA_FILE": c.up_doc["ca_file"],
        "TIDE_ACCESS_KEY": creds["access_key"],
        "TIDE_SECRET_KEY": creds["secret_key"],
    }
    out = tide(*args, env=env)
    assert out.returncode == 0, out.stderr
    return out


def as_user(c: LocalCluster, user: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {"TIDE_CONTROLLERS": c.controllers, "TIDE_CA_FILE": c.up_doc["ca_file"]}
    return tide("--access-key", user["access_key"], "--secret-key", user["secret_key"], *args, env=env)


def new_user(c: LocalCluster, name: str) -> Any:
    return json.loads(as_admin(c, "user", "create", name, "--json").stdout)


def test_row2_a_produce_refused_names_produce_alone(secured: LocalCluster) -> None:
    as_admin(secured, "topic", "create", "payments")
    carol = new_user(secured, "carol")
    as_admin(secured, "acl", "grant", "carol", "topic", "payments", "consume")
    out = as_user(secured, carol, "produce", "payments", "--count", "1")
    assert (out.returncode, out.stderr) == (
        1,
        f"error: PERMISSION_DENIED: user carol lacks produce on topic payments {DENIED_HINT}\n",
    )
    as_admin(secured, "acl", "grant", "carol", "topic", "payments", "produce")
    deadline = time.monotonic() + 30  # grants reach the brokers within a heartbeat
    while (out := as_user(secured, carol, "produce", "payments", "--count", "1", "--json")).returncode:
        assert time.monotonic() < deadline, out.stderr
        time.sleep(0.2)
    assert json.loads(out.stdout)["sent"] == 1


def test_row2_a_consume_refused_names_consume_alone(secured: LocalCluster) -> None:
    as_admin(secured, "topic", "create", "refunds")
    dave = new_user(secured, "dave")
    as_admin(secured, "acl", "grant", "dave", "group", "audit", "consume")
    out = as_user(secured, dave, "consume", "refunds", "--group", "audit", "--idle-timeout", "1")
    assert out.returncode == 1
    assert out.stderr == f"error: PERMISSION_DENIED: user dave lacks consume on topic refunds {DENIED_HINT}\n"


def test_row12_lacking_cluster_admin_reads_as_a_sentence(secured: LocalCluster) -> None:
    erin = new_user(secured, "erin")
    out = as_user(secured, erin, "topic", "list")
    assert (out.returncode, out.stderr) == (
        1,
        f"error: PERMISSION_DENIED: user erin lacks admin on the cluster {DENIED_HINT}\n",
    )


def test_row3_a_plain_text_command_is_told_to_pass_the_ca(secured: LocalCluster) -> None:
    # with a retry budget far beyond the call's own timeout, only a refusal at once returns in time
    out = tide("topic", "list", env={"TIDE_CONTROLLERS": secured.controllers, **NO_GIVING_UP}, timeout=120)
    assert (out.returncode, out.stderr) == (
        1,
        f"error: INVALID_ARGUMENT: {secured.controllers} requires TLS: pass --ca-file (or $TIDE_CA_FILE) "
        "(the CA that `tide cluster up` made is <data-dir>/tls/ca.pem)\n",
    )
