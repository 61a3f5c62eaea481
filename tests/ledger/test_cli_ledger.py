"""`tide ledger ...` as an operator runs it: real subprocesses against a real cluster
(`tide cluster up`, deploy/local.yaml), `--json` output parsed and compared with what was written."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest

from tests.client.conftest import LocalCluster, tide

PASSWORD = "cli-secret"


def run(
    cluster: LocalCluster,
    *args: str,
    input: str | None = None,
    password: str | None = PASSWORD,
    ok: bool = True,
) -> subprocess.CompletedProcess[str]:
    env = {"TIDE_CONTROLLERS": cluster.controllers}
    if password is not None:
        env["TIDE_LEDGER_PASSWORD"] = password
    out = tide("ledger", *args, input=input, env=env, timeout=90)
    if ok:
        assert out.returncode == 0, f"tide ledger {' '.join(args)} exited {out.returncode}: {out.stderr}"
    return out


def doc(cluster: LocalCluster, *args: str, **kw) -> dict:
    return json.loads(run(cluster, *args, "--json", **kw).stdout)


@pytest.mark.slow
def test_create_append_read_info_list_recover_delete(cluster):
    lines = ["first entry", "zweite Zeile ✓", "", "x" * 3000]
    # append: a new ledger, entries from stdin, closed at the end
    written = doc(cluster, "append", "--meta", "app=cli-test", input="\n".join(lines) + "\n")
    lid = written["ledger_id"]
    assert written["entry_ids"] == [0, 1, 2, 3] and written["state"] == "CLOSED"
    assert written["last_add_confirmed"] == 3
    assert written["length"] == sum(len(s.encode()) for s in lines)
    # read: every entry byte for byte, with its own length and the ledger's cumulative one
    got = doc(cluster, "read", str(lid))
    assert got["last_add_confirmed"] == 3
    assert [base64.b64decode(e["data_base64"]).decode() for e in got["entries"]] == lines
    assert [e["entry_id"] for e in got["entries"]] == [0, 1, 2, 3]
    assert got["entries"][-1]["ledger_length"] == written["length"]
    assert [e["length"] for e in got["entries"]] == [len(s.encode()) for s in lines]
    part = doc(cluster, "read", str(lid), "--from", "1", "--to", "2")
    assert [e["data"] for e in part["entries"]] == lines[1:3]
    # info: the metadata as stored
    info = doc(cluster, "info", str(lid))
    assert (info["state"], info["last_entry_id"], info["length"]) == ("CLOSED", 3, written["length"])
    assert info["custom_metadata"] == {"app": "cli-test"}
    assert info["ensemble_size"] == info["write_quorum"] == 2 and info["ack_quorum"] == 2
    assert info["digest_type"] == "CRC32C"
    # a ledger left OPEN, as by a dead writer; recover seals it at its last acknowledged entry
    open_one = doc(
        cluster, "append", "--keep-open", "--data", "a", "--data", "b", "--digest", "mac", "--ack-quorum", "1"
    )
    oid = open_one["ledger_id"]
    assert doc(cluster, "info", str(oid))["state"] == "OPEN"
    recovered = doc(cluster, "recover", str(oid))
    assert (recovered["state"], recovered["last_entry_id"], recovered["length"]) == ("CLOSED", 1, 2)
    assert doc(cluster, "recover", str(oid))["last_entry_id"] == 1  # recovering a closed ledger: no change
    assert [e["data"] for e in doc(cluster, "read", str(oid))["entries"]] == ["a", "b"]
    # tail of a closed ledger prints every entry and stops at its end
    tailed = run(cluster, "tail", str(oid), "--json", "--idle-timeout", "10").stdout.splitlines()
    assert [json.loads(t)["data"] for t in tailed] == ["a", "b"]
    # create: an empty ledger, closed at once
    empty = doc(cluster, "create", "--close")
    assert (empty["state"], empty["last_entry_id"], empty["length"]) == ("CLOSED", -1, 0)
    # list shows all three; delete removes one
    listed = {row["ledger_id"]: row for row in doc(cluster, "list", password=None)}
    assert {lid, oid, empty["ledger_id"]} <= set(listed)
    assert listed[oid]["last_entry_id"] == 1
    # delete needs the ledger's password, and refuses a wrong one
    refused = run(cluster, "delete", str(empty["ledger_id"]), password="not-it", ok=False)
    assert refused.returncode == 1 and "LEDGER_UNAUTHORIZED" in refused.stderr
    assert doc(cluster, "delete", str(empty["ledger_id"])) == {
        "ledger_id": empty["ledger_id"],
        "deleted": True,
    }
    assert empty["ledger_id"] not in {row["ledger_id"] for row in doc(cluster, "list", password=None)}
    gone = run(cluster, "info", str(empty["ledger_id"]), ok=False)
    assert gone.returncode == 1 and "LEDGER_NO_SUCH_LEDGER" in gone.stderr


@pytest.mark.slow
def test_bad_input_and_wrong_passwords_are_typed_errors_that_change_nothing(cluster):
    lid = doc(cluster, "append", "--data", "kept")["ledger_id"]
    before = doc(cluster, "info", str(lid))
    listed_before = doc(cluster, "list", password=None)
    cases = [
        (("read", "abc"), "LEDGER_INCORRECT_PARAMETER"),
        (("read", str(lid), "--from", "2", "--to", "1"), "LEDGER_INCORRECT_PARAMETER"),
        (("read", str(lid), "--to", "5"), "LEDGER_READ"),  # beyond the LAC
        (("read", "999999"), "LEDGER_NO_SUCH_LEDGER"),
        (("append", "--data", "x", "--ack-quorum", "3"), "LEDGER_INCORRECT_PARAMETER"),
        (("append", "--data", "x", "--ensemble-size", "3"), "LEDGER_INCORRECT_PARAMETER"),
        (("append", "--data", "x", "--meta", "novalue"), "LEDGER_INCORRECT_PARAMETER"),
        (("read", "--log", "bad name"), "LEDGER_INCORRECT_PARAMETER"),
    ]
    for args, code in cases:
        out = run(cluster, *args, ok=False)
        assert out.returncode == 1 and code in out.stderr, (args, out.returncode, out.stderr)
    wrong = run(cluster, "recover", str(lid), password="not-it", ok=False)
    assert wrong.returncode == 1 and "LEDGER_UNAUTHORIZED" in wrong.stderr
    missing = run(cluster, "read", str(lid), password=None, ok=False)
    assert missing.returncode == 2 and "TIDE_LEDGER_PASSWORD" in missing.stderr
    assert doc(cluster, "info", str(lid)) == before
    assert doc(cluster, "list", password=None) == listed_before  # no ledger was created or changed


@pytest.mark.slow
def test_segmented_log_from_the_command_line(cluster):
    first = doc(cluster, "append", "--log", "cli-wal", "--data", "one", "--data", "two")
    second = doc(cluster, "append", "--log", "cli-wal", "--data", "three")
    assert (first["generation"], second["generation"]) == (1, 2)
    record = doc(cluster, "info", "--log", "cli-wal", password=None)
    assert record["generation"] == 2 and len(record["ledgers"]) == 2
    everything = doc(cluster, "read", "--log", "cli-wal")
    assert [e["data"] for e in everything["entries"]] == ["one", "two", "three"]
    assert [e["position"] for e in everything["entries"]] == first["positions"] + second["positions"]
    rest = doc(cluster, "read", "--log", "cli-wal", "--from-position", first["positions"][1])
    assert [e["data"] for e in rest["entries"]] == ["two", "three"]
    tailed = run(cluster, "tail", "--log", "cli-wal", "--json", "--max-entries", "3").stdout.splitlines()
    assert [json.loads(t)["data"] for t in tailed] == ["one", "two", "three"]
